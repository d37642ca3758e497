"""Fuzz the OpenAPI schema (schemathesis: valid and invalid bodies, in-process ASGI, no
network): whatever arrives, the server answers without a 5xx.

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
from tiny_models import tiny_mlp_bundle  # noqa: E402

from predictor.capture import capture  # noqa: E402
from predictor.spec import TrainSpec  # noqa: E402
from serving.app import create_app  # noqa: E402
from serving.config import ServeConfig  # noqa: E402
from serving.graphs import graph_bytes  # noqa: E402
from serving.store import Store  # noqa: E402

TOKEN = "fuzz"
_STATE = Path(tempfile.mkdtemp(prefix="memgnn-fuzz-"))
atexit.register(shutil.rmtree, _STATE, True)
_CONFIG = ServeConfig(model="analytic", state_dir=_STATE, token=TOKEN, max_request_bytes=1 << 20)
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


@schema.parametrize()
@settings(deadline=None, suppress_health_check=list(HealthCheck))
def test_no_server_errors(case):
    response = case.call(headers={"authorization": f"Bearer {TOKEN}"})
    assert response.status_code < 500, (case.method, case.path, case.body, response.text)
