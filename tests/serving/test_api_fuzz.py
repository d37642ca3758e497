"""Fuzz the OpenAPI schema (schemathesis: valid and invalid bodies, in-process ASGI, no
network): whatever arrives, the server answers without a 5xx; without the token, no write
is accepted; and the hostile requests of issue 12 (items 7-10) are refused with a 4xx.

The schema is loaded at import (schemathesis' `from_fixture` does not run on pytest 9);
the app's state lives in a temporary folder removed at exit.
"""

from __future__ import annotations

import atexit
import gzip
import json
import shutil
import tempfile
from pathlib import Path

import pytest

schemathesis = pytest.importorskip("schemathesis")

from hypothesis import HealthCheck, settings  # noqa: E402
from memgnn.predictor.capture.capture import capture  # noqa: E402
from memgnn.predictor.spec.train import TrainSpec  # noqa: E402
from memgnn.serving.app import create_app  # noqa: E402
from memgnn.serving.config import ServeConfig  # noqa: E402
from memgnn.serving.graphs import graph_bytes  # noqa: E402
from memgnn.serving.ratelimit import RateLimit  # noqa: E402
from memgnn.serving.store import Store  # noqa: E402
from tiny_models import tiny_mlp_bundle  # noqa: E402

TOKEN = "fuzz"
_STATE = Path(tempfile.mkdtemp(prefix="memgnn-fuzz-"))
atexit.register(shutil.rmtree, _STATE, True)
_CONFIG = ServeConfig(
    model="analytic", state_dir=_STATE, token=TOKEN, max_request_bytes=1 << 20,
    snapshot_limit=RateLimit(rate_per_min=1e6, burst=10_000),  # fuzz the loader, not the limit
)  # fmt: skip
schema = schemathesis.openapi.from_asgi("/openapi.json", create_app(_CONFIG))
schema.config.generation.update(max_examples=25, deterministic=True, database="none")


@schemathesis.serializer("application/gzip")
def _gzip(ctx, value):  # POST /graphs also takes gzip files: compress what was generated
    return gzip.compress(json.dumps(value).encode() if not isinstance(value, bytes) else value)


@pytest.fixture(scope="module", autouse=True)
def known_graph():
    """A real graph in the database, so generated ids and samples can meet one."""
    graph = capture(tiny_mlp_bundle(), TrainSpec())
    store = Store(_CONFIG.db_url)
    store.put_graph(graph.graph_id, graph_bytes(graph), sum(p.num_nodes for p in graph.paths))
    store.close()
    return graph.graph_id


@schema.parametrize()
@settings(deadline=None, suppress_health_check=list(HealthCheck))
def test_no_server_errors(case):
    response = case.call(headers={"authorization": f"Bearer {TOKEN}"}, timeout=120)
    assert response.status_code < 500, (case.method, case.path, case.body, response.text)


# ---- the same operations without a token: nothing is accepted as a write --------------
READ_ONLY_POSTS = frozenset({"/predict", "/plan"})  # see test_api_safety.READ_ONLY_POSTS


@schema.parametrize()
@settings(deadline=None, suppress_health_check=list(HealthCheck))
def test_no_write_is_accepted_without_the_token(case):
    response = case.call(timeout=120)
    assert response.status_code < 500, (case.method, case.path, case.body, response.text)
    if case.method.upper() != "GET" and case.path not in READ_ONLY_POSTS:
        # refused: 401/403 (no token), or earlier, 405/413/415/422 (never a 2xx)
        assert not 200 <= response.status_code < 300, (case.method, case.path, case.body)


# ---- hostile requests from issue 12 (items 7-10), one by one --------------------------
def _hostile_graph(formula: str) -> dict:
    graph = capture(tiny_mlp_bundle(), TrainSpec()).content()
    graph["exprs"].append(formula)
    graph["paths"][0]["storages"]["nbytes"][0] = len(graph["exprs"]) - 1
    return graph


HOSTILE = [
    ("wide constant", "POST", "/graphs", lambda: _hostile_graph(f"(B * {2**65}) // {2**65}")),
    ("negative size", "POST", "/graphs", lambda: _hostile_graph("B - 10**6")),
    ("zero sample", "POST", "/samples", lambda: {"measured_peak_bytes": 0}),
    ("tiny sample", "POST", "/samples", lambda: {"measured_peak_bytes": 1000}),
    ("huge sample", "POST", "/samples", lambda: {"measured_peak_bytes": 1 << 60}),
    (
        "deep mlp",
        "POST",
        "/predict",
        lambda: {"model": {"spec": "mlp", "model_args": {"layers": 1500}}, "configs": [{}]},
    ),
    (
        "many captures",
        "POST",
        "/plan",
        lambda: {
            "model": {"spec": "mlp"},
            "budget_bytes": 1 << 30,
            "device": "cpu",
            "space": {
                "checkpointing": ["none", "full", "blocks:1", "blocks:2"],
                "grad_accum": [1, 2],
                "precision": ["fp32", "bf16", "amp-bf16"],
            },
        },
    ),
]


@pytest.fixture(scope="module")
def hostile_client():
    from fastapi.testclient import TestClient

    with TestClient(create_app(_CONFIG), raise_server_exceptions=False) as c:
        yield c


@pytest.mark.parametrize("name, method, path, make", HOSTILE, ids=[h[0] for h in HOSTILE])
@pytest.mark.parametrize("auth", [True, False], ids=["token", "no-token"])
def test_hostile_requests_are_refused(hostile_client, known_graph, name, method, path, make, auth):
    body = make()
    if path == "/samples":
        body |= {"graph_id": known_graph, "sizes": {"B": 16}, "device": "a100-80gb"}
    headers = {"authorization": f"Bearer {TOKEN}"} if auth else {}
    r = hostile_client.request(method, path, json=body, headers=headers)
    assert 400 <= r.status_code < 500, (name, r.status_code, r.text)
