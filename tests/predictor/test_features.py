"""Node and query features: shapes, determinism, unknown ops, agreement with the sweep."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from predictor.capture import CaptureConfig, capture
from predictor.features import (
    HASH_BUCKETS,
    NUM_NODE_FEATURES,
    NUM_QUERY_FEATURES,
    OP_VOCAB,
    PathContext,
    graph_inputs,
    op_id,
)
from predictor.graph import StepGraph
from predictor.predict import AnalyticModel, Query
from predictor.spec import TrainSpec


@pytest.fixture(scope="module")
def gpt_graph() -> StepGraph:
    from tests.conftest import tiny_gpt_bundle

    return capture(tiny_gpt_bundle(), TrainSpec(), CaptureConfig(target="cuda"))


def test_graph_inputs_shapes_and_edges(gpt_graph):
    full = graph_inputs(gpt_graph, compact=False)
    assert full.x.shape == (gpt_graph.paths[0].num_nodes, NUM_NODE_FEATURES)
    assert np.array_equal(full.edge_index, gpt_graph.paths[0].edges())
    gi = graph_inputs(gpt_graph)  # inert nodes (views, detach, ...) dropped
    n = gi.num_nodes
    assert n < full.num_nodes and gi.x.shape == (n, NUM_NODE_FEATURES)
    assert gi.x.dtype == np.float32 and gi.edge_index.max() < n
    assert np.isfinite(gi.x).all()
    src, dst = gi.edge_index
    assert (np.diff(dst) >= 0).all() and (src < dst).all()
    in_src, in_ptr, out_dst, out_ptr = gi.csr()
    assert in_ptr[-1] == out_ptr[-1] == len(src) and len(in_ptr) == n + 1
    # node i's in-neighbours are the sources of the edges ending at i
    i = int(dst[len(dst) // 2])
    assert sorted(in_src[in_ptr[i] : in_ptr[i + 1]]) == sorted(src[dst == i])
    assert sorted(out_dst[out_ptr[i] : out_ptr[i + 1]]) == sorted(dst[src == i])


def test_features_are_deterministic(gpt_graph, tmp_path):
    a = graph_inputs(gpt_graph)
    gpt_graph.save(tmp_path / "g.json.gz")
    b = graph_inputs(StepGraph.load(tmp_path / "g.json.gz"))
    assert np.array_equal(a.x, b.x) and np.array_equal(a.edge_index, b.edge_index)
    from dataset.devices import get_profile

    q1 = PathContext(gpt_graph).query({"B": 8, "S": 64}, get_profile("a100-80gb"))
    q2 = PathContext(gpt_graph).query({"B": 8, "S": 64}, get_profile("a100-80gb"))
    assert q1.features.shape == (NUM_QUERY_FEATURES,) and np.array_equal(q1.features, q2.features)


def test_query_features_depend_on_sizes_and_match_the_analytic_model(gpt_graph):
    from dataset.devices import get_profile

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
    from torch import nn

    from dataset.devices import get_profile
    from predictor.spec import ModelBundle

    bundle = ModelBundle(
        name="conv", family="conv", build=lambda: nn.Conv2d(3, 4, 3),
        make_inputs=lambda s, d, t: {"x": torch.randn(s["B"], 3, 8, 8, device=d, dtype=t)},
        loss=lambda m, i: F.relu(m(i["x"])).mean(), dims={"B": 2},
    )  # fmt: skip
    graph = capture(bundle, TrainSpec(optimizer="sgd"), CaptureConfig(target="cuda"))
    ctx = PathContext(graph)
    res = ctx.query({"B": 2}, get_profile("a100-80gb"))
    assert ctx.workspace_handles == 0
    assert res.baseline[0] == res.analytic[0] == res.breakdown["tensor_peak_bytes"]
    (pred,) = AnalyticModel().predict(graph, [Query(sizes={"B": 2}, device="a100-80gb")])
    assert pred.predicted_peak_bytes == res.analytic[1]
    assert pred.breakdown["workspace_and_context_bytes"] == 0


def test_unknown_ops_are_hashed_and_flagged(gpt_graph):
    assert op_id("mm.default") == (OP_VOCAB.index("mm"), False)
    assert op_id("_foreach_add_.Scalar") == (OP_VOCAB.index("_foreach_add_"), False)
    k, unknown = op_id("mylib.custom_thing.default")
    assert unknown and len(OP_VOCAB) <= k < len(OP_VOCAB) + HASH_BUCKETS
    assert op_id("mylib.custom_thing.default") == (k, True)  # stable across calls
    data = gpt_graph.content() | {"meta": gpt_graph.meta}
    data["paths"][0]["nodes"]["op"][3] = "mylib.custom_thing.default"
    graph = StepGraph.from_dict(data)
    gi = graph_inputs(graph, compact=False)
    assert gi.unknown_ops == ["mylib.custom_thing.default"]
    assert gi.x[3, 0] == k and gi.x[3, 1] == 1.0 and gi.x[:, 1].sum() == 1.0


def test_query_many_equals_one_query_at_a_time(gpt_graph):
    from dataset.devices import get_profile

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
    from dataset.devices import get_profile
    from predictor.analytic import sweep

    res = PathContext(gpt_graph).query({"B": 3, "S": 40}, get_profile("cpu"))
    full = sweep(gpt_graph, {"B": 3, "S": 40}, scenario="worst")
    assert res.breakdown["tensor_peak_bytes"] == full.peak_bytes
    assert res.breakdown["phase"] == full.best.peak_phase
    assert res.breakdown["step_peaks"] == full.best.step_peaks
