"""Acknowledged samples survive a kill -9 of the server (uvicorn in a subprocess)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from memgnn.predictor.capture.capture import capture
from memgnn.predictor.spec.train import TrainSpec
from memgnn.serving.client import free_port
from tiny_models import tiny_mlp_bundle

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "durable"


def start(db: Path, port: int) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-m",
        "memgnn.cli",
        "serve",
        "--port",
        str(port),
        "--model",
        "analytic",
        "--db",
        f"sqlite:///{db}",
        "--token",
        TOKEN,
        "--log-level",
        "warning",
    ]
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"server exited with {proc.returncode}"
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    pytest.fail("server did not become ready")


def test_samples_survive_kill_9(tmp_path):
    graph = capture(tiny_mlp_bundle(), TrainSpec())
    db = tmp_path / "samples.db"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    auth = {"authorization": f"Bearer {TOKEN}"}
    proc = start(db, port)
    try:
        gid = httpx.post(f"{url}/graphs", json=graph.content(), headers=auth, timeout=30).json()[
            "graph_id"
        ]
        acked = []
        with httpx.Client(base_url=url, headers=auth, timeout=30) as c:
            for i in range(25):
                r = c.post(
                    "/samples",
                    json={
                        "graph_id": gid,
                        "sizes": {"B": 4 + i},
                        "device": "a100-80gb",
                        "metric": "allocated",
                        "measured_peak_bytes": 10**7 + i,
                    },
                )
                assert r.status_code == 200, r.text
                acked.append(r.json()["sample_id"])
            before = r.json()["correction"]
        proc.send_signal(signal.SIGKILL)  # no shutdown, no checkpoint, no close
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert (tmp_path / "samples.db-wal").exists()  # the rows live in the WAL
    proc = start(db, port)
    try:
        listed = httpx.get(
            f"{url}/samples", params={"graph_id": gid, "device": "a100-80gb", "metric": "allocated"}
        ).json()
        assert sorted(s["id"] for s in listed["samples"]) == sorted(acked)
        assert listed["correction"] == before
        # the graph came back from the database too, with the correction applied
        r = httpx.post(
            f"{url}/predict",
            json={
                "graph_id": gid,
                "configs": [{"sizes": {"B": 8}, "device": "a100-80gb", "metric": "allocated"}],
            },
        )
        assert r.status_code == 200 and r.json()["predictions"][0]["correction"] == before
    finally:
        proc.terminate()
        proc.wait(20)
