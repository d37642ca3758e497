"""Captures on the server are bounded (issue 12 item 10): hparams, captures per request,
time per capture; they run in a worker process that is killed on a timeout, when the
client leaves and at shutdown, and they do not block requests for cached graphs."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from memgnn.predictor.capture.capture import capture
from memgnn.predictor.spec.train import TrainSpec
from memgnn.serving.app import create_app
from memgnn.serving.client import free_port, local_server
from memgnn.serving.config import ServeConfig
from tiny_models import tiny_mlp_bundle

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "captures"
AUTH = {"authorization": f"Bearer {TOKEN}"}


@pytest.fixture(autouse=True)
def _capture_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMGNN_CACHE", str(tmp_path / "cache"))  # the worker inherits it


def slow(marker: Path, seconds: int = 120) -> dict:
    return {
        "spec": "py:slow_models:slow_bundle",
        "model_args": {"seconds": seconds, "marker": str(marker)},
    }


def wait_for(path: Path, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, "the capture never started"
        time.sleep(0.05)


def test_hparams_beyond_the_limit_are_refused(tmp_path):
    with TestClient(create_app(ServeConfig(model="analytic", state_dir=tmp_path))) as c:
        body = {"model": {"spec": "mlp", "model_args": {"layers": 1500}}, "configs": [{}]}
        r = c.post("/predict", json=body)
        assert r.status_code == 422, r.text
        assert r.json()["detail"][0]["loc"] == ["body", "model", "model_args", "layers"]
        assert "limit of 64" in r.text  # 8 x the zoo's largest mlp depth (8)
        # a hostile probe's case: 14.7 s of server CPU and a 422 of Python's int-to-string
        # error; now refused before the model is made
        body = {"model": {"spec": "unet", "model_args": {"depth": 10**9}}, "configs": [{}]}
        r = c.post("/predict", json=body)
        assert r.status_code == 422, r.text
        assert r.json()["detail"][0]["loc"] == ["body", "model", "model_args", "depth"]
        assert "is over the limit of" in r.text and "upload the graph" in r.text


def test_captures_per_request_are_bounded(tmp_path):
    cfg = ServeConfig(model="analytic", state_dir=tmp_path, max_captures_per_request=2)
    with TestClient(create_app(cfg)) as c:
        body = {
            "model": {"spec": "mlp"},
            "budget_bytes": 1 << 30,
            "device": "cpu",
            "space": {"checkpointing": ["none", "full"], "grad_accum": [1, 2]},
        }
        t0 = time.monotonic()
        r = c.post("/plan", json=body)  # 4 variants, 4 graphs
        assert r.status_code == 413 and "max_captures_per_request" in r.text
        assert r.json()["detail"][0]["loc"] == ["body", "space"]
        assert time.monotonic() - t0 < 2  # refused before capturing anything


def test_a_capture_past_its_time_limit_is_killed(tmp_path):
    cfg = ServeConfig(
        model="analytic", state_dir=tmp_path, allow_local_specs=True, capture_timeout_s=15
    )
    with TestClient(create_app(cfg)) as c:
        t0 = time.monotonic()
        r = c.post("/predict", json={"model": slow(tmp_path / "m"), "configs": [{"device": "cpu"}]})
        assert r.status_code == 503 and "capture_timeout_s" in r.text, r.text
        assert time.monotonic() - t0 < 75  # worker start (torch import) + 15 s, not 120 s
        assert c.app.state.engine.captures._proc is None  # killed
        # the next capture gets a fresh worker
        r = c.post("/predict", json={"model": {"spec": "mlp"}, "configs": [{"device": "cpu"}]})
        assert r.status_code == 200, r.text


def test_cached_graphs_are_answered_during_a_capture_and_a_gone_client_cancels_it(tmp_path):
    graph = capture(tiny_mlp_bundle(), TrainSpec())
    cfg = ServeConfig(
        model="analytic", state_dir=tmp_path / "s", token=TOKEN, allow_local_specs=True
    )
    marker = tmp_path / "started"
    with local_server(cfg) as url:
        gid = httpx.post(f"{url}/graphs", json=graph.content(), headers=AUTH).json()["graph_id"]
        body = {"model": slow(marker), "configs": [{"device": "cpu"}]}

        with httpx.Client(base_url=url, timeout=90) as c:
            warm = {"model": {"spec": "mlp"}, "configs": [{"device": "cpu"}]}
            assert c.post("/predict", json=warm).status_code == 200  # the worker is up
            leaver = httpx.Client(base_url=url, timeout=httpx.Timeout(30, read=10))
            t = threading.Thread(target=lambda: _swallow(leaver.post, "/predict", json=body))
            t.start()
            wait_for(marker, timeout_s=9)
            t0 = time.monotonic()
            r = c.post("/predict", json={"graph_id": gid, "configs": [{"sizes": {"B": 4}}]})
            assert r.status_code == 200 and time.monotonic() - t0 < 2.0
            t.join()  # the client gave up after 10 s: its capture is killed
            leaver.close()
            t0 = time.monotonic()
            other = {"model": {"spec": "mlp", "model_args": {"hidden": 256}}, "configs": [{}]}
            other["configs"] = [{"device": "cpu"}]
            r = c.post("/predict", json=other)
            assert r.status_code == 200, r.text
            assert time.monotonic() - t0 < 60  # not queued behind the 120 s capture


def _swallow(fn, *args, **kw) -> None:
    try:
        fn(*args, **kw)
    except httpx.HTTPError:
        pass


def test_sigterm_during_a_long_capture_exits_within_seconds(tmp_path):
    port = free_port()
    env = os.environ | {
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")]),
        "MEMGNN_CACHE": str(tmp_path / "cache"),
    }
    cmd = [sys.executable, "-m", "memgnn.cli", "serve", "--port", str(port), "--model", "analytic"]
    cmd += ["--state-dir", str(tmp_path / "s"), "--allow-local-specs", "--log-level", "warning"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, "server did not start"
            try:
                if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        marker = tmp_path / "started"
        body = {"model": slow(marker, seconds=600), "configs": [{"device": "cpu"}]}
        answers: list[int] = []
        t = threading.Thread(
            target=lambda: answers.append(
                httpx.post(f"{url}/predict", json=body, timeout=120).status_code
            )
        )
        t.start()
        wait_for(marker)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=15)
        elapsed = time.monotonic() - t0
        t.join(30)
        logging.getLogger(__name__).info("SIGTERM to exit: %.2f s", elapsed)
        assert elapsed < 5.0, f"shutdown took {elapsed:.1f} s"
        assert answers == [503]  # the waiting request is told, not left hanging
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
