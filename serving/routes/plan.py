"""`POST /plan`: the best training configuration under a memory budget."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from memgnn.serving import schemas as s
from memgnn.serving.deps import Eng, NewWork, Persist, run_watched
from memgnn.serving.planning import run_plan
from memgnn.serving.routes.predict import route_of

router = APIRouter(tags=["plan"])


@router.post("/plan", response_model=s.PlanResponse)
async def plan(
    req: s.PlanRequest, eng: Eng, persist: Persist, work: NewWork, request: Request
) -> Any:
    """The best (B, G, checkpointing, precision) whose bound stays under budget x
    threshold, and the runners-up. Captured graphs are stored as /predict stores them.
    `method` auto (default): the steps near the limit are decided by the exact replay
    when one fits `replay_budget_ms`; the answer's `method` says what decided them."""
    route = route_of(req, request)
    if req.model is None:
        return await run_in_threadpool(run_plan, eng, req, persist=persist, route=route)
    return await run_watched(request, work, run_plan, eng, req, persist=persist, route=route)
