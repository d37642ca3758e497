"""Live samples cannot poison /predict (issue 12 item 7): impossible measurements are
refused, few samples are trusted less, a correction's step is bounded, and each sample
keeps who sent it, from where and when."""

from __future__ import annotations

import math

import pytest
from fastapi.testclient import TestClient
from memgnn.predictor.capture.capture import capture
from memgnn.predictor.memory.base import Query
from memgnn.predictor.spec.train import TrainSpec
from memgnn.serving.app import create_app
from memgnn.serving.checks import resident_bytes
from memgnn.serving.config import ServeConfig
from tiny_models import tiny_mlp_bundle

TOKEN = "samples"
AUTH = {"authorization": f"Bearer {TOKEN}"}
CONFIG = {"sizes": {"B": 16}, "device": "a100-80gb", "metric": "allocated"}


@pytest.fixture(scope="module")
def graph():
    return capture(tiny_mlp_bundle(), TrainSpec())


@pytest.fixture
def client(tmp_path, db_url):
    # one writer trusted fully (no writer bound): the one-writer statistics under test;
    # test_api_writers.py tests the bound across writers. On SQLite and PostgreSQL.
    cfg = ServeConfig(
        model="analytic",
        state_dir=tmp_path,
        database_url=db_url,
        token=TOKEN,
        correction_writer_max_scale=4.0,
    )
    with TestClient(create_app(cfg)) as c:
        yield c


def _setup(client, graph) -> tuple[str, int]:
    gid = client.post("/graphs", json=graph.content(), headers=AUTH).json()["graph_id"]
    pred = client.post("/predict", json={"graph_id": gid, "configs": [CONFIG]}).json()
    return gid, pred["predictions"][0]["predicted_peak_bytes"]


def _sample(client, gid, measured, **extra):
    body = {"graph_id": gid, "measured_peak_bytes": measured, **CONFIG, **extra}
    return client.post("/samples", json=body, headers=AUTH)


def test_a_zero_and_a_tiny_sample_cannot_poison_predict(client, graph):
    """The issue's reproduction: samples of 0 and 1000 bytes made /predict answer 1000x
    too little. Both are refused, and /predict answers as before."""
    gid, before = _setup(client, graph)
    r = _sample(client, gid, 0)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"][:2] == [
        "body",
        "measured_peak_bytes",
    ]
    r = _sample(client, gid, 1000)
    assert r.status_code == 422, r.text
    assert "before its step starts" in r.text
    after = client.post("/predict", json={"graph_id": gid, "configs": [CONFIG]}).json()
    p = after["predictions"][0]
    assert p["predicted_peak_bytes"] == before and p["correction"]["samples"] == 0


def test_the_floor_is_the_bytes_held_before_the_step(client, graph):
    gid, _ = _setup(client, graph)
    floor = resident_bytes(graph, Query(sizes=CONFIG["sizes"], device=CONFIG["device"]))
    params = sum(p.numel() * 4 for p in tiny_mlp_bundle().build().parameters())
    assert floor >= params > 0  # the parameters (fp32) at least
    assert _sample(client, gid, floor - 1).status_code == 422
    assert _sample(client, gid, floor).status_code == 200
    over = _sample(client, gid, 81920 * 2**20 + 1)  # more than an A100-80GB holds
    assert over.status_code == 422 and "exceeds" in over.text


def test_one_sample_moves_half_way_and_no_step_exceeds_the_bound(client, graph):
    gid, before = _setup(client, graph)
    r = _sample(client, gid, 100 * before)  # 100x: clipped to 4x, then half-way in log
    assert r.status_code == 200, r.text
    corr = r.json()["correction"]
    assert corr["peak_scale"] == pytest.approx(2.0) and corr["bound_scale"] == pytest.approx(4.0)
    for k in range(2):
        _sample(client, gid, 100 * before, key=f"k{k}")
    corr = _sample(client, gid, 100 * before, key="k3").json()["correction"]
    assert corr["samples"] == 4
    assert corr["peak_scale"] == pytest.approx(math.exp(4 / 5 * math.log(4.0)))
    p = client.post("/predict", json={"graph_id": gid, "configs": [CONFIG]}).json()
    assert p["predictions"][0]["predicted_peak_bytes"] <= 4 * before


def test_the_prior_and_the_step_bound_are_configurable(tmp_path, db_url, graph):
    cfg = ServeConfig(
        model="analytic",
        state_dir=tmp_path,
        database_url=db_url,
        token=TOKEN,
        correction_prior=0,
        correction_max_scale=10,
        correction_writer_max_scale=10,
    )
    with TestClient(create_app(cfg)) as c:
        gid, before = _setup(c, graph)
        corr = _sample(c, gid, 3 * before).json()["correction"]
        assert corr["peak_scale"] == pytest.approx(3.0, rel=1e-6)  # fully trusted
    with pytest.raises(ValueError, match="correction_max_scale"):
        ServeConfig(correction_max_scale=0.5)


def test_samples_keep_their_provenance(client, graph):
    gid, before = _setup(client, graph)
    r = _sample(client, gid, before, source="governor/run-17")
    assert r.status_code == 200
    listed = client.get("/samples", params={"graph_id": gid}).json()["samples"][0]
    assert listed["principal"] == "token" and listed["source"] == "governor/run-17"
    assert listed["client"] == "testclient" and listed["created_at"] > 0
