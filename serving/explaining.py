"""`/explain`: the validated HTTP request as the answer layer's `ExplainRequest`, answered
by `predictor.answer.explain` on the engine (`serving.answers.EngineBackend`, replaying:
every figure is the simulator's, the same as `memgnn explain` prints locally)."""

from __future__ import annotations

from typing import Any, Literal

from memgnn.predictor.answer.explain import MAX_TOP, ExplainRequest, explain
from memgnn.predictor.answer.types import QueryConfig
from memgnn.predictor.answer.whatif import WHATIFS
from memgnn.serving.answers import EngineBackend
from memgnn.serving.captures import Work
from memgnn.serving.engine import Engine
from memgnn.serving.predicting import model_parts
from memgnn.serving.routing import Route
from memgnn.serving.schemas import ConfigFileIn, ConfigIn, GraphId, ModelIn, Strict
from pydantic import Field, model_validator

__all__ = ["ExplainIn", "run_explain", "to_explain_request"]


class ExplainIn(Strict):
    """Exactly one of `model` (captured on the server, then cached), a `config` file, or
    `graph_id` (uploaded: the peak is explained, but only the allocator what-if runs: the
    others need the model captured again); one `query` (sizes, device, metric,
    scenario). `whatifs`: which to answer (default all; [] none), `top`: rows per table."""

    graph_id: GraphId | None = None
    model: ModelIn | None = None
    config: ConfigFileIn | None = None
    query: ConfigIn = Field(default_factory=ConfigIn)
    top: int = Field(default=15, ge=1, le=MAX_TOP)
    whatifs: list[Literal[WHATIFS]] | None = Field(default=None, max_length=len(WHATIFS))  # type: ignore[valid-type]

    @model_validator(mode="after")
    def _one_source(self) -> ExplainIn:
        given = ["graph_id"] if self.graph_id is not None else []
        if self.model is not None or self.config is not None:
            given.append("model" if self.model is not None else "config")
        if len(given) != 1:
            raise ValueError(f"give exactly one of graph_id, model (got {given or 'none'})")
        if self.model is not None and self.model.spec is None and self.config is None:
            raise ValueError("model.spec is required without a config file that names the model")
        return self


def to_explain_request(req: ExplainIn) -> ExplainRequest:
    """The answer layer's request for a validated `ExplainIn`."""
    model, train, explicit = model_parts(req.model)
    q = req.query
    return ExplainRequest(
        model=model,
        train=train,
        graph_id=req.graph_id,
        config=QueryConfig(
            sizes=dict(q.sizes), device=q.device, metric=q.metric, scenario=q.scenario
        ),  # fmt: skip
        top=req.top,
        whatifs=None if req.whatifs is None else tuple(req.whatifs),
        run_config=req.config.to_run_config() if req.config is not None else None,
        explicit=explicit,
    )


def run_explain(
    engine: Engine, req: ExplainIn, *, persist: bool = False, work: Work | None = None,
    route: Route | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Answer a validated `ExplainIn`; `persist`: store captured graphs in the database;
    `work`: the request's capture budget; `route`: its replay warm-up."""
    route = route or Route(method="replay", budget_ms=engine.config.replay_budget_ms)
    backend = EngineBackend(engine, route=route, persist=persist, work=work, correct=False)
    return explain(to_explain_request(req), backend).to_dict()
