"""Bad inputs, limits and auth: every rejection is a 4xx naming what is wrong, never a 500."""

from __future__ import annotations

import copy
import gzip
import json

import pytest
from fastapi.routing import iter_route_contexts
from fastapi.testclient import TestClient
from memgnn.predictor.capture.capture import capture
from memgnn.predictor.spec.train import TrainSpec
from memgnn.serving.app import create_app
from memgnn.serving.config import ServeConfig
from tiny_models import tiny_mlp_bundle

TOKEN = "s3cret"
AUTH = {"authorization": f"Bearer {TOKEN}"}
# POST routes that only read (their answers are computed, nothing the caller sent is
# stored for others). Frozen: a new POST route is a write unless added here on purpose.
# /snapshots/replay replays the uploaded file and stores nothing; /explain answers as
# /predict does.
READ_ONLY_POSTS = frozenset({"/predict", "/plan", "/explain", "/snapshots/replay"})


@pytest.fixture(scope="module")
def graph():
    return capture(tiny_mlp_bundle(), TrainSpec())


@pytest.fixture(scope="module")
def data(graph) -> dict:
    return graph.content()


@pytest.fixture(scope="module")
def client(tmp_path_factory, graph):
    cfg = ServeConfig(
        model="analytic",
        state_dir=tmp_path_factory.mktemp("s"),
        token=TOKEN,
        max_request_bytes=256 * 1024,
        max_decompressed_bytes=1 << 20,
        max_nodes=500,
        max_configs=16,
    )
    with TestClient(create_app(cfg)) as c:
        yield c


@pytest.fixture(scope="module")
def gid(client, data) -> str:
    r = client.post("/graphs", json=data, headers=AUTH)
    assert r.status_code == 201, r.text
    return r.json()["graph_id"]


def locs(r) -> list[list]:
    return [d["loc"] for d in r.json()["detail"]]


def upload(client, data) -> object:
    return client.post(
        "/graphs",
        content=json.dumps(data).encode(),
        headers={"content-type": "application/json"} | AUTH,
    )


# ---- malformed graphs -------------------------------------------------------------------
@pytest.mark.parametrize(
    "body, headers",
    [
        (b"not json at all", {}),
        (b"\x1f\x8b\x08\x00garbage", {}),  # gzip magic, broken stream
        (b"[1, 2, 3]", {}),
        (b'{"format": "something.else"}', {}),
        (gzip.compress(b"{}", mtime=0), {"content-encoding": "gzip"}),
    ],
)
def test_malformed_uploads_are_422(client, body, headers):
    r = client.post("/graphs", content=body, headers=headers | AUTH)
    assert r.status_code == 422, r.text


@pytest.mark.parametrize(
    "mutate, where",
    [
        (lambda d: d.pop("exprs"), ["body", "exprs"]),
        (lambda d: d.update(paths="x"), ["body", "paths"]),
        (lambda d: d["paths"][0].update(nodes={"op": 1}), ["body", "paths", 0, "nodes"]),
        (lambda d: d["paths"][0]["storages"]["nbytes"].__setitem__(0, 999), ["body"]),
        (lambda d: d["paths"][0]["nodes"].pop("phase"), ["body"]),
        (lambda d: d.update(graph_id="0" * 32), ["body"]),  # content hash mismatch
        (lambda d: d["exprs"].append("B +* 2"), ["body", "exprs", 10]),
        (lambda d: d["exprs"].append("__import__('os')"), ["body"]),
        (lambda d: d["exprs"].append("B ** B"), ["body", "exprs", 10]),
    ],
)
def test_bad_graph_fields_are_named(client, data, mutate, where):
    bad = copy.deepcopy(data)
    mutate(bad)
    r = upload(client, bad)
    assert r.status_code == 422, r.text
    assert locs(r)[0][: len(where)] == where


def test_symbol_names_cannot_inject_code(client, data):
    # StepGraph compiles its formulas with the symbol names as parameters: a name with a
    # default value would run code on load. The server rejects it before that happens.
    bad = copy.deepcopy(data)
    bad["symbols"] = {"B=().__class__.__mro__[1].__subclasses__()": 4}
    r = upload(client, bad)
    assert r.status_code == 422
    assert locs(r)[0][:2] == ["body", "symbols"]


