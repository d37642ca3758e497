"""`method` routing over HTTP: replay within the budget, the model while the JIT warms,
`replay` by name waits (503 past the wait), analytic, /plan, exact answers uncorrected."""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest
from fastapi.testclient import TestClient
from memgnn.predictor.answer import exact
from memgnn.predictor.answer.exact import ExactConfig, ReplayModel, estimated_seconds
from memgnn.predictor.capture.capture import CaptureConfig, capture
from memgnn.predictor.memory.analytic import AnalyticModel
from memgnn.predictor.memory.base import Query
from memgnn.predictor.sim.replay.cost import ReplayCost
from memgnn.predictor.spec.train import TrainSpec
from memgnn.serving.app import create_app
from memgnn.serving.config import ServeConfig
from memgnn.serving.routing import ReplayWarmup, warm_replay
from tiny_models import tiny_mlp_bundle

TOKEN = "t0ken"
AUTH = {"authorization": f"Bearer {TOKEN}"}


class FakeGNN:
    """Analytic x 1.25, version gnn-fake, answers `method: gnn`; CPU allocated answers
    carry `breakdown.exact` as the learned model's do."""

    version = "gnn-fake"
    thread_safe = True

    def predict(self, graph, queries):
        out = []
        for q, p in zip(queries, AnalyticModel().predict(graph, queries)):
            exact = q.device == "cpu"
            value = p.predicted_peak_bytes if exact else int(p.predicted_peak_bytes * 1.25)
            out.append(
                replace(
                    p,
                    predicted_peak_bytes=value,
                    upper_bound_bytes=2 * value,
                    model_version=self.version,
                    method="gnn",
                    breakdown={**p.breakdown, "exact": "cpu" if exact else None},
                )
            )
        return out  # fmt: skip


class Gate:
    """A warm-up that compiles only once `open()` is called."""

    def __init__(self):
        self.go = threading.Event()

    def __call__(self):
        assert self.go.wait(60)
        warm_replay()


@pytest.fixture(scope="module")
def graph():
    return capture(tiny_mlp_bundle(), TrainSpec(), CaptureConfig(target="cuda"))


@pytest.fixture
def served(tmp_path, graph):
    gate = Gate()
    warmup = ReplayWarmup(gate)
    cfg = ServeConfig(state_dir=tmp_path, token=TOKEN, replay_wait_s=0.5)
    app = create_app(cfg, model=FakeGNN(), replay=warmup)
    with TestClient(app) as c:
        gid = c.post("/graphs", json=graph.content(), headers=AUTH).json()["graph_id"]
        yield c, gid, gate, warmup
        gate.go.set()


def _predict(c, gid, **extra):
    body = {"graph_id": gid, "configs": [{"sizes": {"B": 8}, "device": "a100-80gb"}], **extra}
    r = c.post("/predict", json=body)
    return r.status_code, r.json()


def test_auto_is_served_by_the_model_while_the_jit_warms_then_replays(served, graph):
    c, gid, gate, warmup = served
    assert c.get("/healthz").json()["replay_jit"]["state"] == "warming"
    status, body = _predict(c, gid)
    assert status == 200
    p = body["predictions"][0]
    assert p["method"] == "gnn" and p["model_version"] == "gnn-fake"
    assert "JIT warming" in p["breakdown"]["replay_skipped"]
    gate.go.set()
    assert warmup.wait(120)
    assert c.get("/healthz").json()["replay_jit"]["state"] == "warm"
    status, body = _predict(c, gid)
    p = body["predictions"][0]
    want = ReplayModel().predict(graph, [Query(sizes={"B": 8}, device="a100-80gb")])[0]
    assert p["method"] == "replay" and p["model_version"] == "replay-1"
    assert p["predicted_peak_bytes"] == want.predicted_peak_bytes  # the simulator's bytes
    assert p["upper_bound_bytes"] == want.predicted_peak_bytes


def test_replay_by_name_waits_and_says_when_not_ready(served):
    c, gid, _, _ = served
    status, body = _predict(c, gid, method="replay")  # the gate stays shut: 0.5 s wait
    assert status == 503 and "not ready" in str(body)


