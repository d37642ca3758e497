"""Per-(target, metric) conformal bounds: the quantile's rank, the tightest form chosen,
coverage on fresh draws, and the served model applying the card's calibration."""

from __future__ import annotations

import json

import numpy as np
import pytest
from memgnn.predictor.calibration import (
    bound_log,
    conformal_quantile,
    fit_group,
    group_key,
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
    from memgnn.predictor.capture import CaptureConfig, capture
    from memgnn.predictor.features import graph_inputs
    from memgnn.predictor.gnn import GNNConfig, MemoryGNN
    from memgnn.predictor.onnx_model import OnnxMemoryModel
    from memgnn.predictor.predict import Query
    from memgnn.predictor.spec import TrainSpec
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
