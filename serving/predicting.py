"""`/predict`: the validated HTTP request as the answer layer's `PredictRequest`, answered
by `predictor.answer.predict` on the engine (`serving.answers.EngineBackend`)."""

from __future__ import annotations

from typing import Any

from memgnn.predictor.answer.predict import predict
from memgnn.predictor.answer.types import ModelRef, PredictRequest, QueryConfig
from memgnn.predictor.spec.train import TrainSpec
from memgnn.serving.answers import EngineBackend
from memgnn.serving.captures import Work
from memgnn.serving.engine import Engine
from memgnn.serving.graphs import RequestError, build_graph
from memgnn.serving.routing import Route

__all__ = ["model_parts", "run_predict", "to_request"]


def model_parts(model: Any) -> tuple[ModelRef | None, TrainSpec, frozenset[str]]:
    """A request's validated `model` object (`serving.schemas.ModelIn`, or None) as the
    answer layer takes it: the model named (None: an uploaded graph's or a config file's),
    its training spec (the default without one) and the options the caller set."""
    if model is None:
        return None, TrainSpec(), frozenset()
    ref = None
    if model.spec is not None:
        ref = ModelRef(spec=model.spec, args=model.args(), task=model.task)
    try:
        train = model.train.to_spec()
    except ValueError as exc:
        raise RequestError(str(exc), loc=("body", "model", "train")) from None
    return ref, train, model.explicit()


def to_request(req: Any, *, max_nodes: int) -> PredictRequest:
    """A validated `serving.schemas.PredictRequest` as the answer layer's request (an
    inline graph checked and built here: untrusted input)."""
    model, train, explicit = model_parts(req.model)
    graph = None
    if req.graph is not None:
        graph = build_graph(req.graph, max_nodes=max_nodes, loc=("body", "graph"))
    return PredictRequest(
        configs=[
            QueryConfig(sizes=dict(c.sizes), device=c.device, metric=c.metric, scenario=c.scenario)
            for c in req.configs
        ],
        model=model,
        train=train,
        graph_id=req.graph_id,
        graph=graph,
        method=req.method,
        replay_budget_ms=req.replay_budget_ms,
        apply_correction=req.apply_correction,
        budget=req.budget_bytes,
        threshold=req.threshold,
        run_config=req.config.to_run_config() if req.config is not None else None,
        explicit=explicit,
    )


def run_predict(
    engine: Engine,
    req: Any,
    *,
    max_nodes: int,
    persist: bool = False,
    work: Work | None = None,
    route: Route | None = None,
) -> dict[str, Any]:
    """Answer a validated `PredictRequest` (see `serving.schemas`); `persist`: store
    inline or captured graphs in the database (else only in the memory cache); `work`:
    the request's capture budget (`serving.captures.Work`); `route`: which path answers
    (`serving.routing`; None: the served model)."""
    route = route or Route(method="gnn", budget_ms=engine.config.replay_budget_ms)
    backend = EngineBackend(engine, route=route, persist=persist, work=work,
                            max_nodes=max_nodes, correct=req.apply_correction)  # fmt: skip
    return predict(to_request(req, max_nodes=max_nodes), backend).to_dict()
