"""Per-(target, metric) conformal bounds: the quantile's rank, the tightest form chosen,
coverage on fresh draws, and the served model applying the card's calibration."""

from __future__ import annotations

import json

import numpy as np
import pytest
from memgnn.predictor.memory.calibration import (
    RANGE_TOLERANCE,
    bound_log,
    conformal_quantile,
    fit_group,
    group_key,
    outside_range,
    served_bound_log,
)


def test_conformal_quantile_rank_and_bad_input():
    scores = np.arange(1.0, 101.0)[::-1]  # 100 scores, unsorted
    assert conformal_quantile(scores, 0.05) == 96.0  # ceil(101 * 0.95) = 96th smallest
    assert conformal_quantile(scores[-10:], 0.01) == 10.0  # too few for the rank: the max
    with pytest.raises(ValueError, match="target_miss"):
        conformal_quantile(scores, 0.7)
    with pytest.raises(ValueError, match="no scores"):
        conformal_quantile(np.array([]), 0.05)


def _draw(rng, n):
    """Residuals whose spread the head knows: half the records sure (s=0.01), half not."""
    s = np.where(rng.random(n) < 0.5, 0.01, 0.4)
    mu = rng.normal(0, 0.1, n)
    y = mu + s * rng.standard_normal(n)
    return y, mu, mu + s


def test_the_tightest_form_is_chosen_and_covers_fresh_draws():
    rng = np.random.default_rng(0)
    y, mu, upper = _draw(rng, 4000)
    cal = fit_group(y, mu, upper, 0.02)
    assert cal["form"] == "scaled"  # the head's spread tells sure from unsure records
    assert cal["median_margin"] < min(c["median_margin"] for f, c in cal["candidates"].items()
                                      if f != "scaled")  # fmt: skip
    y2, mu2, up2 = _draw(rng, 20000)
    miss = np.mean(y2 > bound_log(mu2, up2, cal))
    assert 0.01 < miss < 0.03  # the wanted 2%, on records the calibration never saw


def test_a_head_that_does_not_transfer_loses_to_the_network_free_bound():
    # the measured correction is a constant 10% +- 1%; the head's mu is noise around it,
    # as a head trained on other families can be: the analytic sweep x e^q is tighter
    rng = np.random.default_rng(1)
    y = 0.1 + 0.01 * rng.standard_normal(2000)
    mu = 0.1 + 0.3 * rng.standard_normal(2000)
    cal = fit_group(y, mu, mu + 0.05, 0.02)
    assert cal["form"] == "analytic"
    assert cal["q"] == pytest.approx(np.quantile(y, 0.98), abs=0.005)
    assert cal["fallback"] == {"form": "analytic", "q": cal["q"]}
    assert cal["correction_range"] == [y.min(), y.max()]
    assert np.all(bound_log(mu, mu + 0.05, cal) == np.maximum(cal["q"], mu))


def test_served_bound_falls_back_outside_the_measured_corrections():
    cal = {"form": "plain", "q": 0.1, "fallback": {"form": "analytic", "q": 0.3},
           "correction_range": [0.0, 0.4]}  # fmt: skip
    mu = np.array([0.2, 0.4 + RANGE_TOLERANCE / 2, 0.4 + 2 * RANGE_TOLERANCE, -1.0, 9.0])
    assert outside_range(mu, cal).tolist() == [False, False, True, True, True]
    value, bound, fell = served_bound_log(mu, mu + 0.05, cal)
    assert fell.tolist() == [False, False, True, True, True]
    np.testing.assert_allclose(value, [0.2, mu[1], 0.4, 0.0, 0.4])  # clipped into the range
    np.testing.assert_allclose(bound, [0.3, mu[1] + 0.1, 0.4, 0.3, 0.4])  # >= the value
    # asked out of distribution (features past the training range): the fallback too
    _, forced, fell = served_bound_log(mu[:1], mu[:1] + 0.05, cal, np.array([True]))
    assert fell.tolist() == [True] and forced.tolist() == [0.3]
    # no calibration, or one without a fallback (older cards): nothing changes
    for old in (None, {"form": "plain", "q": 0.1}):
        v, b, f = served_bound_log(mu, mu + 0.05, old, np.ones(5, dtype=bool))
        assert not f.any() and np.array_equal(v, mu)
        assert np.array_equal(b, bound_log(mu, mu + 0.05, old))


