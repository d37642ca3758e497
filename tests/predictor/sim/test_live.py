"""The moment of the simulated peak and what is live then (`predictor.sim.live`)."""

from __future__ import annotations

import pytest
from memgnn.predictor.memory.analytic import sweep
from memgnn.predictor.sim.live import peak_moment, sample_points, step_timeline
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


@pytest.mark.parametrize("metric", ["reserved", "allocated"])
def test_the_timeline_reaches_the_peak_at_its_event(gpt_graph, metric):
    dev = get_profile("h100-80gb")
    m = peak_moment(gpt_graph, SIZES, dev, metric=metric)
    tl = step_timeline(gpt_graph, m, dev, most=200)
    assert tl is not None and len(tl["event"]) <= 200 < tl["events"]
    assert max(tl["reserved"]) == m.peak_reserved_bytes
    assert max(tl["allocated"]) == m.peak_allocated_bytes
    assert tl["peak_event"] in tl["event"]  # sampling keeps the peaks
    at = tl["event"].index(tl["peak_event"])
    assert tl["reserved"][at] == m.reserved_bytes and tl["allocated"][at] == m.allocated_bytes
    # the spans tile the events in order; the peak lies in a span of its phase
    spans = tl["phases"]
    assert spans[0]["start"] == 0 and spans[-1]["end"] == tl["events"]
    assert all(a["end"] == b["start"] for a, b in zip(spans, spans[1:]))
    assert {s["phase"] for s in spans} >= {"forward", "backward", "optimizer"}
    (span,) = [s for s in spans if s["start"] <= tl["peak_event"] < s["end"]]
    assert (span["phase"], span["step"]) == (m.phase, m.step)


def test_the_cpu_has_no_timeline_and_sampling_keeps_everything_short(gpt_graph):
    cpu = get_profile("cpu")
    assert step_timeline(gpt_graph, peak_moment(gpt_graph, SIZES, cpu), cpu) is None
    assert sample_points([1, 5, 2], [1, 5, 2], most=10) == [0, 1, 2]
    pts = sample_points(list(range(100)) + [0], [0] * 101, most=10)
    assert 99 in pts and len(pts) <= 12