def test_inline_graph_errors_point_into_graph(client, data):
    bad = copy.deepcopy(data)
    bad["paths"][0]["nodes"]["op"][0] = 7
    r = client.post("/predict", json={"graph": bad, "configs": [{"sizes": {"B": 1}}]})
    assert r.status_code == 422
    assert locs(r)[0][:2] == ["body", "graph"]


def test_division_by_zero_in_a_bound_is_422(client, data):
    bad = copy.deepcopy(data)
    bad["data_symbols"] = {"T": {"lo": "0", "balanced": "B // (B - B)", "hi": "B"}}
    r = upload(client, bad)
    assert r.status_code == 201, r.text
    gid = r.json()["graph_id"]
    body = {"graph_id": gid, "configs": [{"sizes": {"B": 2}, "scenario": "balanced"}]}
    r = client.post("/predict", json=body)
    assert r.status_code == 422 and locs(r)[0][:3] == ["body", "configs", 0]


# ---- limits -----------------------------------------------------------------------------
def test_huge_payload_is_413(client):
    r = client.post("/graphs", content=b"x" * (300 * 1024), headers=AUTH)
    assert r.status_code == 413
    r = client.post(
        "/predict",
        content=b"{" + b" " * (300 * 1024) + b"}",
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 413


def test_chunked_payload_over_the_limit_is_413(client):
    def chunks():
        for _ in range(40):
            yield b"x" * 8192

    r = client.post(
        "/graphs", content=chunks(), headers=AUTH
    )  # no Content-Length: counted while read
    assert r.status_code == 413


def test_gzip_bomb_is_413(client):
    bomb = gzip.compress(b'{"format": "' + b"a" * (4 << 20) + b'"}')
    assert len(bomb) < 256 * 1024
    r = client.post("/graphs", content=bomb, headers={"content-encoding": "gzip"} | AUTH)
    assert r.status_code == 413


def test_too_many_nodes_is_413(client, data):
    big = copy.deepcopy(data)
    nodes = big["paths"][0]["nodes"]
    while len(nodes["op"]) <= 500:
        for col in nodes.values():
            col.extend(copy.deepcopy(col[: min(len(col), 100)]))
    r = upload(client, big)
    assert r.status_code == 413 and "nodes" in r.text
    r = client.post("/predict", json={"graph": big, "configs": [{"sizes": {"B": 1}}]})
    assert r.status_code == 413


def test_too_many_configs_is_413(client, gid):
    configs = [{"sizes": {"B": b}} for b in range(1, 20)]
    r = client.post("/predict", json={"graph_id": gid, "configs": configs})
    assert r.status_code == 413


# ---- schema errors name the field -------------------------------------------------------
@pytest.mark.parametrize(
    "config, where",
    [
        ({"sizes": {"B": -4}}, ["body", "configs", 0, "sizes", "B"]),
        ({"sizes": {"B": 0}}, ["body", "configs", 0, "sizes", "B"]),
        ({"sizes": {"B": "8"}}, ["body", "configs", 0, "sizes", "B"]),
        ({"sizes": {"B": 1}, "device": "tpu-v9"}, ["body", "configs", 0, "device"]),
        ({"sizes": {"B": 1}, "metric": "peak"}, ["body", "configs", 0, "metric"]),
        ({"sizes": {"B": 1}, "scenario": "best"}, ["body", "configs", 0, "scenario"]),
        ({"sizes": {"B": 1}, "device": "cpu", "metric": "reserved"}, ["body", "configs", 0]),
        ({"sizes": {"B": 1}, "colour": "red"}, ["body", "configs", 0, "colour"]),
        ({"sizes": {"S": 4}}, ["body", "configs", 0, "sizes"]),  # B missing, S unknown
    ],
)
def test_bad_configs_are_422_naming_the_field(client, gid, config, where):
    r = client.post("/predict", json={"graph_id": gid, "configs": [config]})
    assert r.status_code == 422, r.text
    assert locs(r)[0][: len(where)] == where, r.text


def test_sizes_that_overflow_are_422(client, data):
    big = copy.deepcopy(data)
    big["exprs"].append("B**4 * 1024")  # a storage of 1024 * B^4 bytes
    big["paths"][0]["storages"]["nbytes"][0] = len(big["exprs"]) - 1
    gid = upload(client, big).json()["graph_id"]
    for method in ("gnn", "replay", "analytic"):
        body = {"graph_id": gid, "method": method}
        ok = client.post("/predict", json=body | {"configs": [{"sizes": {"B": 1000}}]})
        assert ok.status_code == 200, (method, ok.text)
        r = client.post("/predict", json=body | {"configs": [{"sizes": {"B": 2**20}}]})
        assert r.status_code == 422, (method, r.text)
        assert "overflow" in r.text or "beyond 2**63" in r.text, (method, r.text)
        assert locs(r)[0][:3] == ["body", "configs", 0]


def test_unknown_device_message_lists_profiles(client, gid):
    r = client.post("/predict", json={"graph_id": gid, "configs": [{"device": "tpu"}]})
    assert "h100-80gb" in r.json()["detail"][0]["msg"]


@pytest.mark.parametrize(
    "body",
    [
        {"configs": [{"sizes": {"B": 1}}]},  # no source
        {"graph_id": "ab" * 16, "model": {"spec": "mlp"}, "configs": [{}]},  # two sources
        {"graph_id": "not-hex!", "configs": [{}]},
        {"graph_id": "ab" * 16, "configs": []},
    ],
)
def test_bad_request_shapes(client, body):
    assert client.post("/predict", json=body).status_code == 422


def test_spec_errors(client):
    r = client.post("/predict", json={"model": {"spec": "no-such-model"}, "configs": [{}]})
    assert r.status_code == 422 and locs(r)[0][:2] == ["body", "model"]
    r = client.post("/predict", json={"model": {"spec": "py:os:system"}, "configs": [{}]})
    assert r.status_code == 403  # local specs are off by default
    r = client.post(
        "/predict", json={"model": {"spec": "mlp", "train": {"grad_accum": -1}}, "configs": [{}]}
    )
    assert locs(r)[0][:5] == ["body", "model", "train", "loop", "grad_accum"]
    r = client.post(
        "/predict",
        json={
            "model": {"spec": "mlp", "train": {"precision": "bf16"}},
            "configs": [{"device": "v100-16gb"}],
        },
    )
    assert r.status_code == 422 and locs(r)[0][:3] == ["body", "configs", 0]


def test_plan_schema_errors(client, gid):
    base = {"graph_ids": [gid], "device": "cpu"}
    r = client.post("/plan", json=base)  # no budget
    assert r.status_code == 422
    r = client.post("/plan", json=base | {"budget_fraction": 0.5})  # cpu has no total
    assert r.status_code == 422 and "budget_fraction" in r.text
    r = client.post("/plan", json=base | {"budget_bytes": 10**9, "space": {"max_batch": 0}})
    assert locs(r)[0][:3] == ["body", "space", "max_batch"]
    r = client.post(
        "/plan", json=base | {"budget_bytes": 10**9, "space": {"checkpointing": ["full"]}}
    )
    assert r.status_code == 422 and locs(r)[0][:2] == ["body", "graph_ids"]


# ---- unknown ops ------------------------------------------------------------------------
def test_unknown_ops_are_accepted_and_flagged(client, data):
    odd = copy.deepcopy(data)
    odd["paths"][0]["nodes"]["op"][1] = "my_custom_kernel.default"
    r = upload(client, odd)
    assert r.status_code == 201
    assert r.json()["has_unknown_ops"] is True
    assert r.json()["unknown_ops"] == ["my_custom_kernel.default"]
    p = client.post(
        "/predict", json={"graph_id": r.json()["graph_id"], "configs": [{"sizes": {"B": 4}}]}
    )
    assert p.status_code == 200
    assert p.json()["has_unknown_ops"] and p.json()["predictions"][0]["predicted_peak_bytes"] > 0


# ---- auth -------------------------------------------------------------------------------
def test_writes_need_the_token(client, gid):
    sample = {"graph_id": gid, "sizes": {"B": 2}, "device": "cpu", "measured_peak_bytes": 10**6}
    r = client.post("/samples", json=sample)
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    r = client.post("/samples", json=sample, headers={"authorization": "Bearer wrong"})
    assert r.status_code == 403
    r = client.post("/samples", json=sample, headers={"authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 200
    assert client.post("/admin/reload").status_code == 401
    # reads stay open
    assert client.post("/predict", json={"graph_id": gid, "configs": [{}]}).status_code in (
        200,
        422,
    )
    assert client.get("/samples", params={"graph_id": gid}).status_code == 200


def test_writes_are_refused_by_default_without_a_token(tmp_path, data):
    """No --token and no --allow-anonymous-writes: the server answers, takes no writes."""
    with TestClient(create_app(ServeConfig(model="analytic", state_dir=tmp_path))) as c:
        r = c.post("/graphs", json=data)
        assert r.status_code == 403 and "--token" in r.text
        s = {"graph_id": "a" * 32, "sizes": {"B": 2}, "device": "cpu", "measured_peak_bytes": 1000}
        assert c.post("/samples", json=s).status_code == 403
        assert c.post("/admin/reload").status_code == 403
        # reads work, and an inline graph is answered but not stored
        r = c.post("/predict", json={"graph": data, "configs": [{"sizes": {"B": 2}}]})
        assert r.status_code == 200
        assert not c.app.state.engine.store.has_graph(r.json()["predictions"][0]["graph_id"])


def test_anonymous_writes_when_asked_for_but_a_fixed_model(tmp_path, data):
    cfg = ServeConfig(model="analytic", state_dir=tmp_path, allow_anonymous_writes=True)
    with TestClient(create_app(cfg)) as c:
        gid = c.post("/graphs", json=data).json()["graph_id"]
        s = {"graph_id": gid, "sizes": {"B": 2}, "device": "cpu", "measured_peak_bytes": 10**6}
        assert c.post("/samples", json=s).status_code == 200
        assert c.post("/admin/reload").status_code == 200
        assert c.post("/admin/reload", json={"model": "analytic"}).status_code == 403


def _write_routes(app) -> list[tuple[str, str]]:
    out = []
    for route in iter_route_contexts(app.routes):  # routes of included routers too
        for method in sorted((getattr(route, "methods", None) or set()) - {"GET", "HEAD"}):
            if route.path not in READ_ONLY_POSTS:
                out.append((method, route.path.replace("{", "").replace("}", "")))
    return out


def test_every_write_route_rejects_a_missing_token(client, tmp_path):
    """Enumerates the app's routes: a new write route cannot be left open."""
    writes = _write_routes(client.app)
    assert {("POST", "/graphs"), ("POST", "/samples"), ("POST", "/admin/reload")} <= set(writes)
    count = client.app.state.engine.store.count_samples()
    for method, path in writes:
        for headers in ({}, {"authorization": "Bearer wrong"}):
            r = client.request(method, path, json={}, headers=headers)
            assert r.status_code in (401, 403), (method, path, headers, r.status_code)
    assert client.app.state.engine.store.count_samples() == count
    with TestClient(create_app(ServeConfig(model="analytic", state_dir=tmp_path))) as open_:
        for method, path in _write_routes(open_.app):
            assert open_.request(method, path, json={}).status_code == 403, (method, path)


def test_samples_for_unknown_graph_is_404(client):
    s = {"graph_id": "f" * 32, "sizes": {"B": 2}, "device": "cpu", "measured_peak_bytes": 1}
    r = client.post("/samples", json=s, headers={"authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 404


# ---- integer constants and negative sizes (issue 12 item 9) ----------------------------
def test_a_constant_wider_than_64_bits_is_422_naming_the_formula(client, data):
    bad = copy.deepcopy(data)
    wide = 2**65  # (B * 2**65) // 2**65 is B exactly, but not in int64
    bad["exprs"].append(f"(B * {wide}) // {wide}")
    bad["paths"][0]["storages"]["nbytes"][0] = len(bad["exprs"]) - 1
    r = upload(client, bad)
    assert r.status_code == 422, r.text
    assert locs(r)[0] == ["body", "exprs", len(bad["exprs"]) - 1]
    assert "64 bits" in r.text
    r = client.post("/predict", json={"graph": bad, "configs": [{"sizes": {"B": 4}}]})
    assert r.status_code == 422 and locs(r)[0][:3] == ["body", "graph", "exprs"]


def test_sizes_that_evaluate_negative_are_rejected(client, data):
    bad = copy.deepcopy(data)
    bad["exprs"].append("B - 1000000")  # negative at the example size
    bad["paths"][0]["storages"]["nbytes"][0] = len(bad["exprs"]) - 1
    r = upload(client, bad)
    assert r.status_code == 422, r.text
    assert locs(r)[0] == ["body", "exprs", len(bad["exprs"]) - 1] and "negative" in r.text
    # positive at the example size, negative at the queried one
    bad["exprs"][-1] = "B - 3"
    bad["symbols"] = {k: 8 for k in bad["symbols"]}
    r = upload(client, bad)
    assert r.status_code == 201, r.text
    body = {"graph_id": r.json()["graph_id"], "configs": [{"sizes": {"B": 8}}, {"sizes": {"B": 2}}]}
    r = client.post("/predict", json=body)
    assert r.status_code == 422, r.text
    assert locs(r)[0][:4] == ["body", "configs", 1, "sizes"] and "negative" in r.text


# ---- the caller's fault or the server's ----------------------------------------------
class _Broken:
    """An EncodingModel whose internals fail: a bug, not the caller's mistake."""

    version = "broken-1"
    thread_safe = True

    def __init__(self, exc: Exception):
        self.exc = exc

    def encode(self, graph):
        return None

    def predict_encoded(self, encoding, graph, queries):
        raise self.exc

    def predict(self, graph, queries):
        raise self.exc


@pytest.mark.parametrize(
    "exc, status",
    [
        (ValueError("operands could not be broadcast together"), 500),  # numpy's
        (json.JSONDecodeError("Expecting value", "", 0), 500),  # a ValueError too
        (KeyError("paths"), 500),
    ],
)
def test_internal_errors_are_500_not_the_callers_fault(tmp_path, data, exc, status, caplog):
    cfg = ServeConfig(state_dir=tmp_path, token=TOKEN)
    with TestClient(create_app(cfg, model=_Broken(exc)), raise_server_exceptions=False) as c:
        gid = c.post("/graphs", json=data, headers={"authorization": f"Bearer {TOKEN}"})
        gid = gid.json()["graph_id"]
        with caplog.at_level("ERROR", logger="memgnn.serving.errors"):
            body = {"graph_id": gid, "configs": [{"sizes": {"B": 2}}], "method": "gnn"}
            r = c.post("/predict", json=body)
    assert r.status_code == status, r.text
    assert "traceback" in r.json()["detail"]
    assert any(rec.exc_info for rec in caplog.records)  # the traceback is in the log


def test_a_user_error_from_the_model_is_422(tmp_path, data):
    from memgnn.predictor.errors import UserError

    cfg = ServeConfig(state_dir=tmp_path, token=TOKEN)
    model = _Broken(UserError("sizes too large for this model"))
    with TestClient(create_app(cfg, model=model)) as c:
        gid = c.post("/graphs", json=data, headers={"authorization": f"Bearer {TOKEN}"})
        r = c.post(
            "/predict",
            json={
                "graph_id": gid.json()["graph_id"],
                "configs": [{"sizes": {"B": 2}}],
                "method": "gnn",
            },  # fmt: skip
        )
    assert r.status_code == 422 and locs(r)[0][:3] == ["body", "configs", 0]


# ---- non-finite numbers (a hostile probe's 500s) -----------------------------------------
@pytest.mark.parametrize("bad", ["NaN", "Infinity", "-Infinity"])
@pytest.mark.parametrize(
    ("path", "template", "field"),
    [
        ("/predict", '{"graph_id": "%s", "configs": [{"sizes": {"B": %s}}]}', "B"),
        ("/predict", '{"graph_id": "%s", "configs": [{"sizes": {"B": 2}}], "budget_ms": %s}', None),
        ("/plan", '{"graph_ids": ["%s"], "budget_bytes": %s, "device": "cpu"}', "budget_bytes"),
        ("/plan", '{"graph_ids": ["%s"], "budget_bytes": 1000, "threshold": %s}', "threshold"),
        ("/samples", '{"graph_id": "%s", "measured_peak_bytes": %s, "sizes": {"B": 2}}', None),
    ],
)
def test_non_finite_numbers_are_a_422_naming_the_field(client, gid, bad, path, template, field):
    """Python's json reads NaN and Infinity; FastAPI's 422 echoed them and then failed to
    encode its own answer (a 500). Now the answer is a 422 whose body is valid JSON, with
    the value spelled as the client sent it."""
    body = template % (gid, bad)
    headers = {"content-type": "application/json"} | AUTH
    r = client.post(path, content=body.encode(), headers=headers)
    assert r.status_code == 422, r.text
    detail = json.loads(r.text, parse_constant=lambda c: pytest.fail(f"{c} in the answer"))
    assert detail["detail"], detail
    if field is not None:
        assert any(d["loc"][-1] == field for d in detail["detail"]), detail
        assert any(d.get("input") == bad for d in detail["detail"]), detail