def test_bound_log_without_calibration_and_never_below_mu():
    mu, upper = np.array([0.1, 0.2]), np.array([0.3, 0.25])
    assert np.array_equal(bound_log(mu, upper, None), upper)
    low = bound_log(mu, upper, {"form": "plain", "q": -1.0})
    assert np.array_equal(low, mu)
    assert group_key(True, "reserved") == "gpu/reserved" and group_key(False, "allocated") == (
        "cpu/allocated"
    )
    with pytest.raises(ValueError, match="form"):
        bound_log(mu, upper, {"form": "wide", "q": 0.1})


def test_served_model_applies_the_cards_calibration(tmp_path):
    import torch
    from memgnn.predictor.capture.capture import CaptureConfig, capture
    from memgnn.predictor.memory.base import Query
    from memgnn.predictor.memory.features import graph_inputs
    from memgnn.predictor.memory.gnn import GNNConfig, MemoryGNN
    from memgnn.predictor.memory.onnx_model import OnnxMemoryModel
    from memgnn.predictor.spec.train import TrainSpec
    from memgnn.training.export import export_onnx, write_card
    from tiny_models import tiny_gpt_bundle

    graph = capture(tiny_gpt_bundle(), TrainSpec(), CaptureConfig(target="cuda"))
    torch.manual_seed(0)
    net = MemoryGNN(GNNConfig(hidden=16, layers=2, head_hidden=32)).eval()
    info = export_onnx(net, graph_inputs(graph), tmp_path)
    write_card(tmp_path, {"model_version": "gnn-cal", "onnx": info, "metrics": {}})
    q = [Query(sizes={"B": 4, "S": 32}, device="a100-80gb", metric="reserved")]
    raw = OnnxMemoryModel.load(tmp_path)
    before = raw.predict(graph, q)[0]
    card = json.loads((tmp_path / "model_card.json").read_text())
    card["bound_calibration"] = {"gpu/reserved": {"form": "plain", "q": 0.5}}
    (tmp_path / "model_card.json").write_text(json.dumps(card))
    after = OnnxMemoryModel.load(tmp_path).predict(graph, q)[0]
    assert after.predicted_peak_bytes == before.predicted_peak_bytes  # the value is untouched
    analytic, corr = after.breakdown["analytic_bytes"], after.breakdown["correction"]
    want = max(np.ceil(analytic * corr * np.exp(0.5)), after.predicted_peak_bytes)
    assert after.upper_bound_bytes == pytest.approx(want, rel=1e-6)
    # another group's calibration leaves this one alone
    card["bound_calibration"] = {"gpu/allocated": {"form": "plain", "q": 0.5}}
    (tmp_path / "model_card.json").write_text(json.dumps(card))
    other = OnnxMemoryModel.load(tmp_path).predict(graph, q)[0]
    assert other.upper_bound_bytes == before.upper_bound_bytes


def test_served_model_falls_back_and_says_so_out_of_distribution(tmp_path):
    import torch
    from memgnn.predictor.capture.capture import CaptureConfig, capture
    from memgnn.predictor.memory.base import Query
    from memgnn.predictor.memory.features import graph_inputs
    from memgnn.predictor.memory.gnn import GNNConfig, MemoryGNN
    from memgnn.predictor.memory.onnx_model import OnnxMemoryModel
    from memgnn.predictor.spec.train import TrainSpec
    from memgnn.training.export import export_onnx, write_card
    from tiny_models import tiny_gpt_bundle

    graph = capture(tiny_gpt_bundle(), TrainSpec(), CaptureConfig(target="cuda"))
    torch.manual_seed(0)
    net = MemoryGNN(GNNConfig(hidden=16, layers=2, head_hidden=32)).eval()
    with torch.no_grad():
        net.head.out.bias.fill_(3.0)  # a wild correction everywhere (x20, clipped at x16)
    info = export_onnx(net, graph_inputs(graph), tmp_path)
    cal = {
        "form": "plain",
        "q": 0.1,
        "target_miss": 0.02,
        "n": 100,
        "fallback": {"form": "analytic", "q": 0.3},
        "correction_range": [0.0, 0.4],
    }
    write_card(tmp_path, {"model_version": "gnn-ood", "onnx": info, "metrics": {},
                          "bound_calibration": {"gpu/allocated": cal}})  # fmt: skip
    q = [Query(sizes={"B": 4, "S": 32}, device="a100-80gb", metric="allocated")]
    p = OnnxMemoryModel.load(tmp_path).predict(graph, q)[0]
    analytic = p.breakdown["analytic_bytes"]
    assert p.upper_bound_bytes == np.ceil(analytic * np.exp(0.4))  # not 16 x analytic
    assert p.predicted_peak_bytes == pytest.approx(analytic * np.exp(0.4), rel=1e-6)
    trust = p.breakdown["trust"]
    assert trust["in_distribution"] is False
    assert any("outside the x1..x1.49" in why for why in trust["reasons"])
    assert trust["bound"].startswith("network-free fallback: analytic x 1.35")
    # a group without a calibration keeps the head's (clipped) bound, and says so
    a = OnnxMemoryModel.load(tmp_path).predict(
        graph, [Query(sizes={"B": 4, "S": 32}, device="a100-80gb", metric="reserved")]
    )[0]
    assert a.breakdown["trust"]["bound"].startswith("the head's own")
    assert a.breakdown["trust"]["in_distribution"] is False  # the clip is said


