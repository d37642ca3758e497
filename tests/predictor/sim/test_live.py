"""The moment of the simulated peak and what is live then (`predictor.sim.live`)."""

from __future__ import annotations

import pytest
from memgnn.predictor.memory.analytic import sweep
from memgnn.predictor.sim.live import peak_moment
from memgnn.predictor.sim.simulate import simulate
from memgnn.predictor.spec.devices import get_profile

SIZES = {"B": 16, "S": 256}


@pytest.mark.parametrize("metric", ["reserved", "allocated"])
def test_the_moment_is_the_simulated_peak(gpt_graph, metric):
    dev = get_profile("h100-80gb")
    m = peak_moment(gpt_graph, SIZES, dev, metric=metric)
    sim = simulate(gpt_graph, SIZES, dev, scenario="worst")
    assert m.peak_allocated_bytes == sim.peak_allocated_bytes
    assert m.peak_reserved_bytes == sim.peak_reserved_bytes
    if metric == "allocated":
        assert m.allocated_bytes == sim.peak_allocated_bytes
    else:
        assert m.reserved_bytes == sim.peak_reserved_bytes
    # the live tensors are what the allocator holds, each rounded up to 512 B blocks
    assert 0 <= m.allocated_bytes - m.requested_bytes < 512 * (len(m.storages) + len(m.extra))
    assert m.node >= 0 and m.phase in ("forward", "backward", "optimizer")


def test_the_live_set_follows_allocs_and_frees(gpt_graph):
    dev = get_profile("h100-80gb")
    m = peak_moment(gpt_graph, SIZES, dev, metric="allocated")
    p = gpt_graph.paths[m.path]
    alloc, free = p.storages["alloc"], p.storages["free"]
    nbytes = gpt_graph.storage_bytes(m.path, m.resolved)
    for u, b in m.storages.items():
        assert b == nbytes[u] > 0
        assert alloc[u] <= m.node and (free[u] < 0 or free[u] >= m.node)
    # every parameter is live (alive for the whole step)
    params = [u for u in range(p.num_storages) if p.storages["category"][u] == 0 and nbytes[u]]
    assert set(params) <= set(m.storages)
    assert set(m.extra) & {"cublas-main", "cublas-backward"}


def test_a_device_too_small_is_explained_without_its_limit(gpt_graph):
    dev = get_profile("h100-80gb")
    big = {"B": 32768, "S": 2048}
    m = peak_moment(gpt_graph, big, dev, metric="reserved")
    assert m.capacity_bytes is None  # the step needs more than the card: unlimited replay
    assert m.reserved_bytes > dev.total_bytes


def test_on_the_cpu_the_moment_is_the_sweep_peak(gpt_graph):
    m = peak_moment(gpt_graph, SIZES, get_profile("cpu"), metric="allocated")
    s = sweep(gpt_graph, SIZES, scenario="worst")
    assert m.allocated_bytes == m.requested_bytes == s.peak_bytes
    assert m.node == s.best.peak_node and m.reserved_bytes is None
