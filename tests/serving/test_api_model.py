"""A learned-style model (encode + predict_encoded, an op vocabulary) drops in: the server
encodes each graph once, sends all configs of a request through the head in one call, and
applies corrections to its own bounds."""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest
from fastapi.testclient import TestClient
from memgnn.predictor.capture.capture import capture
from memgnn.predictor.memory.analytic import AnalyticModel
from memgnn.predictor.spec.train import TrainSpec
from memgnn.serving.app import create_app
from memgnn.serving.config import ServeConfig
from tiny_models import tiny_mlp_bundle


class FakeLearned:
    """Analytic x 1.5 with a bound at x 2; counts its calls; knows a few ops."""

    version = "fake-learned-7"
    thread_safe = False  # keeps call counts: the server must serialise its calls

    def __init__(self, known_ops: set[str]):
        self.op_vocab = known_ops
        self.encodes: list[str] = []
        self.batches: list[int] = []
        self.base = AnalyticModel()
        self.lock = threading.Lock()

    def encode(self, graph):
        self.encodes.append(graph.graph_id)
        return {"embedding-of": graph.graph_id}

    def predict_encoded(self, embedding, graph, queries):
        assert embedding == {"embedding-of": graph.graph_id}
        assert self.lock.acquire(blocking=False), "the server must serialise these calls"
        try:
            self.batches.append(len(queries))
            return [
                replace(
                    p,
                    predicted_peak_bytes=int(p.predicted_peak_bytes * 1.5),
                    upper_bound_bytes=p.predicted_peak_bytes * 2,
                    model_version=self.version,
                )
                for p in self.base.predict(graph, queries)
            ]
        finally:
            self.lock.release()

    def predict(self, graph, queries):
        return self.predict_encoded(self.encode(graph), graph, queries)


@pytest.fixture(scope="module")
def graph():
    return capture(tiny_mlp_bundle(), TrainSpec())


def test_learned_model_path(tmp_path, graph):
    ops = {op for p in graph.paths for op in p.nodes["op"]}
    known = ops - {sorted(ops)[0]}
    model = FakeLearned(known)
    with TestClient(
        create_app(
            # one writer trusted fully (test_api_writers.py: the bound across writers)
            ServeConfig(
                state_dir=tmp_path, allow_anonymous_writes=True, correction_writer_max_scale=4.0
            ),
            model=model,
        )
    ) as c:
        assert c.get("/readyz").json()["model_version"] == "fake-learned-7"
        up = c.post("/graphs", json=graph.content()).json()
        assert up["unknown_ops"] == [sorted(ops)[0]]  # judged by the model's vocabulary
        gid = up["graph_id"]
        configs = [{"sizes": {"B": b}, "device": "a100-80gb"} for b in (1, 2, 4, 8, 16)]
        for _ in range(3):
            r = c.post("/predict", json={"graph_id": gid, "configs": configs, "method": "gnn"})
            assert r.status_code == 200
        assert model.encodes == [gid]  # encoded once, cached by id
        assert model.batches[-3:] == [5, 5, 5]  # one head call per request
        p = r.json()["predictions"][0]
        assert p["model_version"] == "fake-learned-7"
        assert p["upper_bound_bytes"] > p["predicted_peak_bytes"]
        # a sample above the bound raises the bound to cover it; the peak follows the median
        m = p["upper_bound_bytes"] * 3 // 2
        s = c.post("/samples", json={"graph_id": gid, "measured_peak_bytes": m, **configs[0]})
        corr = s.json()["correction"]
        assert corr["bound_scale"] == pytest.approx(1.5, rel=1e-6)
        after = c.post(
            "/predict", json={"graph_id": gid, "configs": configs[:1], "method": "gnn"}
        ).json()
        assert after["predictions"][0]["upper_bound_bytes"] >= m
        # a reload keeps the injected model, re-encodes, and starts uncorrected per version
        assert c.post("/admin/reload").json()["model_version"] == "fake-learned-7"
        c.post("/predict", json={"graph_id": gid, "configs": configs[:1], "method": "gnn"})
        assert model.encodes == [gid, gid]


def test_concurrent_requests_on_a_model_that_is_not_thread_safe(tmp_path, graph):
    model = FakeLearned(set())
    cfg = ServeConfig(
        state_dir=tmp_path, correction_ttl_s=0, allow_anonymous_writes=True
    )  # every request: thread pool
    with TestClient(create_app(cfg, model=model)) as c:
        gid = c.post("/graphs", json=graph.content()).json()["graph_id"]
        errors = []

        def hammer(b: int) -> None:
            for _ in range(10):
                body = {"graph_id": gid, "configs": [{"sizes": {"B": b}}]}
                r = c.post("/predict", json=body)
                if r.status_code != 200:
                    errors.append(r.text)

        threads = [threading.Thread(target=hammer, args=(b,)) for b in range(1, 7)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors


def test_registry_uris_and_reload_to_another_model(tmp_path, graph, monkeypatch):
    import memgnn.serving.models as models

    fetched = []
    monkeypatch.setattr(models, "_download_mlflow", lambda uri: fetched.append(uri) or tmp_path)
    monkeypatch.setattr(models, "_load_dir", lambda path: FakeLearned(set()))
    assert models.load_model("models:/memgnn@production").version == "fake-learned-7"
    assert fetched == ["models:/memgnn@production"]
    cfg = ServeConfig(model="analytic", state_dir=tmp_path / "s", token="tk")
    auth = {"authorization": "Bearer tk"}
    with TestClient(create_app(cfg)) as c:
        gid = c.post("/graphs", json=graph.content(), headers=auth).json()["graph_id"]
        body = {"graph_id": gid, "configs": [{"sizes": {"B": 4}}], "method": "gnn"}
        before = c.post("/predict", json=body).json()["predictions"][0]
        r = c.post("/admin/reload", json={"model": "models:/memgnn@candidate"}, headers=auth)
        assert r.json() == {"previous_version": "analytic-1", "model_version": "fake-learned-7"}
        after = c.post("/predict", json=body).json()["predictions"][0]
        assert after["model_version"] == "fake-learned-7"
        assert after["predicted_peak_bytes"] == int(before["predicted_peak_bytes"] * 1.5)
        metrics = c.get("/metrics").text
        assert 'memgnn_model_info{version="fake-learned-7"} 1' in metrics
