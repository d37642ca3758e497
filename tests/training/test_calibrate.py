"""Calibration groups per (target kind, metric), exact CPU answers, cross-fitted residuals."""

from __future__ import annotations

import numpy as np
import pytest
from memgnn.predictor.memory.calibration import FORMS


@pytest.fixture(scope="module")
def data(tiny_corpus):
    from memgnn.training.data import load_dataset

    return load_dataset(tiny_corpus)


def test_exact_cpu_records_are_their_own_answer(data):
    from memgnn.training.calibrate import calibrated, groups_of

    cpu = np.array([s == "cpu" for s in data.source])
    assert cpu.any() and (~cpu).any()
    # the tiny mlp / lstm steps are one-path fp32 graphs: CPU allocated is the sweep
    assert data.exact[cpu].all() and not data.exact[~cpu].any()
    groups = groups_of(data)
    assert set(groups[cpu, 0]) == {""}  # left out of calibration: answered exactly
    assert set(groups[~cpu, 1]) == {"gpu/reserved"}
    idx = np.arange(len(data))
    mu = np.full((len(data), 3), 0.3)
    pred, bound = calibrated(data, idx, mu, mu + 0.2, {"gpu/reserved": {"form": "plain",
                                                                       "q": 0.5}})  # fmt: skip
    assert np.array_equal(pred[cpu, 0], data.analytic[cpu, 0])
    assert np.array_equal(bound[cpu, 0], data.analytic[cpu, 0])
    gpu = ~cpu
    np.testing.assert_allclose(bound[gpu, 1], data.analytic[gpu, 1] * np.exp(0.8))
    np.testing.assert_allclose(bound[gpu, 0], data.analytic[gpu, 0] * np.exp(0.5))  # head's


def test_groups_need_enough_residuals(data, monkeypatch):
    import memgnn.training.calibrate as cal

    idx = np.arange(len(data))
    mu = np.zeros((len(data), 3))
    assert cal.calibrate_groups(data, idx, mu, mu + 0.1, 0.02) == {}  # 16 records each
    monkeypatch.setattr(cal, "MIN_RESIDUALS", 2)
    out = cal.calibrate_groups(data, idx, mu, mu + 0.1, 0.02)
    assert set(out) == {"gpu/allocated", "gpu/reserved", "gpu/device_total"}
    for g in out.values():
        assert g["form"] in FORMS and g["n"] >= 2
        lo, hi = g["correction_range"]  # the measured corrections, for the served guard
        assert lo <= hi and g["fallback"]["form"] == "analytic"


def test_out_of_range_corrections_get_the_network_free_bound(data):
    from memgnn.training.calibrate import calibrated, fell_back

    gpu = np.flatnonzero([s != "cpu" for s in data.source])
    mu = np.full((len(gpu), 3), 0.05)
    mu[0, 1] = 9.0  # a wild network correction on reserved (x8103)
    cal = {"gpu/reserved": {"form": "plain", "q": 0.2, "target_miss": 0.02,
                            "fallback": {"form": "analytic", "q": 0.6},
                            "correction_range": [0.0, 0.5]}}  # fmt: skip
    pred, bound = calibrated(data, gpu, mu, mu + 0.1, cal)
    an = data.analytic[gpu, 1]
    np.testing.assert_allclose(bound[0, 1], an[0] * np.exp(0.6))  # not x e^9.2
    np.testing.assert_allclose(pred[0, 1], an[0] * np.exp(0.5))  # clipped into the range
    np.testing.assert_allclose(bound[1:, 1], an[1:] * np.exp(0.25))  # in range: plain q
    fell = fell_back(data, gpu, mu, mu + 0.1, cal)
    assert fell[:, 1].tolist() == [True] + [False] * (len(gpu) - 1)
    assert not fell[:, [0, 2]].any()  # groups without a calibration never fall back


def test_cross_fit_scores_every_record(data):
    import torch
    from memgnn.predictor.memory.gnn import GNNConfig, MemoryGNN
    from memgnn.training.calibrate import cross_fit
    from memgnn.training.fit_config import FitConfig

    torch.manual_seed(0)
    model = MemoryGNN(GNNConfig(hidden=8, layers=1, head_hidden=16))
    model.head.set_normalization(torch.from_numpy(data.q))
    with torch.no_grad():
        model.head.calibration.fill_(5.0)  # a head's old shift is not part of its raw bound
    idx = np.arange(len(data))
    rows, mu, upper = cross_fit(model, data, idx, FitConfig(calibration_epochs=1))
    assert sorted(rows.tolist()) == idx.tolist()  # two families: the model's head scores
    assert mu.shape == upper.shape == (len(data), 3)
    assert np.all(upper >= mu) and np.all(upper - mu < 5.0)


def test_device_total_may_derive_from_the_reserved_bound(data, monkeypatch):
    import memgnn.training.calibrate as cal

    monkeypatch.setattr(cal, "MIN_RESIDUALS", 2)
    gpu = np.flatnonzero([s != "cpu" for s in data.source])
    # the head's device-total numbers are shuffled labels (in range, uninformative), its
    # reserved ones the labels: the device total's tightest bound is then the reserved
    # bound plus the context
    rng = np.random.default_rng(0)
    mu = np.column_stack([data.y[gpu, 0], data.y[gpu, 1], rng.permutation(data.y[gpu, 2])])
    out = cal.calibrate_groups(data, gpu, mu, mu + 0.01, 0.02)
    assert out["gpu/device_total"]["form"] == "derived"
    pred, bound = cal.calibrated(data, gpu, mu, mu + 0.01, out)
    want = bound[:, 1] + (data.analytic[gpu, 2] - data.analytic[gpu, 1])  # + the context
    np.testing.assert_allclose(bound[:, 2], np.maximum(want * np.exp(out["gpu/device_total"]["q"]),
                                                       pred[:, 2]), rtol=1e-6)  # fmt: skip
