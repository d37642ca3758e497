"""POST /snapshots/replay: the replay report over HTTP, with the loader's safety."""

import gzip
import os
import pickle

import pytest
from fastapi.testclient import TestClient
from memgnn.predictor.sim.allocator import MiB
from memgnn.predictor.snapshot.export import SnapshotRecorder
from memgnn.predictor.snapshot.whatif import CONTRACT_FIELDS
from memgnn.serving.app import create_app
from memgnn.serving.config import ServeConfig
from memgnn.serving.ratelimit import RateLimit


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    state = tmp_path_factory.mktemp("serve-snap")
    cfg = ServeConfig(
        model="analytic", state_dir=state, max_request_bytes=64 * 1024,
        snapshot_limit=RateLimit(rate_per_min=1e6, burst=10_000),  # the limit: its own test
    )  # fmt: skip
    with TestClient(create_app(cfg)) as c:
        yield c


def snapshot_bytes() -> bytes:
    rec = SnapshotRecorder()
    a = rec.malloc(30 * MiB)
    b = rec.malloc(5 * MiB)
    rec.free(a)
    rec.malloc(8 * MiB)
    rec.free(b)
    return gzip.compress(pickle.dumps(rec.snapshot()))


def test_replay_returns_the_contract_fields(client):
    r = client.post("/snapshots/replay", content=snapshot_bytes())
    assert r.status_code == 200, r.text
    out = r.json()
    assert set(CONTRACT_FIELDS) <= set(out)
    # 30 MiB segment + 20 MiB segment (5 MiB request); the 8 MiB request reuses the 30.
    assert out["recorded_peak_reserved_bytes"] == out["simulated_peak_reserved_bytes"] == 50 * MiB
    assert out["segment_allocs_matched"] == 2 and out["first_divergence"] is None
    assert out["would_oom"] is None


def test_what_if_and_capacity(client):
    body = snapshot_bytes()
    r = client.post("/snapshots/replay", content=body, params={"capacity_bytes": 40 * MiB})
    out = r.json()
    assert out["would_oom"] is True and out["oom"]["event"] == 3  # the 5 MiB request
    r = client.post(
        "/snapshots/replay",
        content=body,
        params={"alloc_conf": "expandable_segments:True", "capacity_bytes": 40 * MiB},
    )
    out = r.json()
    assert out["alloc_conf"] == "expandable_segments:True" and out["would_oom"] is False
    assert out["simulated_peak_reserved_bytes"] == 40 * MiB  # two 20 MiB pages


def test_bad_alloc_conf_is_422(client):
    r = client.post("/snapshots/replay", content=snapshot_bytes(), params={"alloc_conf": "x:1"})
    assert r.status_code == 422 and "unknown alloc conf key 'x'" in r.text


class _RunsCode:
    def __reduce__(self):
        return (os.system, ("touch pwned-over-http",))


def test_code_running_pickle_is_refused(client, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    body = pickle.dumps({"segments": [], "device_traces": [[]], "x": _RunsCode()})
    r = client.post("/snapshots/replay", content=body)
    assert r.status_code == 422 and "refusing to load" in r.text
    assert not (tmp_path / "pwned-over-http").exists()


def test_limits(client):
    r = client.post("/snapshots/replay", content=b"\0" * (65 * 1024))
    assert r.status_code == 413
    r = client.post("/snapshots/replay", content=b"")
    assert r.status_code == 422
    r = client.post("/snapshots/replay", content=pickle.dumps([{"address": 1}]))
    assert r.status_code == 422 and "bare list" in r.text


def test_nonsense_geometry_and_a_bomb_are_422_naming_what(client):
    """The hostile probe's cases: a block past its segment (was a 500), a 2^70-byte
    allocation (was a 200 with a peak of 1.2e21 bytes), 8 million empty dicts (was 1.33 GB
    before the 422: now refused while loading)."""
    snap = pickle.loads(gzip.decompress(snapshot_bytes()))
    past = pickle.loads(pickle.dumps(snap))
    past["segments"][0]["blocks"][-1]["size"] += 512
    huge = pickle.loads(pickle.dumps(snap))
    huge["device_traces"][0].append({"action": "alloc", "addr": 1 << 40, "size": 2**70})
    bomb = b"\x80\x04](" + b"}" * 8_000_000 + b"e."
    for body, message in (
        (pickle.dumps(past), "runs past its segment"),
        (pickle.dumps(huge), "beyond any device"),
        (gzip.compress(bomb, 9, mtime=0), "max_memory_bytes"),
    ):
        r = client.post("/snapshots/replay", content=body)
        assert r.status_code == 422, r.text
        assert message in r.text


def test_each_client_is_rate_limited_and_a_token_holder_counts_apart(tmp_path):
    """No token needed, but bounded: a client's burst, then 429 with Retry-After; a valid
    writer token is its own client (the limit is per writer, not per address)."""
    cfg = ServeConfig(
        model="analytic", state_dir=tmp_path, token="T",
        snapshot_limit=RateLimit(rate_per_min=1, burst=2),
    )  # fmt: skip
    body = snapshot_bytes()
    with TestClient(create_app(cfg)) as c:
        codes = [c.post("/snapshots/replay", content=body).status_code for _ in range(3)]
        assert codes == [200, 200, 429]
        r = c.post("/snapshots/replay", content=body)
        assert r.status_code == 429 and "calls a minute" in r.json()["detail"]
        assert 1 <= int(r.headers["retry-after"]) <= 60
        auth = {"authorization": "Bearer T"}
        assert c.post("/snapshots/replay", content=body, headers=auth).status_code == 200
