"""`POST /plan`: the best training configuration under a memory budget."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from memgnn.serving import schemas as s
from memgnn.serving.deps import Eng, NewWork, Persist, run_watched
from memgnn.serving.planning import run_plan

router = APIRouter(tags=["plan"])


@router.post("/plan", response_model=s.PlanResponse)
async def plan(
    req: s.PlanRequest, eng: Eng, persist: Persist, work: NewWork, request: Request
) -> Any:
    """The best (B, G, checkpointing, precision) whose bound stays under budget x
    threshold, and the runners-up. Captured graphs are stored as /predict stores them."""
    if req.model is None:
        return await run_in_threadpool(run_plan, eng, req, persist=persist)
    return await run_watched(request, work, run_plan, eng, req, persist=persist)
