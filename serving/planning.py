"""`/plan` on the engine: `predictor.plan.search.plan` over the served model (cached encodings,
residual corrections), on graphs captured from a model SPEC or uploaded per variant."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from memgnn.predictor.answer.types import GraphEntry
from memgnn.predictor.ir.graph import StepGraph
from memgnn.predictor.memory.analytic import AnalyticModel
from memgnn.predictor.memory.base import Prediction, Query
from memgnn.predictor.plan.search import Candidate, PlanConfig, plan
from memgnn.predictor.plan.space import SearchSpace, capture_spec
from memgnn.predictor.plan.space import variants as plan_variants
from memgnn.predictor.spec.bundle import ModelBundle, default_blocks
from memgnn.predictor.spec.devices import DeviceProfile, get_profile
from memgnn.predictor.spec.limits import resolve_limit
from memgnn.predictor.spec.train import TrainSpec
from memgnn.serving.captures import Work
from memgnn.serving.engine import Engine
from memgnn.serving.graphs import RequestError
from memgnn.serving.routing import Route, plan_exact

log = logging.getLogger(__name__)


class EngineModel:
    """A `MemoryModel` over the engine: the graphs it is asked about are entries it knows."""

    def __init__(self, engine: Engine, *, correct: bool):
        self.engine, self.correct = engine, correct
        self.version = engine.version
        self.entries: dict[int, GraphEntry] = {}
        self.variant_ids: dict[tuple[str, str, bool], str] = {}  # variant -> graph id

    def add(self, entry: GraphEntry, variant: tuple[str, str, bool]) -> StepGraph:
        self.entries[id(entry.graph)] = entry
        self.variant_ids.setdefault(variant, entry.graph_id)
        return entry.graph

    def predict(self, graph: StepGraph, queries: Sequence[Query]) -> list[Prediction]:
        served = self.engine.predict(self.entries[id(graph)], queries, correct=self.correct)
        return [s.prediction for s in served]


def _variant(train: TrainSpec) -> tuple[str, str, bool]:
    # G = 1 and G >= 2 are different graphs (accumulation keeps gradients alive)
    return train.numerics.precision, train.activations.checkpointing, train.loop.grad_accum > 1


def spec_graphs(
    engine: Engine,
    adapter: EngineModel,
    bundle: ModelBundle,
    device: DeviceProfile,
    sizes: dict[str, int],
    *,
    spec: tuple[str, dict[str, str], str | None],
    persist: bool,
    work: Work | None,
) -> Callable[[TrainSpec], StepGraph]:
    target = "cuda" if device.is_gpu else "cpu"

    def graph_for(train: TrainSpec) -> StepGraph:
        entry = engine.spec_entry(
            bundle,
            train,
            spec=spec,
            target=target,
            sm=device.sm or 80,
            sizes=sizes,
            persist=persist,
            work=work,
        )
        return adapter.add(entry, _variant(train))

    return graph_for


def uploaded_graphs(
    engine: Engine, adapter: EngineModel, graph_ids: list[str]
) -> tuple[TrainSpec, dict[tuple[str, str, bool], StepGraph]]:
    """(base TrainSpec, variant -> graph) from uploaded graphs' train records."""
    variants: dict[tuple[str, str, bool], StepGraph] = {}
    base: TrainSpec | None = None
    for i, gid in enumerate(graph_ids):
        try:
            entry = engine.entry(gid)
        except RequestError as exc:
            raise RequestError(str(exc), status=exc.status, loc=("body", "graph_ids", i)) from None
        try:
            train = TrainSpec.of(**entry.graph.train)
        except (TypeError, ValueError) as exc:
            raise RequestError(
                f"graph {gid} has no usable training spec: {exc}", loc=("body", "graph_ids", i)
            ) from None
        base = base or train
        if _variant(train) not in variants:
            variants[_variant(train)] = adapter.add(entry, _variant(train))
    assert base is not None
    return base, variants


