"""Two replicas, one PostgreSQL database, under a bounded load (issue 27 item 5).

Two `memgnn serve` processes started together on one database with one writer token
take a shuffled mix of concurrent `/samples` writes (some retried, with their key, on the
other replica) and `/predict` reads. Then: every acknowledged sample is in the database
exactly once, under the id its reply gave; a graph uploaded to one replica is predicted
by the other; and once writes stop (and each replica's `correction_ttl_s` cache, 1 s,
has expired) both replicas give the same /predict answer, live correction included, the
one the database holds. The figures are printed (`pytest -s`) for docs/how-to/service.md.
"""

from __future__ import annotations

import random
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from memgnn.predictor.capture.capture import capture
from memgnn.predictor.spec.train import TrainSpec
from memgnn.serving.client import free_port
from memgnn.serving.config import ServeConfig
from serve_process import start_serve, stop
from sqlalchemy import create_engine, text
from tiny_models import tiny_mlp_bundle

pytestmark = pytest.mark.slow

TOKEN = "replicas"
AUTH = {"authorization": f"Bearer {TOKEN}"}
CONFIG = {"sizes": {"B": 16}, "device": "a100-80gb", "metric": "allocated"}
WRITES, RETRIES, READS, THREADS = 200, 40, 100, 8


def _predict(client: httpx.Client, gid: str) -> httpx.Response:
    # the served model's answer, which live samples correct ("auto" may replay the exact
    # bytes instead, uncorrected, once a replica's replay JIT is warm)
    body = {"graph_id": gid, "configs": [CONFIG], "method": "gnn"}
    return client.post("/predict", json=body)


def _answer(prediction: dict) -> dict:
    """A prediction without what each process times: its route (the replay-cost
    estimate) and `predict_seconds`."""
    breakdown = {k: v for k, v in prediction["breakdown"].items() if k != "route"}
    timed = {k: v for k, v in prediction.items() if k != "predict_seconds"}
    return timed | {"breakdown": breakdown}


def test_two_replicas_share_one_postgresql_database(postgres):
    db = postgres.create_database("replicas")
    ports = [free_port()]
    while len(ports) < 2:
        ports += [p for p in [free_port()] if p not in ports]
    with ThreadPoolExecutor(2) as pool:  # started together: they race on CREATE TABLE
        starting = [pool.submit(start_serve, db, p, "--token", TOKEN) for p in ports]
    procs = [f.result() for f in starting if f.exception() is None]
    clients = [
        httpx.Client(base_url=f"http://127.0.0.1:{p}", timeout=120, headers=AUTH) for p in ports
    ]
    try:
        for f in starting:
            assert f.exception() is None, f"a replica did not start: {f.exception()}"
        # a graph uploaded to one replica is predicted by the other
        graphs = [capture(tiny_mlp_bundle(), TrainSpec()), capture(tiny_mlp_bundle(), ddp())]
        gids, raw = [], []
        for i, graph in enumerate(graphs):
            up = clients[i].post("/graphs", json=graph.content())
            assert up.status_code == 201 and up.json()["stored"], up.text
            gid = up.json()["graph_id"]
            here, there = _predict(clients[i], gid), _predict(clients[1 - i], gid)
            assert here.status_code == there.status_code == 200, there.text
            ours, theirs = (_answer(r.json()["predictions"][0]) for r in (here, there))
            assert ours == theirs
            gids.append(gid)
            raw.append(ours["predicted_peak_bytes"])

        # the load: writes (some retried on the other replica with their key) and reads
        def body(i: int) -> dict:
            g = i % 2
            measured = raw[g] * (10 + i % 5) // 10  # 1.0x .. 1.4x the model's answer
            return {"graph_id": gids[g], "measured_peak_bytes": measured, "key": f"w{i}", **CONFIG}

        jobs = [("write", i % 2, i) for i in range(WRITES)]
        jobs += [("write", 1 - i % 2, i) for i in range(RETRIES)]  # the same key, elsewhere
        jobs += [("read", i % 2, i) for i in range(READS)]
        random.Random(27).shuffle(jobs)

        def send(job: tuple[str, int, int]) -> tuple[str, int, int, int, dict, float]:
            kind, server, i = job
            t0 = time.perf_counter()
            try:
                if kind == "write":
                    r = clients[server].post("/samples", json=body(i))
                else:
                    r = _predict(clients[server], gids[i % 2])
                status, answer = r.status_code, r.json()
            except (httpx.HTTPError, ValueError) as exc:  # counted as failures below
                status, answer = 0, {"error": repr(exc)}
            return kind, server, i, status, answer, time.perf_counter() - t0

        t0 = time.perf_counter()
        with ThreadPoolExecutor(THREADS) as pool:
            results = list(pool.map(send, jobs))
        wall = time.perf_counter() - t0
        failures = [r for r in results if not 200 <= r[3] < 300]
        latency = sorted(r[5] for r in results)
        print(
            f"\nreplicas: {len(results)} requests ({WRITES} writes, {RETRIES} retried on the "
            f"other replica, {READS} predicts; {THREADS} threads) in {wall:.1f} s "
            f"({len(results) / wall:.0f}/s), {len(failures)} failures, latency p50 "
            f"{statistics.median(latency) * 1e3:.0f} ms, p95 "
            f"{latency[int(0.95 * len(latency))] * 1e3:.0f} ms"
        )
        assert not failures, failures[:3]

        # every acknowledged sample is in the database exactly once, under its id
        acked: dict[str, list[tuple[int, bool]]] = {}
        for kind, _, i, _, answer, _ in results:
            if kind == "write":
                acked.setdefault(f"w{i}", []).append((answer["sample_id"], answer["stored"]))
        engine = create_engine(db)
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT key, id, principal FROM memgnn_samples")).all()
        engine.dispose()
        assert len(rows) == WRITES == len(acked)
        in_db = {key: row_id for key, row_id, _ in rows}
        assert {p for _, _, p in rows} == {"token"}
        for key, replies in acked.items():
            assert {row_id for row_id, _ in replies} == {in_db[key]}, key  # retries: same id
            assert sum(stored for _, stored in replies) == 1, key  # stored once

        # writes stopped: past the correction cache both replicas answer alike, with the
        # correction the database holds
        time.sleep(ServeConfig().correction_ttl_s + 0.5)
        for gid in gids:
            answers = [_answer(_predict(c, gid).json()["predictions"][0]) for c in clients]
            assert answers[0] == answers[1]
            corr = answers[0]["correction"]
            assert corr["samples"] == 32 and corr["peak_scale"] > 1  # one writer's window
            params = {"graph_id": gid, "device": CONFIG["device"], "metric": CONFIG["metric"]}
            for c in clients:
                assert c.get("/samples", params=params).json()["correction"] == corr
    finally:
        for c in clients:
            c.close()
        for proc in procs:
            stop(proc)
        postgres.drop_database("replicas")


def ddp() -> TrainSpec:
    return TrainSpec.of(gpus=2, sharding="ddp")