def test_budget_and_forced_methods(served, graph):
    c, gid, gate, warmup = served
    gate.go.set()
    assert warmup.wait(120)
    _, body = _predict(c, gid, replay_budget_ms=0)
    p = body["predictions"][0]
    assert p["method"] == "gnn" and "over the 0 ms budget" in p["breakdown"]["replay_skipped"]
    _, body = _predict(c, gid, method="gnn")
    assert body["predictions"][0]["method"] == "gnn"
    assert "replay_skipped" not in body["predictions"][0]["breakdown"]
    _, body = _predict(c, gid, method="analytic")
    want = AnalyticModel().predict(graph, [Query(sizes={"B": 8}, device="a100-80gb")])[0]
    assert body["predictions"][0]["method"] == "analytic"
    assert body["predictions"][0]["predicted_peak_bytes"] == want.predicted_peak_bytes
    status, body = _predict(c, gid, method="exactly")
    assert status == 422


def test_measured_slow_replays_send_auto_to_the_model_and_every_answer_says_why(
    served, graph, monkeypatch
):
    c, gid, gate, warmup = served
    gate.go.set()
    assert warmup.wait(120)
    cost = ReplayCost()
    monkeypatch.setattr(exact, "REPLAY_COST", cost)
    _, body = _predict(c, gid)
    p = body["predictions"][0]
    assert p["method"] == "replay" and p["breakdown"]["route"]["method"] == "replay"
    assert cost.samples == 1  # the server's own replay, measured warm
    route = p["breakdown"]["route"]
    assert route["jit"] == "warm" and "within the 250 ms budget" in route["reason"]
    # the machine gets loaded: replays measured 1000x the prior estimate
    prior = estimated_seconds(graph, ExactConfig())
    for _ in range(20):
        cost.observe(prior, 1000 * prior)
    _, body = _predict(c, gid)
    p = body["predictions"][0]
    assert p["method"] == "gnn" and "over the 250 ms budget" in p["breakdown"]["replay_skipped"]
    assert p["breakdown"]["route"]["factor"] > 100 and p["breakdown"]["route"]["method"] == "gnn"


def test_exact_answers_ignore_live_samples(served):
    c, gid, gate, warmup = served
    gate.go.set()
    assert warmup.wait(120)
    for device in ("a100-80gb", "cpu"):
        config = {"sizes": {"B": 8}, "device": device}
        method = "replay" if device != "cpu" else "gnn"
        body = {"graph_id": gid, "configs": [config], "method": method}
        before = c.post("/predict", json=body).json()["predictions"][0]
        m = 2 * before["predicted_peak_bytes"]
        r = c.post("/samples", headers=AUTH, json={"graph_id": gid, "measured_peak_bytes": m,
                                                     **config})  # fmt: skip
        assert r.status_code in (200, 201), r.text
        after = c.post("/predict", json=body).json()["predictions"][0]
        assert after["predicted_peak_bytes"] == before["predicted_peak_bytes"], device
        assert after["correction"]["samples"] == 0
    # the model's own (inexact) GPU answer does take the correction
    body = {"graph_id": gid, "configs": [{"sizes": {"B": 8}, "device": "a100-80gb"}],
            "method": "gnn"}  # fmt: skip
    assert c.post("/predict", json=body).json()["predictions"][0]["correction"]["samples"] == 1


def test_plan_says_what_decided_near_the_limit(served, graph):
    c, gid, gate, warmup = served
    body = {"graph_ids": [gid], "budget_bytes": 64 << 20, "device": "a100-80gb",
            "space": {"max_batch": 64}}  # fmt: skip
    r = c.post("/plan", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["method"] == "gnn" and "JIT" in r.json()["replay_skipped"]
    gate.go.set()
    assert warmup.wait(120)
    for method in ("auto", "replay", "gnn", "analytic"):
        r = c.post("/plan", json=body | {"method": method})
        assert r.status_code == 200, r.text
        want = "replay" if method == "auto" else method
        assert r.json()["method"] == want, method
