"""`POST /predict`: peak-memory predictions for configs of one graph source."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from memgnn.predictor.spec.devices import get_profile
from memgnn.serving import schemas as s
from memgnn.serving.deps import Config, Eng, NewWork, Persist, run_watched
from memgnn.serving.graphs import RequestError
from memgnn.serving.predicting import run_predict
from memgnn.serving.routing import Route, choose

router = APIRouter(tags=["predict"])


def route_of(req: s.PredictRequest | s.PlanRequest, request: Request) -> Route:
    """The request's `method` and `replay_budget_ms` (default: the server's budget)."""
    config = request.app.state.config
    budget = req.replay_budget_ms
    return Route(
        method=req.method,
        budget_ms=config.replay_budget_ms if budget is None else budget,
        warmup=request.app.state.replay,
        wait_s=config.replay_wait_s,
    )


def _pairs(req: s.PredictRequest) -> list[tuple[str, str]]:
    """(device, metric) of each config, with the default metric of the device."""
    if not req.apply_correction:
        return []
    return [
        (c.device, c.metric or ("reserved" if get_profile(c.device).is_gpu else "allocated"))
        for c in req.configs
    ]


@router.post("/predict", response_model=s.PredictResponse)
async def predict(
    req: s.PredictRequest,
    eng: Eng,
    config: Config,
    persist: Persist,
    work: NewWork,
    request: Request,
) -> Any:
    """Per config: predicted peak, upper bound, metric, breakdown, model version and
    `method` (replay | gnn | analytic: `method` auto replays the schedule exactly when
    its estimate fits `replay_budget_ms`, else asks the model), with the residual
    correction from /samples applied to the model's answers (see `correction`). An inline `graph`
    or a captured `model` is stored in the database only for a caller who may write
    (else it is cached in this process's memory)."""
    if len(req.configs) > config.max_configs:
        raise RequestError(
            f"{len(req.configs)} configs, over the limit of {config.max_configs}",
            status=413,
            loc=("body", "configs"),
        )
    route = route_of(req, request)
    if (
        req.graph_id is not None
        and req.method in ("auto", "gnn")
        and eng.thread_safe
        and eng.is_warm(req.graph_id, _pairs(req))
        and choose(route, eng.entry(req.graph_id)).method == "gnn"
    ):
        # all in memory, no lock to wait for, no replay: cheaper inline than a thread hop
        return run_predict(eng, req, max_nodes=config.max_nodes, route=route)
    if req.model is None:
        return await run_in_threadpool(
            run_predict, eng, req, max_nodes=config.max_nodes, persist=persist, route=route
        )
    return await run_watched(
        request,
        work,
        run_predict,
        eng,
        req,
        max_nodes=config.max_nodes,
        persist=persist,
        route=route,
    )
