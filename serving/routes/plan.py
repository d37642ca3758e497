"""`POST /plan`: the best training configuration under a memory budget."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from serving import schemas as s
from serving.deps import Eng, Persist
from serving.planning import run_plan

router = APIRouter(tags=["plan"])


@router.post("/plan", response_model=s.PlanResponse)
def plan(req: s.PlanRequest, eng: Eng, persist: Persist) -> Any:
    """The best (B, G, checkpointing, precision) whose bound stays under budget x
    threshold, and the runners-up. Captured graphs are stored as /predict stores them."""
    return run_plan(eng, req, persist=persist)
