"""Answers memgnn can vouch for: never below the bytes it computes exactly, monotone in
B far outside the training range, extrapolation said out loud, guards honoured."""

from __future__ import annotations

import pytest
from memgnn.predictor.capture.capture import CaptureConfig, capture
from memgnn.predictor.memory.base import Query
from memgnn.predictor.memory.onnx_model import load_default_model
from memgnn.predictor.spec.train import TrainSpec

from tests.tiny_models import tiny_mlp_bundle

BATCHES = [2**k for k in range(0, 25, 2)]  # 1 .. 16M, far past the corpus's B <= 256
EDGE = 256  # the shipped card's training_range: B <= 256


@pytest.fixture(scope="module")
def mlp_graph():
    return capture(tiny_mlp_bundle(), TrainSpec(), CaptureConfig(target="cuda"))


@pytest.fixture(scope="module")
def shipped():
    model = load_default_model()
    if not hasattr(model, "card"):
        pytest.skip("no learned model shipped")
    return model


@pytest.mark.parametrize("metric", ["allocated", "reserved", "device_total"])
def test_learned_answer_never_below_exact_bytes_and_monotone_in_batch(shipped, mlp_graph, metric):
    queries = [Query(sizes={"B": b}, device="h100-80gb", metric=metric) for b in BATCHES]
    preds = shipped.predict(mlp_graph, queries)
    values = [p.predicted_peak_bytes for p in preds]
    for b, p in zip(BATCHES, preds):
        exact = p.breakdown["tensor_peak_bytes"]
        assert p.predicted_peak_bytes >= exact, (b, p.predicted_peak_bytes, exact)
        assert p.upper_bound_bytes >= p.predicted_peak_bytes
        if metric != "allocated":  # reserved holds whole 2 MiB segments
            assert p.predicted_peak_bytes >= -(-exact // (2 << 20)) * (2 << 20)
    beyond = [v for b, v in zip(BATCHES, values) if b >= EDGE]
    assert len(beyond) > 5 and beyond == sorted(beyond), values


def test_extrapolation_is_reported(shipped, mlp_graph):
    inside, outside = shipped.predict(
        mlp_graph,
        [
            Query(sizes={"B": 8}, device="h100-80gb"),
            Query(sizes={"B": 1 << 22}, device="h100-80gb"),
        ],
    )
    assert not any("B=" in why for why in inside.breakdown["extrapolated"])
    assert any("B=4194304" in why for why in outside.breakdown["extrapolated"])


@pytest.mark.parametrize("raw", [None, 175.0, -175.0])  # None: what the network says
def test_corrections_far_outside_the_corpus_are_clipped_and_said(shipped, mlp_graph, raw,
                                                                 monkeypatch):  # fmt: skip
    # this 24-64-5 MLP is far smaller than any corpus step: gnn-8f4b4b5c0cc7's raw output
    # was absurd here (x1e76 on reserved before the clip); a head that says x e^+-175
    # (forced below) must be clipped and said whatever the shipped weights are
    import numpy as np

    if raw is not None:
        monkeypatch.setattr(shipped, "head", lambda emb, q: np.full((len(q), 6), raw, np.float32))
        monkeypatch.setattr(shipped, "_answers", type(shipped._answers)())  # none remembered
    p = shipped.predict(mlp_graph, [Query(sizes={"B": 8}, device="h100-80gb")])[0]
    assert 1 / 16 <= p.breakdown["correction"] <= 16
    assert p.upper_bound_bytes <= 16 * p.breakdown["analytic_bytes"] + p.breakdown["floor_bytes"]
    clipped = any("clipped" in why for why in p.breakdown["extrapolated"])
    assert clipped == (raw is not None or not 1 / 16 < p.breakdown["correction"] < 16)


@pytest.fixture(scope="module")
def cpu_mlp():
    """The tiny MLP captured for a CPU target, and its real CPU step's tensor peak."""
    from memgnn.dataset.cpu_backend import profile_cpu

    bundle = tiny_mlp_bundle()
    graph = capture(bundle, TrainSpec(), CaptureConfig(target="cpu"))
    real = profile_cpu(bundle, TrainSpec(), {"B": 64})["peak_allocated_bytes"]
    return graph, real


def test_learned_answer_equals_the_exact_sweep_on_cpu_allocated(shipped, cpu_mlp):
    # the sweep is this step's real CPU tensor peak to the byte; the shipped model's
    # correction (x1.43 here) used to move the answer off it
    from memgnn.predictor.memory.analytic import AnalyticModel

    graph, real = cpu_mlp
    q = Query(sizes={"B": 64}, device="cpu")
    assert AnalyticModel().predict(graph, [q])[0].predicted_peak_bytes == real
    p = shipped.predict(graph, [q])[0]
    assert p.method == "gnn" and p.metric == "allocated"
    assert p.predicted_peak_bytes == real and p.upper_bound_bytes == real
    assert p.breakdown["exact"] and p.breakdown["correction"] == 1.0
    assert all(path["predicted_peak_bytes"] == real for path in p.paths)


def test_exact_only_where_the_sweep_is_the_label(cpu_mlp, mlp_graph):
    from dataclasses import replace

    from memgnn.predictor.memory.trust import exact_reason

    graph, _ = cpu_mlp
    assert exact_reason(graph, False, "allocated")
    assert exact_reason(mlp_graph, True, "allocated") is None  # GPU: kernel scratch, replay
    assert exact_reason(mlp_graph, True, "reserved") is None
    amp = replace(graph, train={**graph.train, "precision": "amp-bf16"})
    assert exact_reason(amp, False, "allocated") is None
    branchy = replace(graph, paths=[*graph.paths, *graph.paths])
    assert exact_reason(branchy, False, "allocated") is None
    data_dep = replace(graph, data_symbols={"u0": {"lo": "0", "balanced": "1", "hi": "2"}})
    assert exact_reason(data_dep, False, "allocated") is None


def test_trust_fields_say_why_and_which_bound():
    from memgnn.predictor.memory.trust import trust_fields

    cal = {"form": "plain", "q": 0.1, "target_miss": 0.02, "correction_range": [0.0, 0.4],
           "fallback": {"form": "analytic", "q": 0.3}}  # fmt: skip
    inside = trust_fields(exact=None, notes=[], unknown_ops=[], cal=cal, fell_back=False,
                          correction_outside=False)  # fmt: skip
    assert inside == {"in_distribution": True, "reasons": [],
                      "bound": "calibrated (plain) at 2% miss on unseen families"}  # fmt: skip
    out = trust_fields(exact=None, notes=["B=9 is beyond"], unknown_ops=["aten.foo"], cal=cal,
                       fell_back=True, correction_outside=True)  # fmt: skip
    assert out["in_distribution"] is False
    assert out["reasons"][0] == "B=9 is beyond" and "aten.foo" in out["reasons"][1]
    assert "x1..x1.49" in out["reasons"][2]
    assert out["bound"].startswith("network-free fallback: analytic x 1.35")
    exact = trust_fields(exact="cpu allocated", notes=["x"], unknown_ops=[], cal=None,
                         fell_back=False, correction_outside=False)  # fmt: skip
    assert exact["in_distribution"] and exact["bound"] == "exact (the sweep)"
