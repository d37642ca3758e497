"""Fixtures shared by the CLI tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """A captured-graph cache of the test's own, for tests that count the graphs captured."""
    monkeypatch.setenv("MEMGNN_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"
