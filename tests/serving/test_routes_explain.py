"""POST /explain: the peak of an uploaded graph or a model SPEC, through the HTTP API."""

from __future__ import annotations

import gzip
import json

import pytest
from fastapi.testclient import TestClient
from memgnn.predictor.capture.capture import capture
from memgnn.predictor.spec.train import TrainSpec
from memgnn.serving.app import create_app
from memgnn.serving.config import ServeConfig
from tiny_models import tiny_mlp_bundle

TOKEN = "t0ken"
AUTH = {"authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    state = tmp_path_factory.mktemp("serve-explain")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MEMGNN_CACHE", str(tmp_path_factory.mktemp("cache")))
        app = create_app(ServeConfig(model="analytic", state_dir=state, token=TOKEN))
        with TestClient(app) as c:
            yield c


@pytest.fixture(scope="module")
def gid(client) -> str:
    graph = capture(tiny_mlp_bundle(), TrainSpec())  # uploaded without meta: no lines
    body = gzip.compress(json.dumps(graph.content()).encode())
    r = client.post("/graphs", content=body, headers={"content-encoding": "gzip"} | AUTH)
    assert r.status_code in (200, 201), r.text
    return r.json()["graph_id"]


def test_an_uploaded_graph_is_explained_with_the_allocator_whatif_only(client, gid):
    r = client.post("/explain", json={"graph_id": gid, "query": {"sizes": {"B": 64}}, "top": 3})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["peak"]["reserved_bytes"] == out["prediction"]["predicted_peak_bytes"]
    assert [w["name"] for w in out["whatifs"]] == ["expandable_segments"]
    assert {s["name"] for s in out["not_applicable"]} >= {"checkpointing", "accumulation"}
    assert len(out["largest"]) == 3
    assert any("no source lines" in a for a in out["assumptions"])


@pytest.mark.slow
def test_a_model_spec_is_captured_and_explained(client):
    body = {"model": {"spec": "mlp"}, "query": {"sizes": {"B": 8}, "device": "a100-80gb"},
            "whatifs": []}  # fmt: skip
    r = client.post("/explain", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["prediction"]["model"]["spec"] == "mlp" and out["whatifs"] == []
    assert out["by_source"] and out["peak"]["blocks"] > 0


@pytest.mark.parametrize(
    "body",
    [
        {"query": {"sizes": {"B": 8}}},  # no source
        {"graph_id": "ab" * 8, "model": {"spec": "mlp"}},  # two
        {"model": {"spec": "mlp"}, "top": 0},
        {"model": {"spec": "mlp"}, "whatifs": ["bigger_gpu"]},
    ],
)
def test_bad_requests_are_422(client, body):
    assert client.post("/explain", json=body).status_code == 422
