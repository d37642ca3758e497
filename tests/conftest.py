"""Fixtures shared by the tests; the tiny models live in tests/tiny_models.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from memgnn.predictor.spec.bundle import ModelBundle
from tiny_models import (
    CondModel,
    EarlyExit,
    TopKMoE,
    _seq_bundle,
    tiny_gpt_bundle,
    tiny_mlp_bundle,
)


@pytest.fixture(scope="module")
def one_thread():
    """Opted into per module: tiny kernels run faster on one torch thread than on two on a
    small shared machine, and avoid oversubscription."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


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


# The fast tier (`scripts/test.sh --fast`, `-m "not slow"`): besides the tests marked
# `@pytest.mark.slow` by hand, those a measured full run found slow are listed, one node id
# a line, in tests/slow_tests.txt (written by scripts/slow_tests.py from `--durations=0`).
SLOW_LIST = Path(__file__).with_name("slow_tests.txt")


def _measured_slow() -> frozenset[str]:
    if not SLOW_LIST.exists():
        return frozenset()
    lines = (line.split("  #")[0].strip() for line in SLOW_LIST.read_text().splitlines())
    return frozenset(line for line in lines if line and not line.startswith("#"))


def pytest_collection_modifyitems(config, items):
    slow = _measured_slow()
    for item in items:
        if item.nodeid in slow or item.nodeid.split("[")[0] in slow:
            item.add_marker(pytest.mark.slow)
