"""Query features: agreement with the analytic model and the sweep, batching, and the
two ways of computing live-byte curves."""

from __future__ import annotations

import memgnn.predictor.memory.query_features as qf
import numpy as np
import pytest
import torch
from memgnn.predictor.capture.capture import CaptureConfig, capture
from memgnn.predictor.memory.analytic import AnalyticModel, sweep
from memgnn.predictor.memory.base import Query
from memgnn.predictor.memory.query_features import PathContext
from memgnn.predictor.spec.devices import get_profile
from memgnn.predictor.spec.train import TrainSpec


def test_query_features_depend_on_sizes_and_match_the_analytic_model(gpt_graph):
    from memgnn.predictor.spec.devices import get_profile

    ctx = PathContext(gpt_graph)
    for device in ("a100-80gb", "h100-80gb", "cpu"):
        small = ctx.query({"B": 2, "S": 32}, get_profile(device))
        big = ctx.query({"B": 16, "S": 256}, get_profile(device))
        assert np.isfinite(big.features).all()
        assert not np.array_equal(small.features, big.features)
        for m, metric in enumerate(("allocated", "reserved", "device_total")):
            if device == "cpu" and metric != "allocated":
                continue
            q = Query(sizes={"B": 16, "S": 256}, device=device, metric=metric)
            ref = AnalyticModel().predict(gpt_graph, [q])[0].predicted_peak_bytes
            assert big.baseline[m] == ref
            assert big.analytic[m] == ref  # matmuls in forward and backward: 2 workspaces


def test_conv_only_graph_gets_no_cublas_workspace():
    import torch.nn.functional as F
    from memgnn.predictor.spec.bundle import ModelBundle
    from memgnn.predictor.spec.devices import get_profile
    from torch import nn

    bundle = ModelBundle(
        name="conv", family="conv", build=lambda: nn.Conv2d(3, 4, 3),
        make_inputs=lambda s, d, t: {"x": torch.randn(s["B"], 3, 8, 8, device=d, dtype=t)},
        loss=lambda m, i: F.relu(m(i["x"])).mean(), dims={"B": 2},
    )  # fmt: skip
    graph = capture(bundle, TrainSpec.of(optimizer="sgd"), CaptureConfig(target="cuda"))
    ctx = PathContext(graph)
    res = ctx.query({"B": 2}, get_profile("a100-80gb"))
    assert ctx.workspace_handles == 0
    assert res.baseline[0] == res.analytic[0] == res.breakdown["tensor_peak_bytes"]
    (pred,) = AnalyticModel().predict(graph, [Query(sizes={"B": 2}, device="a100-80gb")])
    assert pred.predicted_peak_bytes == res.analytic[1]
    assert pred.breakdown["workspace_and_context_bytes"] == 0


def test_query_many_equals_one_query_at_a_time(gpt_graph):
    from memgnn.predictor.spec.devices import get_profile

    ctx = PathContext(gpt_graph)
    asks = [
        ({"B": 2, "S": 9}, get_profile("a100-80gb"), "worst"),
        ({"B": 7, "S": 130}, get_profile("cpu"), "worst"),
        ({"B": 1, "S": 64}, get_profile("v100-16gb"), "balanced"),
    ]
    together = ctx.query_many(asks)
    for ask, got in zip(asks, together, strict=True):
        alone = PathContext(gpt_graph).query(*ask)
        assert np.array_equal(got.features, alone.features)
        assert np.array_equal(got.analytic, alone.analytic)
        assert got.breakdown == alone.breakdown


def test_peak_node_is_found_among_the_nodes_where_bytes_rise(gpt_graph):
    """The curves are evaluated only where live bytes can rise; the peak, phase and step
    peaks must equal those of the full per-node sweep."""
    from memgnn.predictor.memory.analytic import sweep
    from memgnn.predictor.spec.devices import get_profile

    res = PathContext(gpt_graph).query({"B": 3, "S": 40}, get_profile("cpu"))
    full = sweep(gpt_graph, {"B": 3, "S": 40}, scenario="worst")
    assert res.breakdown["tensor_peak_bytes"] == full.peak_bytes
    assert res.breakdown["phase"] == full.best.peak_phase
    assert res.breakdown["step_peaks"] == full.best.step_peaks


