"""`POST /explain`: what is live at a training step's simulated peak (by module path,
source line, aten op and category; the largest tensors and why each is alive), and what
each change would save, each replayed (`predictor.answer.explain`)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from memgnn.serving.deps import Config, Eng, NewWork, Persist, run_watched
from memgnn.serving.explaining import ExplainIn, run_explain
from memgnn.serving.routing import Route

router = APIRouter(tags=["explain"])


@router.post("/explain")
async def explain(
    req: ExplainIn, eng: Eng, config: Config, persist: Persist, work: NewWork, request: Request
) -> Any:
    """The document `memgnn explain --json` prints: `prediction` (the replayed answer),
    `peak`, `by_category`, `by_module`, `by_source`, `by_op`, `largest`, `whatifs` (each a
    replay of the changed run, by bytes saved), `not_applicable`, `assumptions` and
    `timeline` (allocated and reserved bytes over the replayed step's events, with its
    phase spans; null on the CPU). A captured `model` is
    stored as /predict stores it (in the database only for a caller who may write)."""
    route = Route(method="replay", budget_ms=config.replay_budget_ms,
                  warmup=request.app.state.replay, wait_s=config.replay_wait_s)  # fmt: skip
    if req.model is None and req.config is None:
        return await run_in_threadpool(run_explain, eng, req, persist=persist, route=route)
    return await run_watched(request, work, run_explain, eng, req, persist=persist, route=route)
