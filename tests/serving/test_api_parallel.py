"""HTTP /predict for a sharded step: the answer is one rank's peak and says so."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from memgnn.predictor.capture.capture import capture
from memgnn.predictor.spec.train import TrainSpec
from memgnn.serving.app import create_app
from memgnn.serving.config import ServeConfig
from tiny_models import tiny_mlp_bundle


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    app = create_app(ServeConfig(model="analytic", state_dir=tmp_path_factory.mktemp("serve")))
    with TestClient(app) as c:
        yield c


def test_predict_sharded_graph_is_per_rank(client):
    single = capture(tiny_mlp_bundle(), TrainSpec())
    ddp = capture(tiny_mlp_bundle(), TrainSpec.of(gpus=2, sharding="ddp"))
    config = {"sizes": {"B": 2}, "device": "cpu"}
    one = client.post("/predict", json={"graph": single.content(), "configs": [config]})
    two = client.post("/predict", json={"graph": ddp.content(), "configs": [config]})
    assert one.status_code == two.status_code == 200, (one.text, two.text)
    a, b = one.json()["predictions"][0], two.json()["predictions"][0]
    assert "parallel" not in a["breakdown"] and "comm" not in a["breakdown"]["categories"]
    assert b["breakdown"]["parallel"]["world_size"] == 2
    assert b["breakdown"]["parallel"]["per_rank"] is True
    assert b["breakdown"]["categories"]["comm"] > 0  # DDP's gradient buckets
    assert b["predicted_peak_bytes"] > a["predicted_peak_bytes"]


def test_predict_refuses_zero3_on_one_gpu(client):
    body = {
        "model": {"spec": "mlp", "train": {"sharding": "zero3"}},
        "configs": [{"sizes": {"B": 2}, "device": "cpu"}],
    }
    r = client.post("/predict", json=body)
    assert r.status_code == 422
    assert "--sharding zero3 needs --gpus >= 2" in r.text
