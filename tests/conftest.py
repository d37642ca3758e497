"""Fixtures shared by the tests; the tiny models live in tests/tiny_models.py."""

from __future__ import annotations

import pytest
from tiny_models import (
    CondModel,
    EarlyExit,
    TopKMoE,
    _seq_bundle,
    tiny_gpt_bundle,
    tiny_mlp_bundle,
)

from predictor.spec import ModelBundle


@pytest.fixture
def tiny_gpt() -> ModelBundle:
    return tiny_gpt_bundle()


@pytest.fixture
def tiny_mlp() -> ModelBundle:
    return tiny_mlp_bundle()


@pytest.fixture
def early_exit() -> ModelBundle:
    return _seq_bundle("early-exit", EarlyExit)


@pytest.fixture
def cond_model() -> ModelBundle:
    return _seq_bundle("cond", CondModel)


@pytest.fixture
def tiny_moe() -> ModelBundle:
    return _seq_bundle("moe", TopKMoE)


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Captured-graph caches and service state go to a per-session temp folder."""
    root = tmp_path_factory.getbasetemp()
    monkeypatch.setenv("MEMGNN_CACHE", str(root / "memgnn-cache"))
    monkeypatch.setenv("MEMGNN_STATE", str(root / "memgnn-state"))
