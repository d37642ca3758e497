"""Host and unified-memory figures of a step (`predictor.memory.places`), next to the device
peak: by hand on a built schedule, and through the analytic models and the simulator."""

from __future__ import annotations

from memgnn.predictor.ir.graph import PathGraph, StepGraph
from memgnn.predictor.ir.vocab import CATEGORIES, PHASES, PLACES
from memgnn.predictor.memory.analytic import AnalyticModel, sweep
from memgnn.predictor.memory.base import Query
from memgnn.predictor.memory.encoded_analytic import EncodedAnalytic
from memgnn.predictor.memory.places import CPU_NOTE, place_breakdown, place_peaks
from memgnn.predictor.sim.simulate import simulate
from memgnn.predictor.spec.devices import get_profile


def _graph() -> StepGraph:
    """param (100 B, device) alive; n0 makes act (8*B on device) and its pinned copy
    (8*B); n1 frees act, makes a pageable state (40); n2 frees the copy, makes a managed
    state (1000) and a device temporary (2)."""
    cat, place = CATEGORIES.index, PLACES.index
    path = PathGraph(
        conditions=[],
        nodes={
            "op": ["relu.default", "copy_.default", "add.default"],
            "phase": [PHASES.index("forward"), PHASES.index("backward"), PHASES.index("optimizer")],
            "step": [0, 0, 0],
            "micro": [0, 0, 0],
            "module": ["", "", ""],
            "inputs": [[0], [1], [2]],
            "outputs": [[1, 2], [3], [4, 5]],
            "scratch": [0, 0, 0],
        },
        storages={
            # device bytes: 0 for the storages that live elsewhere
            "nbytes": [1, 2, 0, 0, 0, 3],
            "dtype": ["float32"] * 6,
            "category": [
                cat("parameter"),
                cat("activation"),
                cat("activation"),
                cat("optimizer_state"),
                cat("optimizer_state"),
                cat("temporary"),
            ],  # fmt: skip
            "alloc": [-1, 0, 0, 1, 2, 2],
            "free": [-1, 0, 1, -1, -1, -1],
            "place": [
                place("device"),
                place("device"),
                place("pinned"),
                place("pageable"),
                place("managed"),
                place("device"),
            ],  # fmt: skip
            "place_nbytes": [0, 0, 2, 4, 5, 0],
        },
    )
    return StepGraph(
        model={"name": "hand"},
        train={},
        symbols={"B": 1},
        data_symbols={},
        guards=[],
        exprs=["0", "100", "8*B", "2", "40", "1000"],
        paths=[path],
    )


def test_each_place_has_its_own_peak():
    g = _graph()
    g.validate()
    out = place_peaks(g, 0, {"B": 10})
    assert out["host_pinned_peak_bytes"] == 80  # the copy, nodes 0-1
    assert out["host_pageable_peak_bytes"] == 40
    assert out["managed_peak_bytes"] == 1000
    # pinned and pageable together: 80 + 40 at node 1 (the copy is freed after node 1)
    assert out["host_peak_bytes"] == 120
    assert out["host_categories"] == {"activation": 80, "optimizer_state": 40}
    # the device sweep does not see them
    assert sweep(g, {"B": 10}).peak_bytes == 100 + 80


def test_a_graph_on_the_device_only_adds_nothing(gpt_graph):
    assert place_breakdown(gpt_graph, 0, {"B": 2, "S": 8}, gpu=True) == {}


def test_answers_carry_the_figures_and_device_total_counts_managed_memory():
    g = _graph()
    gpu = Query(sizes={"B": 10}, device="a100-80gb", metric="device_total")
    cpu = Query(sizes={"B": 10}, device="cpu")
    analytic = AnalyticModel().predict(g, [gpu, cpu])
    encoded = EncodedAnalytic().predict(g, [gpu, cpu])
    for a, e in zip(analytic, encoded, strict=True):
        assert a.predicted_peak_bytes == e.predicted_peak_bytes and a.breakdown == e.breakdown
    assert analytic[0].breakdown["managed_peak_bytes"] == 1000
    plain = AnalyticModel().predict(g, [Query(sizes={"B": 10}, device="a100-80gb")])[0]
    # unified memory is in the device total, not in the allocator's bytes
    assert analytic[0].predicted_peak_bytes - plain.predicted_peak_bytes == (
        get_profile("a100-80gb").context_bytes + 1000
    )
    assert analytic[1].breakdown["host_note"] == CPU_NOTE
    sim = simulate(g, {"B": 10}, get_profile("a100-80gb"))
    assert sim.breakdown["host_pinned_peak_bytes"] == 80
    assert sim.device_total_bytes == (
        sim.peak_reserved_bytes + get_profile("a100-80gb").context_bytes + 1000
    )
