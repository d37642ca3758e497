"""Live correction that no single writer controls (issue 27), through the HTTP API.

A hostile probe showed one token holder pulling every client's answer to 0.27x with 40
samples, and pushing it to 4.03x. Now each writer (a named credential) has its own
correction, and the writers' corrections are combined by their median, one writer
alone bounded by `correction_writer_max_scale` (1.25x). Exact answers stay uncorrected
whoever writes (test_routing.py::test_exact_answers_ignore_live_samples)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from memgnn.predictor.capture.capture import capture
from memgnn.predictor.spec.train import TrainSpec
from memgnn.serving.app import create_app
from memgnn.serving.config import ServeConfig
from tiny_models import tiny_mlp_bundle

WRITERS = {"alice": "tok-a", "bob": "tok-b", "carol": "tok-c", "mallory": "tok-m"}
BOUND = 1.25  # the default correction_writer_max_scale


@pytest.fixture(scope="module")
def graph():
    return capture(tiny_mlp_bundle(), TrainSpec())


@pytest.fixture
def client(tmp_path):
    cfg = ServeConfig(model="analytic", state_dir=tmp_path, token="legacy", writers=WRITERS)
    with TestClient(create_app(cfg)) as c:
        yield c


def _auth(writer: str) -> dict[str, str]:
    token = "legacy" if writer == "token" else WRITERS[writer]
    return {"authorization": f"Bearer {token}"}


def _setup(client, graph, config) -> tuple[str, dict]:
    up = client.post("/graphs", json=graph.content(), headers=_auth("alice"))
    gid = up.json()["graph_id"]
    return gid, _predict(client, gid, config)


def _predict(client, gid, config) -> dict:
    r = client.post("/predict", json={"graph_id": gid, "configs": [config], "method": "gnn"})
    assert r.status_code == 200, r.text
    return r.json()["predictions"][0]


def _send(client, gid, config, writer: str, factor: float, predicted: int, n: int = 1):
    for _ in range(n):
        body = {"graph_id": gid, "measured_peak_bytes": round(factor * predicted), **config}
        r = client.post("/samples", json=body, headers=_auth(writer))
        assert r.status_code == 200, r.text
    return r.json()["correction"]


CONFIG = {"sizes": {"B": 16}, "device": "a100-80gb", "metric": "allocated"}


@pytest.mark.parametrize("factor", [0.27, 4.03])
def test_one_token_holder_cannot_move_answers_past_the_bound(client, graph, factor):
    """The probe's 40 samples at 0.27x (and at 4.03x) move the answer by 1.25x at most."""
    gid, before = _setup(client, graph, CONFIG)
    corr = _send(client, gid, CONFIG, "mallory", factor, before["predicted_peak_bytes"], n=40)
    after = _predict(client, gid, CONFIG)
    peak, bound = after["predicted_peak_bytes"], after["upper_bound_bytes"]
    assert before["predicted_peak_bytes"] / BOUND - 1 <= peak
    assert peak <= before["predicted_peak_bytes"] * BOUND + 1
    assert bound <= before["upper_bound_bytes"] * BOUND + 1
    scale = BOUND if factor > 1 else 1 / BOUND
    assert after["correction"]["peak_scale"] == pytest.approx(scale)  # it did move, to the bound
    assert corr == after["correction"] and corr["capped"]
    assert (corr["writers"], corr["samples"]) == (1, 32)  # one writer's window
    # the legacy single --token is one more writer, bounded the same way
    _send(client, gid, CONFIG, "token", factor, before["predicted_peak_bytes"], n=5)
    assert _predict(client, gid, CONFIG)["correction"]["writers"] == 2


def test_two_agreeing_writers_move_it_further_than_one(client, graph):
    gid, before = _setup(client, graph, CONFIG)
    predicted = before["predicted_peak_bytes"]
    one = _send(client, gid, CONFIG, "alice", 0.5, predicted, n=3)
    two = _send(client, gid, CONFIG, "bob", 0.5, predicted, n=3)
    assert one["peak_scale"] == pytest.approx(1 / BOUND)
    assert two["peak_scale"] == pytest.approx(1 / BOUND**2)
    assert (two["writers"], two["samples"]) == (2, 6)
    assert _predict(client, gid, CONFIG)["predicted_peak_bytes"] == round(
        predicted * two["peak_scale"]
    )


def test_a_hostile_writer_among_three_honest_ones_is_outvoted(client, graph):
    gid, before = _setup(client, graph, CONFIG)
    predicted = before["predicted_peak_bytes"]
    honest = {"alice": 1.08, "bob": 1.10, "carol": 1.12}
    for writer, factor in honest.items():
        _send(client, gid, CONFIG, writer, factor, predicted, n=3)
    fair = _predict(client, gid, CONFIG)["correction"]
    assert fair["peak_scale"] == pytest.approx(1.10**0.75, rel=1e-4)
    own = [f**0.75 for f in honest.values()]  # each honest writer's own correction
    for factor in (0.27, 4.03):
        corr = _send(client, gid, CONFIG, "mallory", factor, predicted, n=40)
        assert min(own) * (1 - 1e-4) <= corr["peak_scale"] <= max(own) * (1 + 1e-4)
        assert corr["writers"] == 4


def test_the_answer_and_the_samples_say_who_contributed(client, graph):
    gid, before = _setup(client, graph, CONFIG)
    assert before["correction"] == {
        "peak_scale": 1.0,
        "bound_scale": 1.0,
        "samples": 0,
        "writers": 0,
        "writer_max_scale": None,
        "max_scale": None,
        "capped": False,
    }
    _send(client, gid, CONFIG, "alice", 1.1, before["predicted_peak_bytes"], n=2)
    _send(client, gid, CONFIG, "bob", 1.1, before["predicted_peak_bytes"])
    corr = _predict(client, gid, CONFIG)["correction"]
    assert (corr["samples"], corr["writers"], corr["capped"]) == (3, 2, False)
    assert (corr["writer_max_scale"], corr["max_scale"]) == (BOUND, 4.0)
    listed = client.get("/samples", params={"graph_id": gid}).json()["samples"]
    assert [s["principal"] for s in listed] == ["bob", "alice", "alice"]
    # a token no writer holds is refused, and stores nothing
    r = client.post(
        "/samples",
        json={"graph_id": gid, "measured_peak_bytes": before["predicted_peak_bytes"], **CONFIG},
        headers={"authorization": "Bearer tok-z"},
    )
    assert r.status_code == 403
    assert len(client.get("/samples", params={"graph_id": gid}).json()["samples"]) == 3
