"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from memgnn.serving.metrics import CONTENT_TYPE

log = logging.getLogger(__name__)

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz(request: Request) -> dict[str, Any]:
    """The process answers; `replay_jit`: the exact replay's compile state (cold, warming,
    warm, failed; while not warm, `method: auto` is answered by the model)."""
    return {"status": "ok", "replay_jit": request.app.state.replay.to_dict()}


@router.get("/readyz")
def readyz(request: Request) -> JSONResponse:
    """Ready: the model is loaded and the database answers."""
    eng = request.app.state.engine
    ready = eng is not None and eng.store.ping()
    body = {"ready": ready, "model_version": eng.version if eng is not None else None}
    return JSONResponse(body, 200 if ready else 503)


@router.get("/metrics", response_class=PlainTextResponse)
def metrics(request: Request) -> PlainTextResponse:
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
            count = float(eng.store.count_samples())
            gauges["samples_stored"] = ("Samples in the database.", count, {})
        except Exception as exc:  # a scrape must not fail on a database hiccup
            log.warning("cannot count samples: %s", exc)
    text = request.app.state.metrics.render(gauges)
    return PlainTextResponse(text, media_type=CONTENT_TYPE)
