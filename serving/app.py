"""The HTTP API: `create_app(ServeConfig)` -> FastAPI (OpenAPI at /docs).

HTTP concerns only (status codes, auth, limits, metrics); the work is in
`serving.engine` / `serving.planning`, which raise ValueError (`RequestError` carries a
status and the field at fault) and never HTTPException.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import HTTPException
from fastapi.responses import JSONResponse, PlainTextResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from threadpoolctl import threadpool_limits

from dataset.devices import PROFILES
from predictor.predict import MemoryModel
from serving import schemas as s
from serving.config import ServeConfig
from serving.engine import Engine
from serving.graphs import RequestError, build_graph, decode_body, parse_json
from serving.metrics import CONTENT_TYPE, Metrics
from serving.models import load_model
from serving.predicting import run_predict
from serving.routes import snapshots
from serving.store import Store

log = logging.getLogger(__name__)

_bearer = HTTPBearer(auto_error=False, description="the server's token (write endpoints)")
_GRAPH_BODY = {
    "requestBody": {
        "required": True,
        "description": "a StepGraph: the `StepGraph.save` file (gzip JSON, or send "
        "`Content-Encoding: gzip`) or plain JSON",
        "content": {
            "application/json": {"schema": {"type": "object"}},
            "application/gzip": {"schema": {"type": "string", "format": "binary"}},
        },
    }
}


class LimitsAndMetrics:
    """Pure ASGI middleware: 413 for bodies over the limit (by Content-Length, or while
    reading a chunked body), and request counts / latencies per route template."""

    def __init__(self, app: ASGIApp, *, max_bytes: int, metrics: Metrics):
        self.app, self.max_bytes, self.metrics = app, max_bytes, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500
        for name, value in scope["headers"]:
            if name == b"content-length":
                if not value.isdigit() or int(value) > self.max_bytes:
                    status = 413 if value.isdigit() else 400
                    await self._reject(send, status)
                    self._observe(scope, status, start)
                    return
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:
                raise HTTPException(413, f"request body exceeds {self.max_bytes} bytes")
            return message

        async def watch(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, limited, watch)
        finally:
            self._observe(scope, status, start)

    async def _reject(self, send: Send, status: int) -> None:
        msg = (
            f"request body exceeds {self.max_bytes} bytes"
            if status == 413
            else "bad Content-Length"
        ).encode()
        body = b'{"detail":"' + msg + b'"}'
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    def _observe(self, scope: Scope, status: int, start: float) -> None:
        route = scope.get("route")
        endpoint = getattr(route, "path", None) or "unmatched"
        self.metrics.observe(endpoint, scope["method"], status, time.perf_counter() - start)


async def get_engine(request: Request) -> Engine:
    eng = request.app.state.engine
    if eng is None:
        raise HTTPException(503, "model not loaded")
    return eng


async def require_writer(
    request: Request,
    creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """Bearer-token check for write endpoints, when the server has a token."""
    token = request.app.state.config.token
    if token is None:
        return
    if creds is None:
        raise HTTPException(401, "bearer token required", {"WWW-Authenticate": "Bearer"})
    if not secrets.compare_digest(creds.credentials.encode(), token.encode()):
        raise HTTPException(403, "invalid token")


Eng = Annotated[Engine, Depends(get_engine)]


def _pairs(req: s.PredictRequest) -> list[tuple[str, str]]:
    """(device, metric) of each config, with the default metric of the device."""
    return (
        [
            (c.device, c.metric or ("reserved" if PROFILES[c.device].is_gpu else "allocated"))
            for c in req.configs
        ]
        if req.apply_correction
        else []
    )


def _error(status: int, loc: tuple, msg: str, kind: str = "value_error") -> JSONResponse:
    return JSONResponse({"detail": [{"loc": list(loc), "msg": msg, "type": kind}]}, status)


def create_app(config: ServeConfig, *, model: MemoryModel | None = None) -> FastAPI:
    """The service. `model`: serve this object instead of loading `config.model` (an
    in-process model, e.g. in a notebook or a test); reloads then keep it."""
    metrics = Metrics()

    def configured_model() -> MemoryModel:
        return model if model is not None else load_model(config.model)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        blas = threadpool_limits(limits=config.blas_threads, user_api="blas")
        store = await run_in_threadpool(Store, config.db_url, window=config.correction_window)
        try:
            loaded = await run_in_threadpool(configured_model)
            app.state.engine = Engine(config, store, loaded, metrics)
            log.info("serving model %s, database %s", loaded.version, store.engine.url)
            yield
        finally:
            app.state.engine = None
            store.close()
            blas.restore_original_limits()

    app = FastAPI(
        title="memgnn",
        version="1",
        lifespan=lifespan,
        summary="Peak-memory predictions for PyTorch training steps (all sizes in bytes)",
    )
    app.add_middleware(LimitsAndMetrics, max_bytes=config.max_request_bytes, metrics=metrics)
    app.state.engine = None
    app.state.config = config
    app.include_router(snapshots.router)

    @app.exception_handler(RequestError)
    async def _request_error(_: Request, exc: RequestError) -> JSONResponse:
        kind = {404: "not_found", 403: "forbidden", 413: "too_large"}.get(exc.status, "value_error")
        return _error(exc.status, exc.loc, str(exc), kind)

    @app.exception_handler(ValueError)
    async def _value_error(request: Request, exc: ValueError) -> JSONResponse:
        # library code raises ValueError for what the caller got wrong
        log.info("%s %s: 422: %s", request.method, request.url.path, exc)
        return _error(422, ("body",), str(exc))

    @app.post(
        "/graphs",
        response_model=s.GraphOut,
        status_code=201,
        openapi_extra=_GRAPH_BODY,
        responses={200: {"model": s.GraphOut, "description": "already stored"}},
    )
    async def upload_graph(request: Request, eng: Eng) -> Any:
        """Upload a StepGraph once; its id (content hash) is what /predict and /samples take.
        The encoder output is cached by id."""
        body = await request.body()

        def work() -> tuple[Any, bool]:
            raw = decode_body(
                body,
                request.headers.get("content-encoding"),
                max_bytes=config.max_decompressed_bytes,
            )
            graph = build_graph(parse_json(raw), max_nodes=config.max_nodes)
            return eng.register(graph, body)

        entry, stored = await run_in_threadpool(work)
        out = {
            "graph_id": entry.graph_id,
            "stored": stored,
            "nodes": entry.n_nodes,
            "paths": len(entry.graph.paths),
            "symbols": entry.graph.symbols,
            "unknown_ops": entry.unknown_ops,
            "has_unknown_ops": bool(entry.unknown_ops),
        }
        return JSONResponse(out, 201 if stored else 200)

    @app.post("/predict", response_model=s.PredictResponse)
    async def predict(req: s.PredictRequest, eng: Eng) -> Any:
        """Per config: predicted peak, upper bound, metric, breakdown, model version, with
        the residual correction from /samples applied (see `correction`)."""
        if len(req.configs) > config.max_configs:
            raise RequestError(
                f"{len(req.configs)} configs, over the limit of {config.max_configs}",
                status=413,
                loc=("body", "configs"),
            )
        if (
            req.graph_id is not None
            and getattr(eng.model, "thread_safe", False)
            and eng.is_warm(req.graph_id, _pairs(req))
        ):
            # all in memory, no lock to wait for: cheaper inline than a thread hop
            return run_predict(eng, req, max_nodes=config.max_nodes)
        return await run_in_threadpool(run_predict, eng, req, max_nodes=config.max_nodes)

    @app.post("/plan", response_model=s.PlanResponse)
    def plan_(req: s.PlanRequest, eng: Eng) -> Any:
        """The best (B, G, checkpointing, precision) whose bound stays under budget x
        threshold, and the runners-up."""
        from serving.planning import run_plan

        return run_plan(eng, req)

    @app.post("/samples", response_model=s.SampleOut, dependencies=[Depends(require_writer)])
    def add_sample(req: s.SampleIn, eng: Eng) -> Any:
        """Store a live measurement (committed before the reply); returns the residual
        correction /predict applies from now on for this graph, device and metric."""
        from predictor.predict import Query as Q

        query = Q(sizes=req.sizes, device=req.device, metric=req.metric, scenario=req.scenario)
        row, created, raw, corr = eng.add_sample(
            graph_id=req.graph_id, query=query, measured_bytes=req.measured_peak_bytes, key=req.key
        )
        return {
            "stored": created,
            "sample_id": row,
            "graph_id": req.graph_id,
            "device": req.device,
            "metric": raw.metric,
            "model_version": raw.model_version,
            "predicted_peak_bytes": raw.predicted_peak_bytes,
            "upper_bound_bytes": raw.upper_bound_bytes,
            "correction": corr.to_dict(),
        }

    @app.get("/samples", response_model=s.SamplesOut)
    def list_samples(
        eng: Eng,
        graph_id: Annotated[str, Query(pattern=r"^[0-9a-f]{8,64}$")],
        device: Annotated[s.Device | None, Query()] = None,
        metric: Annotated[s.Metric | None, Query()] = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    ) -> Any:
        """The most recent samples of a graph, and the correction for (device, metric)."""
        corr = None
        if device is not None and metric is not None:
            corr = eng.store.correction(graph_id, device, metric, eng.version).to_dict()
        return {
            "graph_id": graph_id,
            "device": device,
            "metric": metric,
            "correction": corr,
            "samples": eng.store.samples(graph_id, device, metric, limit),
        }

    @app.post("/admin/reload", dependencies=[Depends(require_writer)])
    def reload(eng: Eng, req: s.ReloadIn | None = None) -> dict[str, Any]:
        """Load the model again (a new export, a moved registry alias) and swap it in."""
        old = eng.version
        if req is not None and req.model is not None:
            if config.token is None:
                raise RequestError(
                    "loading another model needs a server token", status=403, loc=("body", "model")
                )
            eng.set_model(load_model(req.model))
        else:
            eng.set_model(configured_model())
        return {"previous_version": old, "model_version": eng.version}

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        """The process answers."""
        return {"status": "ok"}

    @app.get("/readyz")
    def readyz(request: Request) -> JSONResponse:
        """Ready: the model is loaded and the database answers."""
        eng = request.app.state.engine
        ready = eng is not None and eng.store.ping()
        body = {"ready": ready, "model_version": eng.version if eng is not None else None}
        return JSONResponse(body, 200 if ready else 503)

    @app.get("/metrics", response_class=PlainTextResponse)
    def metrics_(request: Request) -> PlainTextResponse:
        """Prometheus text exposition."""
        eng = request.app.state.engine
        gauges: dict[str, tuple[str, float, dict[str, str]]] = {
            "ready": ("1 when the model is loaded.", float(eng is not None), {}),
        }
        if eng is not None:
            gauges["model_info"] = ("The served model's version.", 1.0, {"version": eng.version})
            gauges["graphs_cached"] = (
                "Graphs in this process's cache.",
                float(eng.cached_graphs()),
                {},
            )
            try:
                gauges["samples_stored"] = (
                    "Samples in the database.",
                    float(eng.store.count_samples()),
                    {},
                )
            except Exception as exc:  # a scrape must not fail on a database hiccup
                log.warning("cannot count samples: %s", exc)
        return PlainTextResponse(metrics.render(gauges), media_type=CONTENT_TYPE)

    return app


def app_from_env() -> FastAPI:
    """uvicorn factory for worker processes (`serving.app:app_from_env`, factory=True)."""
    return create_app(ServeConfig.from_env())


__all__ = ["app_from_env", "create_app"]
