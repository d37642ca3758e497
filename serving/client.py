"""A small Python client of the memgnn service (httpx), and `remote_predict` for the CLI.

    with MemgnnClient("http://127.0.0.1:8000") as c:
        gid = c.upload_graph("step.json.gz")
        c.predict(graph_id=gid, configs=[{"sizes": {"B": 8, "S": 512}}])

Errors: `ServiceError` (a ValueError) with the HTTP status and the server's detail.
`local_server(config)` runs the service on a free loopback port inside this process
(uvicorn in a daemon thread) for demos, notebooks and tests; `service_round_trip` starts
it, asks /predict and /plan about a model, and stops it.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import logging
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from memgnn.predictor.answer.types import ModelRef, PredictRequest, QueryConfig
from memgnn.serving.config import ServeConfig

log = logging.getLogger(__name__)


class ServiceError(ValueError):
    """The service answered with an error status (or could not be reached: status 0)."""

    def __init__(self, status: int, detail: Any):
        self.status, self.detail = status, detail
        super().__init__(f"memgnn service: HTTP {status}: {_describe(detail)}")


def _describe(detail: Any) -> str:
    if isinstance(detail, list):
        return "; ".join(
            f"{'.'.join(str(x) for x in d.get('loc', []))}: {d.get('msg')}"
            if isinstance(d, dict)
            else str(d)
            for d in detail
        )
    return str(detail)


class MemgnnClient:
    """Thin wrapper over the HTTP API; every method returns the decoded JSON answer."""

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        timeout: float = 300.0,
        transport: httpx.BaseTransport | None = None,
    ):
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"service URL must start with http:// or https://, got {url!r}")
        headers = {"authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(
            base_url=url.rstrip("/"), headers=headers, timeout=timeout, transport=transport
        )

    def __enter__(self) -> MemgnnClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            r = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise ServiceError(0, f"cannot reach {self._http.base_url}: {exc}") from None
        if r.status_code >= 400:
            try:
                detail = r.json().get("detail", r.text)
            except (json.JSONDecodeError, AttributeError):
                detail = r.text
            raise ServiceError(r.status_code, detail)
        return r.json() if "json" in r.headers.get("content-type", "") else r.text

    # ---- endpoints ----------------------------------------------------------------------
    def health(self) -> dict[str, Any]:
        return self._call("GET", "/healthz")

    def ready(self) -> bool:
        try:
            return bool(self._call("GET", "/readyz").get("ready"))
        except ServiceError:
            return False

    def metrics(self) -> str:
        return self._call("GET", "/metrics")

    def upload_graph(self, graph: Any) -> str:
        """Upload a StepGraph (object, .json.gz / .json path, or dict); returns its id."""
        if isinstance(graph, (str, Path)):
            blob = Path(graph).read_bytes()
            if blob[:2] != b"\x1f\x8b":
                blob = gzip.compress(blob)
        else:
            data = graph if isinstance(graph, dict) else graph.content() | {"meta": graph.meta}
            blob = gzip.compress(json.dumps(data, separators=(",", ":")).encode())
        headers = {"content-type": "application/json", "content-encoding": "gzip"}
        return self._call("POST", "/graphs", content=blob, headers=headers)["graph_id"]

    def predict(
        self,
        *,
        configs: list[dict[str, Any]],
        graph_id: str | None = None,
        graph: dict[str, Any] | None = None,
        model: dict[str, Any] | None = None,
        apply_correction: bool = True,
        threshold: float | None = None,
        budget_bytes: int | None = None,
        method: str = "auto",
        replay_budget_ms: float | None = None,
        config: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """POST /predict; `method` auto | replay | gnn | analytic, `replay_budget_ms`
        (None: the server's) as `serving.routing` routes them; `threshold` / `budget_bytes`
        ask for a fits / does-not-fit verdict per config."""
        body: dict[str, Any] = {"configs": configs, "apply_correction": apply_correction,
                                "method": method}  # fmt: skip
        if replay_budget_ms is not None:
            body["replay_budget_ms"] = replay_budget_ms
        limits = (("threshold", threshold), ("budget_bytes", budget_bytes))
        sources = (("graph_id", graph_id), ("graph", graph), ("model", model), ("config", config))
        for key, value in (*sources, *limits):
            if value is not None:
                body[key] = value
        return self._call("POST", "/predict", json=body)

    def explain(self, **body: Any) -> dict[str, Any]:
        """POST /explain with the fields of `serving.explaining.ExplainIn`."""
        return self._call("POST", "/explain", json=body)

    def plan(self, **body: Any) -> dict[str, Any]:
        """POST /plan with the fields of `serving.schemas.PlanRequest`."""
        return self._call("POST", "/plan", json=body)

    def add_sample(
        self,
        *,
        graph_id: str,
        sizes: dict[str, int],
        device: str,
        measured_peak_bytes: int,
        metric: str | None = None,
        scenario: str = "worst",
        key: str | None = None,
        source: str | None = None,
    ) -> dict[str, Any]:
        """Send a measured peak (bytes); `source` labels who measured (kept with it)."""
        body = {
            "graph_id": graph_id,
            "sizes": sizes,
            "device": device,
            "metric": metric,
            "scenario": scenario,
            "measured_peak_bytes": measured_peak_bytes,
            "key": key,
        }
        if source is not None:
            body["source"] = source
        return self._call("POST", "/samples", json=body)

    def samples(self, graph_id: str, **params: Any) -> dict[str, Any]:
        return self._call("GET", "/samples", params={"graph_id": graph_id, **params})

    def reload(self, model: str | None = None) -> dict[str, Any]:
        return self._call("POST", "/admin/reload", json={"model": model})


def model_body(
    model: str, model_args: dict[str, str] | None, task: str | None, train: Any
) -> dict[str, Any]:
    """The `model` object of a request (train: a TrainSpec, nested as answers show it, or
    a dict, nested or by flat option names)."""
    train_dict = train.to_dict() if hasattr(train, "to_dict") else dict(train or {})
    return {"spec": model, "model_args": dict(model_args or {}), "task": task, "train": train_dict}


def request_body(req: PredictRequest) -> dict[str, Any]:
    """The `/predict` body of the answer layer's request."""
    body: dict[str, Any] = {
        "configs": [dataclasses.asdict(c) for c in req.configs],
        "apply_correction": req.apply_correction,
        "method": req.method,
    }
    if req.replay_budget_ms is not None:
        body["replay_budget_ms"] = req.replay_budget_ms
    if req.run_config is not None:  # the file's text travels; only the explicit options
        rc = req.run_config.as_text()
        body["config"] = {"name": rc.name, "text": rc.text, "format": rc.format,
                          "adapter_config": rc.adapter_config}  # fmt: skip
        flat = req.train.flat()
        body["model"] = {"train": {k: flat[k] for k in sorted(req.explicit)}}
        if req.model is not None:
            body["model"] |= {"spec": req.model.spec, "model_args": dict(req.model.args),
                              "task": req.model.task}  # fmt: skip
    elif req.model is not None:
        body["model"] = model_body(req.model.spec, req.model.args, req.model.task, req.train)
    if req.graph_id is not None:
        body["graph_id"] = req.graph_id
    if req.graph is not None:
        body["graph"] = req.graph.content() | {"meta": req.graph.meta}
    if req.threshold is not None:
        body["threshold"] = req.threshold
    if req.budget is not None:
        body["budget_bytes"] = int(req.budget)
    return body


def remote_predict(
    url: str, req: PredictRequest, *, token: str | None = None, timeout: float = 300.0
) -> dict[str, Any]:
    """The first config's answer from the service at `url`: the document `memgnn predict
    --json` prints locally (`predictor.answer.types.Answer`), as the service sent it."""
    with MemgnnClient(url, token=token, timeout=timeout) as client:
        return client.predict(**request_body(req))["predictions"][0]


def remote_explain(
    url: str, req: Any, *, token: str | None = None, timeout: float = 1800.0
) -> dict[str, Any]:
    """`memgnn explain --url`: the answer layer's `ExplainRequest` asked of the service at
    `url` (the document `memgnn explain --json` prints locally)."""
    one = PredictRequest(model=req.model, train=req.train, graph_id=req.graph_id,
                         configs=[req.config], run_config=req.run_config,
                         explicit=req.explicit)  # fmt: skip
    body = request_body(one)
    body = {k: v for k, v in body.items() if k in ("model", "config", "graph_id")}
    body |= {"query": dataclasses.asdict(req.config), "top": req.top}
    if req.whatifs is not None:
        body["whatifs"] = list(req.whatifs)
    with MemgnnClient(url, token=token, timeout=timeout) as client:
        return client.explain(**body)


def remote_plan(
    url: str,
    *,
    model: str,
    model_args: dict[str, str] | None = None,
    task: str | None = None,
    train: Any = None,
    token: str | None = None,
    timeout: float = 600.0,
    **plan_fields: Any,
) -> dict[str, Any]:
    """POST /plan for a model SPEC; `plan_fields` are the other `PlanRequest` fields
    (budget_bytes or budget_fraction, device, metric, threshold, space, objective)."""
    with MemgnnClient(url, token=token, timeout=timeout) as client:
        return client.plan(model=model_body(model, model_args, task, train), **plan_fields)


# ---- a service inside this process ------------------------------------------------------


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@contextmanager
def local_server(
    config: ServeConfig,
    *,
    host: str = "127.0.0.1",
    port: int | None = None,
    timeout_s: float = 120.0,
) -> Iterator[str]:
    """Start the app on `host` (a free port unless given), yield its URL, stop it."""
    import uvicorn
    from memgnn.serving.app import create_app
    from memgnn.serving.server import GRACEFUL_S, Server

    port = port or free_port(host)
    app = create_app(config)
    server = Server(
        uvicorn.Config(
            app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=GRACEFUL_S
        ),
        app,
    )
    thread = threading.Thread(target=server.run, name="memgnn-serve", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not server.started:
        if not thread.is_alive():
            raise ValueError(f"the service did not start on {host}:{port} (see the log)")
        if time.monotonic() > deadline:
            server.should_exit = True
            raise ValueError(f"the service did not start on {host}:{port} in {timeout_s} s")
        time.sleep(0.05)
    url = f"http://{host}:{port}"
    log.info("service up at %s", url)
    try:
        yield url
    finally:
        if app.state.engine is not None:
            app.state.engine.close()  # a capture in flight does not hold the shutdown
        server.should_exit = True
        thread.join(timeout_s)


def service_round_trip(
    config: ServeConfig,
    *,
    model: str = "gpt2",
    model_args: dict[str, str] | None = None,
    sizes: dict[str, int] | None = None,
    device: str = "a100-80gb",
    budget_fraction: float = 0.5,
) -> dict:
    """Start the service on loopback, ask /predict and /plan about `model`, stop it: the
    answers ({"url", "predict", "plan"}) for a demo to print."""
    with local_server(config) as url:
        req = PredictRequest(
            model=ModelRef(spec=model, args=dict(model_args or {})),
            configs=[QueryConfig(sizes=dict(sizes or {}), device=device)],
        )
        predicted = remote_predict(url, req)
        other = {k: v for k, v in (sizes or {}).items() if k != "B"}
        planned = remote_plan(
            url,
            model=model,
            model_args=model_args,
            device=device,
            budget_fraction=budget_fraction,
            space={"sizes": other},
        )
    return {"url": url, "predict": predicted, "plan": planned}
