"""Acknowledged samples survive a kill -9 of the server (uvicorn in a subprocess), on
SQLite and on PostgreSQL."""

from __future__ import annotations

import signal

import httpx
from memgnn.predictor.capture.capture import capture
from memgnn.predictor.spec.train import TrainSpec
from memgnn.serving.client import free_port
from serve_process import start_serve, stop
from tiny_models import tiny_mlp_bundle

TOKEN = "durable"


def start(db_url: str, port: int):
    return start_serve(db_url, port, "--token", TOKEN)


def test_samples_survive_kill_9(db_url, tmp_path):
    graph = capture(tiny_mlp_bundle(), TrainSpec())
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    auth = {"authorization": f"Bearer {TOKEN}"}
    proc = start(db_url, port)
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
    if db_url.startswith("sqlite"):
        assert (tmp_path / "samples.db-wal").exists()  # the rows live in the WAL
    proc = start(db_url, port)
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
                # the served model's answer, which the correction applies to (an exact
                # replay, `auto`'s choice once the replay JIT is warm, takes none)
                "method": "gnn",
            },
        )
        assert r.status_code == 200 and r.json()["predictions"][0]["correction"] == before
    finally:
        stop(proc)
