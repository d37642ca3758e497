"""The Python client and the `memgnn serve` glue, against a real uvicorn on loopback."""

from __future__ import annotations

import dataclasses

import pytest
from memgnn.predictor.answer.types import ModelRef, PredictRequest, QueryConfig
from memgnn.predictor.capture.capture import capture
from memgnn.predictor.spec.train import TrainSpec
from memgnn.serving.client import (
    MemgnnClient,
    ServiceError,
    free_port,
    local_server,
    remote_plan,
    remote_predict,
    service_round_trip,
)
from memgnn.serving.config import ServeConfig
from tiny_models import tiny_mlp_bundle

TOKEN = "client-token"


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MEMGNN_CACHE", str(tmp_path_factory.mktemp("cache")))
        cfg = ServeConfig(model="analytic", state_dir=tmp_path_factory.mktemp("s"), token=TOKEN)
        with local_server(cfg) as url:
            yield url


@pytest.fixture(scope="module")
def graph():
    return capture(tiny_mlp_bundle(), TrainSpec())


def test_client_round_trip(url, graph, tmp_path):
    path = tmp_path / "g.json.gz"
    graph.save(path)
    with MemgnnClient(url, token=TOKEN) as c:
        assert c.health()["status"] == "ok" and c.ready()
        gid = c.upload_graph(path)
        assert gid == graph.graph_id == c.upload_graph(graph) == c.upload_graph(graph.content())
        out = c.predict(graph_id=gid, configs=[{"sizes": {"B": 4}, "device": "cpu"}], method="gnn")
        peak = out["predictions"][0]["predicted_peak_bytes"]
        m = peak * 6 // 5  # within what one writer may move an answer (1.25x)
        s = c.add_sample(
            graph_id=gid, sizes={"B": 4}, device="cpu", measured_peak_bytes=m, source="ci"
        )
        scale = s["correction"]["peak_scale"]
        assert scale == pytest.approx((m / peak) ** 0.5)  # one sample moves half-way (in log)
        assert s["correction"]["writers"] == 1 and s["correction"]["writer_max_scale"] == 1.25
        again = c.predict(
            graph_id=gid, configs=[{"sizes": {"B": 4}, "device": "cpu"}], method="gnn"
        )
        assert again["predictions"][0]["predicted_peak_bytes"] == round(peak * scale)
        listed = c.samples(gid)["samples"][0]
        assert listed["measured_bytes"] == m and listed["source"] == "ci"
        plan = c.plan(graph_ids=[gid], budget_bytes=1 << 30, device="cpu")
        assert plan["best"]["under_threshold"]
        assert "memgnn_http_requests_total" in c.metrics()
        assert c.reload()["model_version"] == "analytic-1"


def test_client_errors(url):
    with MemgnnClient(url) as c:  # no token
        with pytest.raises(ServiceError) as info:
            c.add_sample(graph_id="ab" * 16, sizes={"B": 1}, device="cpu", measured_peak_bytes=1)
        assert info.value.status == 401
        with pytest.raises(ServiceError) as info:
            c.predict(graph_id="ab" * 16, configs=[{"sizes": {"B": -1}}])
        assert info.value.status == 422 and "configs.0.sizes.B" in str(info.value)
    with MemgnnClient(f"http://127.0.0.1:{free_port()}", timeout=2) as c:
        assert not c.ready()
        with pytest.raises(ServiceError) as info:
            c.health()
        assert info.value.status == 0
    with pytest.raises(ValueError):
        MemgnnClient("127.0.0.1:8000")


def test_remote_predict_prints_the_cli_contract(url):
    req = PredictRequest(
        model=ModelRef(spec="mlp"),
        train=TrainSpec.of(optimizer="sgd"),
        configs=[QueryConfig(sizes={"B": 8}, device="a100-80gb", metric="allocated")],
        method="gnn",
    )
    out = remote_predict(url, req)
    for key in (
        "method",
        "predicted_peak_bytes",
        "upper_bound_bytes",
        "metric",
        "breakdown",
        "model_version",
        "sizes",
        "device",
        "graph_id",
    ):
        assert key in out
    assert out["metric"] == "allocated" and out["sizes"] == {"B": 8}
    assert out["model_version"] == "analytic-1" and out["method"] == "analytic"
    exact = remote_predict(url, dataclasses.replace(req, method="replay"))
    assert exact["method"] == "replay" and exact["model_version"] == "replay-1"
    with pytest.raises(ServiceError, match="model"):
        remote_predict(url, dataclasses.replace(req, model=ModelRef(spec="no-such-model")))


def test_remote_plan(url):
    out = remote_plan(
        url,
        model="mlp",
        budget_fraction=0.05,
        device="a100-80gb",
        space={"checkpointing": ["none"]},
    )
    assert out["best"]["checkpointing"] == "none" and out["best"]["under_threshold"]


def test_config_validation_and_env_round_trip(tmp_path):
    cfg = ServeConfig(state_dir=tmp_path, token="tok-42", max_nodes=7, model="analytic")
    env = cfg.to_env()
    assert "tok-42" not in env["MEMGNN_SERVE_CONFIG"]  # the token travels on its own
    assert ServeConfig.from_env(env) == cfg
    for bad in (
        {"max_nodes": 0},
        {"token": " "},
        {"database_url": "samples.db"},
        {"graph_cache_size": 0},
        {"blas_threads": 0},
        {"max_decompressed_bytes": 1},
    ):
        with pytest.raises(ValueError):
            ServeConfig(state_dir=tmp_path, **bad)
    with pytest.raises(ValueError):
        ServeConfig.from_env({"MEMGNN_SERVE_CONFIG": "{not json"})


def test_service_round_trip_for_the_demo(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMGNN_CACHE", str(tmp_path / "cache"))
    out = service_round_trip(
        ServeConfig(model="analytic", state_dir=tmp_path),
        model="mlp",
        device="a100-80gb",
        budget_fraction=0.05,
    )
    assert out["url"].startswith("http://127.0.0.1:")
    assert out["predict"]["predicted_peak_bytes"] > 0
    assert out["plan"]["best"]["under_threshold"]
