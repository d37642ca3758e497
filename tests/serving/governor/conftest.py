"""Fixtures shared by the governor tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """Captured graphs shared by every governor test of the session."""
    path = tmp_path_factory.getbasetemp() / "governor-graphs"
    path.mkdir(exist_ok=True)
    return path
