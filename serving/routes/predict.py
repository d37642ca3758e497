"""`POST /predict`: peak-memory predictions for configs of one graph source."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from memgnn.predictor.devices import PROFILES
from memgnn.serving import schemas as s
from memgnn.serving.deps import Config, Eng, NewWork, Persist, run_watched
from memgnn.serving.graphs import RequestError
from memgnn.serving.predicting import run_predict

router = APIRouter(tags=["predict"])


def _pairs(req: s.PredictRequest) -> list[tuple[str, str]]:
    """(device, metric) of each config, with the default metric of the device."""
    if not req.apply_correction:
        return []
    return [
        (c.device, c.metric or ("reserved" if PROFILES[c.device].is_gpu else "allocated"))
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
    """Per config: predicted peak, upper bound, metric, breakdown, model version, with
    the residual correction from /samples applied (see `correction`). An inline `graph`
    or a captured `model` is stored in the database only for a caller who may write
    (else it is cached in this process's memory)."""
    if len(req.configs) > config.max_configs:
        raise RequestError(
            f"{len(req.configs)} configs, over the limit of {config.max_configs}",
            status=413,
            loc=("body", "configs"),
        )
    if req.graph_id is not None and eng.thread_safe and eng.is_warm(req.graph_id, _pairs(req)):
        # all in memory, no lock to wait for: cheaper inline than a thread hop
        return run_predict(eng, req, max_nodes=config.max_nodes)
    if req.model is None:
        return await run_in_threadpool(
            run_predict, eng, req, max_nodes=config.max_nodes, persist=persist
        )
    return await run_watched(
        request, work, run_predict, eng, req, max_nodes=config.max_nodes, persist=persist
    )