def test_categories_at_the_peak_match_the_sweep(gpt_graph):
    """On a CPU (no rounding) the pair-count breakdown equals the per-storage sweep's."""
    res = PathContext(gpt_graph).query({"B": 5, "S": 48}, get_profile("cpu"))
    full = sweep(gpt_graph, {"B": 5, "S": 48}, scenario="worst")
    assert res.breakdown["categories"] == full.best.breakdown
    assert sum(full.best.breakdown.values()) <= res.breakdown["tensor_peak_bytes"]


@pytest.mark.parametrize("device", ["a100-80gb", "cpu", "v100-16gb"])
def test_count_matrix_and_per_storage_curves_agree(gpt_graph, monkeypatch, device):
    """Graphs too big for the dense (pair x node) count matrix take per-storage cumulative
    sums; both must give the same features to the bit."""
    asks = [({"B": b, "S": s}, get_profile(device), "worst") for b, s in ((1, 8), (6, 200))]
    dense = PathContext(gpt_graph)
    assert dense.pairs.alive_at is not None
    monkeypatch.setattr(qf, "MAX_COUNT_MATRIX", 0)
    sparse = PathContext(gpt_graph)
    assert sparse.pairs.alive_at is None
    for a, b in zip(dense.query_many(asks), sparse.query_many(asks), strict=True):
        assert np.array_equal(a.features, b.features)
        assert np.array_equal(a.analytic, b.analytic) and a.breakdown == b.breakdown


def test_pairs_count_every_storage_once(gpt_graph):
    """Pair counts over the schedule equal the alive storages counted one by one."""
    ctx = PathContext(gpt_graph)
    p = gpt_graph.paths[0]
    alloc, free = p.array("storages", "alloc"), p.array("storages", "free")
    assert ctx.pairs.total.sum() == p.num_storages
    for col in (0, len(ctx.at) // 2, len(ctx.at) - 1):
        node = ctx.at[col]
        alive = (alloc <= node) & ((free < 0) | (free >= node))
        want = np.bincount(ctx.pairs.of_storage[alive], minlength=len(ctx.pairs.expr))
        assert np.array_equal(ctx.pairs.alive_at[:, col], want)
        assert np.array_equal(ctx._alive_counts(np.array([node]))[0], want)


@pytest.mark.parametrize("device", ["a100-80gb", "cpu"])
def test_block_bounds_give_the_features_of_every_node(gpt_graph, device):
    """Evaluating only the blocks that can hold a maximum (predictor.memory.curve_bounds) gives
    the features of the full curves to the bit, ties and step peaks included."""
    from memgnn.predictor.memory.curve_bounds import CurveBlocks

    asks = [({"B": b, "S": s}, get_profile(device), "worst") for b, s in ((1, 8), (6, 200))]
    full = PathContext(gpt_graph)
    full.blocks = None  # every curve node
    pruned = PathContext(gpt_graph)
    seen = []
    blocks = CurveBlocks(pruned.blocks.counts, pruned.blocks.groups, block=2)
    candidates = blocks.candidates
    blocks.candidates = lambda v, c: seen.append(candidates(v, c)[0]) or candidates(v, c)
    pruned.blocks = blocks
    for a, b in zip(full.query_many(asks), pruned.query_many(asks), strict=True):
        assert np.array_equal(a.features, b.features)
        assert np.array_equal(a.analytic, b.analytic) and a.breakdown == b.breakdown
    assert 0 < len(seen[0]) <= len(pruned.at)
    if device != "cpu":  # on the CPU the 20 MiB-rounded segment estimate ties everywhere
        assert len(seen[0]) < len(pruned.at)  # some nodes were left out