def _count_blocks(bundle: ModelBundle) -> int | None:
    """Checkpointable blocks of the model, built on the meta device (no weights)."""
    import torch

    try:
        with torch.device("meta"):
            module = bundle.build()
        return len((bundle.blocks or default_blocks)(module))
    except Exception as exc:  # building the module is the model's own code
        log.warning("cannot count blocks of %s: %s", bundle.name, exc)
        return None


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
    device = get_profile(req.device)
    adapter = EngineModel(engine, correct=req.apply_correction)
    space_fields = req.space.model_dump()
    n_blocks = None
    if req.model is not None:
        bundle = engine.bundle(req.model.spec, req.model.args(), req.model.task)
        if "B" not in bundle.dims:
            raise RequestError(
                f"model {bundle.name!r} has no batch dim B to plan", loc=("body", "model", "spec")
            )
        try:
            base = req.model.train.to_spec()
        except ValueError as exc:
            raise RequestError(str(exc), loc=("body", "model", "train")) from None
        try:
            sizes = bundle.sizes({k: v for k, v in req.space.sizes.items()})
        except ValueError as exc:
            raise RequestError(str(exc), loc=("body", "space", "sizes")) from None
        space_fields["sizes"] = {k: v for k, v in sizes.items() if k != "B"}
        try:
            trains = plan_variants(base, SearchSpace(**space_fields))
        except ValueError as exc:
            raise RequestError(str(exc), loc=("body", "space")) from None
        captures = len({repr(capture_spec(t).flat()) for t in trains})
        limit = engine.config.max_captures_per_request
        if captures > limit:  # each is a graph to capture: refuse before any
            raise RequestError(
                f"the search space spans {captures} captures (precision x checkpointing x "
                f"accumulation x optimizer implementation x sharding and GPUs); this server "
                f"captures at most {limit} per request (max_captures_per_request)",
                status=413,
                loc=("body", "space"),
            )
        m = req.model
        graph_for = spec_graphs(
            engine,
            adapter,
            bundle,
            device,
            sizes,
            spec=(m.spec, m.args(), m.task),
            persist=persist,
            work=work,
        )
        n_blocks = _count_blocks(bundle)
    else:
        for name in ("optimizer_impl", "sharding", "gpus"):
            if space_fields[name]:  # an uploaded graph is one of each: nothing to search
                raise RequestError(
                    f"space.{name} needs a model to capture; uploaded graphs are planned "
                    "as they were captured",
                    loc=("body", "space", name),
                )
        base, variants = uploaded_graphs(engine, adapter, req.graph_ids)
        unset = {"precision", "checkpointing"} - req.space.model_fields_set
        for name, idx in (("precision", 0), ("checkpointing", 1)):
            if name in unset:
                space_fields[name] = sorted({v[idx] for v in variants})
        if "grad_accum" not in req.space.model_fields_set:
            space_fields["grad_accum"] = sorted({1 if not v[2] else 2 for v in variants})

        def graph_for(train: TrainSpec) -> StepGraph:
            graph = variants.get(_variant(train))
            if graph is None:
                raise RequestError(
                    f"no uploaded graph for precision={train.numerics.precision}, checkpointing="
                    f"{train.activations.checkpointing}, "
                    f"grad_accum {'>1' if train.loop.grad_accum > 1 else '1'}",
                    loc=("body", "graph_ids"),
                )
            return graph

    for p in space_fields["precision"]:
        try:
            device.check_precision(p)
        except ValueError as exc:
            raise RequestError(str(exc), loc=("body", "space", "precision")) from None
    try:
        space = SearchSpace(**space_fields)
        budget = req.budget_bytes
        if req.budget_fraction is not None:  # a budget of that share of the device
            budget = int(device.total_bytes * req.budget_fraction)
        limit = resolve_limit(
            budget=budget,
            threshold=req.threshold,
            device_total=device.total_bytes,
            device=device.name,
            names=("budget_bytes", "threshold"),
            required=True,
        )
        assert limit is not None
        cfg = PlanConfig(
            budget_bytes=limit.budget_bytes,
            device=device.name,
            metric=req.metric,
            threshold=limit.threshold,
            use_upper_bound=req.use_upper_bound,
        )
    except ValueError as exc:
        raise RequestError(str(exc), loc=("body",)) from None
    model, exact, method, skipped = adapter, None, "gnn", None
    if route is not None and route.method == "analytic":
        model, method = AnalyticModel(), "analytic"
    elif route is not None:
        first = plan_variants(base, space)[0]  # the graph the route's cost is judged on
        probe = adapter.entries[id(graph_for(first))]  # fmt: skip
        exact, method, skipped = plan_exact(route, probe, device.is_gpu)
    try:
        result = plan(model, graph_for, base, space, cfg, n_blocks=n_blocks, top=1000,
                      exact=exact)  # fmt: skip
    except RequestError as exc:
        if "configs" in exc.loc:  # a probe overflowed: the batch range is too large
            raise RequestError(str(exc), loc=("body", "space", "max_batch")) from None
        raise
    candidates = [c for c in [result.best, *result.runners_up] if c is not None]
    if req.objective == "effective_batch":
        candidates.sort(key=lambda c: (-c.batch_size * c.grad_accum, -c.objective, c.bound_bytes))

    def out(c: Candidate) -> dict[str, Any]:
        variant = (c.precision, c.checkpointing, c.grad_accum > 1)  # uploaded graphs' key
        return c.to_dict() | {
            "limit_bytes": cfg.limit,
            "under_threshold": c.bound_bytes <= cfg.limit,
            "graph_id": adapter.variant_ids.get(variant, ""),
        }

    return {
        "best": out(candidates[0]) if candidates else None,
        "runners_up": [out(c) for c in candidates[1 : req.top]],
        "budget_bytes": cfg.budget_bytes,
        "limit_bytes": cfg.limit,
        "threshold": cfg.threshold,
        "objective": req.objective,
        "queries": result.queries,
        "graphs": result.graphs,
        "variants": result.variants,
        "reason": result.reason,
        "model_version": model.version,
        "method": method,
        "replay_skipped": skipped,
    }
