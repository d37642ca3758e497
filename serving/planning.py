"""`/plan`: the validated HTTP request as the answer layer's `PlanRequest`, answered by
`predictor.answer.plan` on the engine (`serving.answers.EngineBackend`: the served model
with its live corrections screens, the route decides the steps near the limit)."""

from __future__ import annotations

from typing import Any

from memgnn.predictor.answer.plan import PlanRequest, plan
from memgnn.serving.answers import EngineBackend
from memgnn.serving.captures import Work
from memgnn.serving.engine import Engine
from memgnn.serving.predicting import model_parts
from memgnn.serving.routing import Route

__all__ = ["run_plan", "to_plan_request"]


def to_plan_request(req: Any) -> PlanRequest:
    """A validated `serving.schemas.PlanRequest` as the answer layer's request: the
    search space's fields the caller set (the rest take the layer's defaults)."""
    model, train, explicit = model_parts(req.model)
    return PlanRequest(
        model=model,
        train=train,
        graph_ids=req.graph_ids,
        budget=req.budget_bytes,
        budget_fraction=req.budget_fraction,
        threshold=req.threshold,
        device=req.device,
        metric=req.metric,
        use_upper_bound=req.use_upper_bound,
        space=req.space.model_dump(exclude_unset=True),
        objective=req.objective,
        top=req.top,
        method=req.method,
        replay_budget_ms=req.replay_budget_ms,
        apply_correction=req.apply_correction,
        run_config=req.config.to_run_config() if req.config is not None else None,
        explicit=explicit,
    )


def run_plan(
    engine: Engine,
    req: Any,
    *,
    persist: bool = False,
    work: Work | None = None,
    route: Route | None = None,
) -> dict[str, Any]:
    """Answer a validated `PlanRequest` (see `serving.schemas`); `route`: which path
    decides the steps near the limit (`serving.routing.plan_exact`; None: the model)."""
    route = route or Route(method="gnn", budget_ms=engine.config.replay_budget_ms)
    backend = EngineBackend(engine, route=route, persist=persist, work=work,
                            correct=req.apply_correction)  # fmt: skip
    return plan(to_plan_request(req), backend).to_dict()