def test_device_total_bound_is_the_reserved_bound_plus_the_context(tmp_path):
    import torch
    from memgnn.predictor.capture.capture import CaptureConfig, capture
    from memgnn.predictor.memory.base import Query
    from memgnn.predictor.memory.features import graph_inputs
    from memgnn.predictor.memory.gnn import GNNConfig, MemoryGNN
    from memgnn.predictor.memory.onnx_model import OnnxMemoryModel
    from memgnn.predictor.spec.devices import get_profile
    from memgnn.predictor.spec.train import TrainSpec
    from memgnn.training.export import export_onnx, write_card
    from tiny_models import tiny_gpt_bundle

    graph = capture(tiny_gpt_bundle(), TrainSpec(), CaptureConfig(target="cuda"))
    torch.manual_seed(0)
    net = MemoryGNN(GNNConfig(hidden=16, layers=2, head_hidden=32)).eval()
    info = export_onnx(net, graph_inputs(graph), tmp_path)
    wide = [-10.0, 10.0]
    cal = {"gpu/reserved": {"form": "plain", "q": 0.7, "target_miss": 0.02,
                            "correction_range": wide, "fallback": {"form": "analytic", "q": 1}},
           "gpu/device_total": {"form": "derived", "q": 0.0, "target_miss": 0.02,
                                "correction_range": wide,
                                "fallback": {"form": "analytic", "q": 1}}}  # fmt: skip
    write_card(tmp_path, {"model_version": "gnn-dt", "onnx": info, "metrics": {},
                          "bound_calibration": cal})  # fmt: skip
    model = OnnxMemoryModel.load(tmp_path)
    sizes = {"B": 64, "S": 32}
    res, tot = model.predict(graph, [Query(sizes=sizes, device="a100-80gb", metric=m)
                                     for m in ("reserved", "device_total")])  # fmt: skip
    ctx = get_profile("a100-80gb").context_bytes
    res_bound = res.breakdown["analytic_bytes"] * res.breakdown["correction"] * np.exp(0.7)
    assert res_bound < 16 * res.breakdown["analytic_bytes"]  # not clipped here
    want = np.ceil(max(res_bound + ctx, tot.predicted_peak_bytes))
    assert tot.upper_bound_bytes == pytest.approx(want, rel=1e-9)
    assert "reserved bound + CUDA context" in tot.breakdown["trust"]["bound"]


def test_a_derived_bound_falls_back_to_the_derived_one_not_a_constant():
    # device total = reserved + context: out of range, its bound is the (network-free)
    # reserved fallback plus the context, not the total's own analytic x e^q
    cal = {"form": "derived", "q": 0.0, "fallback": {"form": "analytic", "q": 2.0},
           "correction_range": [0.0, 0.4]}  # fmt: skip
    mu, derived = np.array([0.1, 5.0]), np.array([0.3, 0.35])
    value, bound, fell = served_bound_log(mu, mu + 0.1, cal, None, derived)
    assert fell.tolist() == [False, True]
    np.testing.assert_allclose(value, [0.1, 0.4])
    np.testing.assert_allclose(bound, [0.3, 0.4])  # derived + q, never below the value
    with pytest.raises(ValueError, match="derive"):
        bound_log(mu, mu, cal)
