"""Fixtures shared by the governor tests (opted into per module)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module")
def one_thread():
    """Tiny kernels: one thread is faster than two on a shared machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """Captured graphs shared by every governor test of the session."""
    path = tmp_path_factory.getbasetemp() / "governor-graphs"
    path.mkdir(exist_ok=True)
    return path
