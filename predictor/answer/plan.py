"""`plan(PlanRequest, backend) -> PlanAnswer`: the best training configuration under a
memory limit, the one place `memgnn plan` and `POST /plan` are answered.

The search (`predictor.plan.search.plan`) runs over batch, accumulation, checkpointing,
precision, optimizer implementation, sharding and GPU count, on graphs the backend
captures (a model SPEC) or has stored (uploaded graphs, one per training variant). The
learned model screens every batch; near the limit the exact replay decides where the
route allows it (`backend.plan_route`). The answer is the chosen configuration with the
numbers a user reasons with (`predictor.plan.decision`: state bytes, activation bytes per
sample, the straight-line largest batch), the runners-up, and what it assumed (`model`,
`train`).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any

from memgnn.predictor.answer.backend import Backend
from memgnn.predictor.answer.predict import model_info
from memgnn.predictor.answer.runconfig import RunConfig, apply_run_config
from memgnn.predictor.answer.types import GraphEntry, ModelRef
from memgnn.predictor.errors import LimitExceeded, UserError
from memgnn.predictor.ir.graph import StepGraph
from memgnn.predictor.ir.vocab import METHOD_CHOICES
from memgnn.predictor.memory.analytic import AnalyticModel
from memgnn.predictor.plan.search import Candidate, PlanConfig
from memgnn.predictor.plan.search import plan as search
from memgnn.predictor.plan.space import SearchSpace, capture_key, capture_spec, variants
from memgnn.predictor.spec.devices import get_profile
from memgnn.predictor.spec.limits import resolve_limit
from memgnn.predictor.spec.train import TrainSpec

__all__ = ["OBJECTIVES", "PlanAnswer", "PlanRequest", "plan"]

OBJECTIVES = ("throughput", "effective_batch")
# the search-space fields a request may set (`SearchSpace`'s), the variant key of an
# uploaded graph: (precision, checkpointing, accumulates)
_SPACE = {f.name for f in dataclasses.fields(SearchSpace)}


@dataclass(kw_only=True, slots=True)
class PlanRequest:
    """Exactly one of `model` (with `train`, the base the search varies) or `graph_ids`
    (uploaded graphs, one per training variant); exactly one limit: `budget` (bytes, or
    text as `parse_budget` reads it), `budget_fraction` (a budget of that share of the
    device) or `threshold` (the fraction of the device's memory the bound may reach).
    `space`: the `SearchSpace` fields the user set (the rest: the defaults, or for
    uploaded graphs what they were captured with). Objective `throughput`: the largest
    B*G per unit of recompute/precision/communication cost; `effective_batch`: the
    largest B*G."""

    model: ModelRef | None = None
    train: TrainSpec = field(default_factory=TrainSpec)
    graph_ids: list[str] | None = None
    budget: int | str | None = None
    budget_fraction: float | None = None
    threshold: float | None = None
    device: str = "h100-80gb"
    metric: str | None = None
    use_upper_bound: bool = True
    space: dict[str, Any] = field(default_factory=dict)
    objective: str = "throughput"
    top: int = 5
    method: str = "auto"
    replay_budget_ms: float | None = None
    apply_correction: bool = True
    run_config: RunConfig | None = None  # a framework's config file (`answer.runconfig`)
    explicit: frozenset[str] = frozenset()  # the options the caller set (over the file's)

    def __post_init__(self) -> None:
        has_model = self.model is not None or self.run_config is not None
        if has_model == (self.graph_ids is not None):
            raise UserError("give exactly one of model (or a config file), graph_ids")
        given = [n for n in ("budget", "budget_fraction", "threshold") if getattr(self, n)]
        if len(given) != 1:
            raise UserError(
                "give exactly one of budget, threshold, budget_fraction, got "
                f"{' and '.join(given) or 'none'}"
            )
        if unknown := set(self.space) - _SPACE:
            raise UserError(f"unknown search-space fields {sorted(unknown)}", loc=("space",))
        if self.objective not in OBJECTIVES:
            raise UserError(f"objective must be one of {OBJECTIVES}", loc=("objective",))
        if self.method not in METHOD_CHOICES:
            raise UserError(f"unknown method {self.method!r}; expected {METHOD_CHOICES}")
        if self.top < 1:
            raise UserError("top must be >= 1", loc=("top",))


@dataclass(kw_only=True, slots=True)
class PlanAnswer:
    """The chosen configuration (None where nothing fits: `reason` says why) and its
    runners-up, each a candidate dict (B, G, checkpointing, precision, optimizer
    implementation, GPUs, sharding, objective, bound, the prediction, the decision)."""

    best: dict[str, Any] | None
    runners_up: list[dict[str, Any]]
    budget_bytes: int
    limit_bytes: int
    threshold: float
    objective: str
    queries: int
    graphs: int
    variants: int
    reason: str
    model_version: str
    method: str
    replay_skipped: str | None
    model: dict[str, Any] | None
    train: dict[str, Any] | None
    graph_seconds: list[float]
    config: dict[str, Any] | None = None  # what a framework config file said
    left_out: list[str] = field(default_factory=list)  # refused by the spec or the capture, why

    def to_dict(self) -> dict[str, Any]:
        """The answer, with the chosen configuration's fields at the top as well (the
        CLI's `plan --json` contract)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        b = self.best
        chosen = ("batch_size", "grad_accum", "checkpointing", "precision", "optimizer_impl",
                  "gpus", "sharding", "tp", "pp", "pp_schedule", "microbatches", "stage_peaks",
                  "decision", "prediction")  # fmt: skip
        out |= {k: b[k] if b else None for k in chosen}
        # one sample per data-parallel rank: the --tp ranks of a group share theirs, the
        # --pp stages pass each of their micro-batches on
        dp = b["gpus"] // (b["tp"] * b.get("pp", 1)) if b else 1
        per_rank = b["batch_size"] * b["grad_accum"] * b.get("microbatches", 1) if b else None
        out["global_batch"] = per_rank * dp if b else None
        return out


def _variant(train: TrainSpec) -> tuple[str, str, bool]:
    # G = 1 and G >= 2 are different graphs (accumulation keeps gradients alive)
    t = train
    return t.numerics.precision, t.activations.checkpointing, t.loop.grad_accum > 1


def plan(req: PlanRequest, backend: Backend) -> PlanAnswer:
    """Answer `req` (see the module docstring); UserError (with `loc`) for a bad request."""
    report = None
    if req.run_config is not None:  # the run as its framework's config file states it
        given = {k: v for k, v in (req.space.get("sizes") or {}).items()}
        model, train, (sizes,), report = apply_run_config(
            req.run_config, model=req.model, train=req.train, explicit=req.explicit,
            sizes=[given],
        )  # fmt: skip
        if "B" in sizes:  # the plan searches the batch: the file's is where it starts
            report.warnings.append(
                f"the file's batch size {sizes.pop('B')} is not searched from: plan "
                "searches every batch up to space.max_batch"
            )
        req = dataclasses.replace(req, model=model, train=train, run_config=None,
                                  space=req.space | {"sizes": sizes})  # fmt: skip
    device = get_profile(req.device)
    target = "cuda" if device.is_gpu else "cpu"
    fields = dict(req.space)
    entries: dict[int, GraphEntry] = {}
    variant_ids: dict[tuple[str, str, bool], str] = {}
    capture_ids: dict[str, str] = {}  # each captured graph's id, by `capture_key`
    seconds: dict[str, float] = {}
    bundle = None
    if req.model is not None:
        bundle = backend.bundle(req.model)
        if "B" not in bundle.dims:
            raise UserError(f"model {bundle.name!r} has no batch dim B to plan", loc=("model",))
        try:
            sizes = bundle.sizes(fields.get("sizes") or {})
        except ValueError as exc:
            raise UserError(str(exc), loc=("space", "sizes")) from None
        fields["sizes"] = {k: v for k, v in sizes.items() if k != "B"}
        fields.setdefault("precision", [req.train.numerics.precision])
        base = req.train
        try:
            trains = variants(base, SearchSpace(**fields))
        except ValueError as exc:
            raise UserError(str(exc), loc=("space",)) from None
        captures = len({capture_key(t) for t in trains})
        limit = getattr(backend, "max_captures", None)
        if limit is not None and captures > limit:  # each a graph to capture: refuse first
            raise LimitExceeded(
                f"the search space spans {captures} captures (precision x checkpointing x "
                f"accumulation x optimizer implementation x sharding and GPUs); this server "
                f"captures at most {limit} per request (max_captures_per_request)",
                loc=("space",),
            )

        def graph_for(train: TrainSpec) -> StepGraph:
            t0 = time.perf_counter()
            entry = backend.spec_entry(
                bundle, train, req.model, target=target, sm=device.sm or 80, sizes=sizes,
                scenario="worst",
            )  # fmt: skip
            seconds.setdefault(entry.graph_id, round(time.perf_counter() - t0, 3))
            entries[id(entry.graph)] = entry
            variant_ids.setdefault(_variant(train), entry.graph_id)
            capture_ids[capture_key(train)] = entry.graph_id
            return entry.graph
    else:
        base, graph_for = _uploaded(req, backend, fields, entries, variant_ids)
    for p in fields.get("precision", ["fp32"]):
        try:
            device.check_precision(p)
        except ValueError as exc:
            raise UserError(str(exc), loc=("space", "precision")) from None
    try:
        space = SearchSpace(**fields)
    except ValueError as exc:
        raise UserError(str(exc), loc=("space",)) from None
    cfg = _config(req, device)
    first = capture_spec(variants(base, space)[0])
    probe = entries[id(graph_for(first))]  # the graph the route's cost is judged on
    info = model_info(probe.graph, bundle, first, target)
    budget_ms = backend.replay_budget_ms if req.replay_budget_ms is None else req.replay_budget_ms
    exact, method, skipped = backend.plan_route(req.method, budget_ms, probe, device.is_gpu)
    model = AnalyticModel() if method == "analytic" else backend.learned_model
    n_blocks = info.get("blocks") if info else None
    result = search(model, graph_for, base, space, cfg, n_blocks=n_blocks, top=1000,
                    exact=exact, hidden=info.get("hidden") if info else None)  # fmt: skip
    candidates = [c for c in [result.best, *result.runners_up] if c is not None]
    if req.objective == "effective_batch":
        candidates.sort(key=lambda c: (-c.batch_size * c.grad_accum, -c.objective, c.bound_bytes))

    def out(c: Candidate) -> dict[str, Any]:
        variant = (c.precision, c.checkpointing, c.grad_accum > 1)
        return c.to_dict() | {
            "limit_bytes": cfg.limit,
            "under_threshold": c.bound_bytes <= cfg.limit,
            "graph_id": (c.train and capture_ids.get(capture_key(c.train)))
            or variant_ids.get(variant, ""),
        }

    best = candidates[0] if candidates else None
    chosen = None
    if best is not None:
        assert best.train is not None
        picked = best.train.with_options(grad_accum=best.grad_accum)
        chosen_graph = graph_for(capture_spec(picked))  # captured already
        info = model_info(chosen_graph, bundle, picked, target)
        chosen = picked.to_dict()
    return PlanAnswer(
        best=out(best) if best else None,
        runners_up=[out(c) for c in candidates[1 : req.top]],
        budget_bytes=cfg.budget_bytes,
        limit_bytes=cfg.limit,
        threshold=cfg.threshold,
        objective=req.objective,
        queries=result.queries,
        graphs=result.graphs,
        variants=result.variants,
        left_out=result.left_out,
        reason=result.reason,
        model_version=model.version,
        method=method,
        replay_skipped=skipped,
        model=info,
        train=chosen,
        graph_seconds=list(seconds.values()),
        config=report.to_dict() if report is not None else None,
    )


def _config(req: PlanRequest, device) -> PlanConfig:
    budget = req.budget
    if req.budget_fraction is not None:  # a budget of that share of the device
        if device.total_bytes is None:
            raise UserError(
                f"budget_fraction needs a device with a memory total, not {device.name!r}"
            )
        budget = int(device.total_bytes * req.budget_fraction)
    try:
        limit = resolve_limit(
            budget=budget, threshold=req.threshold, device_total=device.total_bytes,
            device=device.name, names=("budget_bytes", "threshold"), required=True,
        )  # fmt: skip
        assert limit is not None
        return PlanConfig(
            budget_bytes=limit.budget_bytes, device=device.name, metric=req.metric,
            threshold=limit.threshold, use_upper_bound=req.use_upper_bound,
        )  # fmt: skip
    except UserError:
        raise
    except ValueError as exc:
        raise UserError(str(exc)) from None


def _uploaded(req, backend, fields, entries, variant_ids):
    """(base TrainSpec, graph_for) over uploaded graphs, one per training variant."""
    for name in ("optimizer_impl", "sharding", "gpus"):
        if fields.get(name):  # an uploaded graph is one of each: nothing to search
            raise UserError(
                f"space.{name} needs a model to capture; uploaded graphs are planned as "
                "they were captured",
                loc=("space", name),
            )
    found: dict[tuple[str, str, bool], StepGraph] = {}
    base: TrainSpec | None = None
    for i, gid in enumerate(req.graph_ids):
        try:
            entry = backend.entry(gid)
        except UserError as exc:
            exc.loc = ("graph_ids", i)
            raise
        try:
            train = TrainSpec.from_dict(entry.graph.train)
        except (TypeError, ValueError) as exc:
            raise UserError(
                f"graph {gid} has no usable training spec: {exc}", loc=("graph_ids", i)
            ) from None
        base = base or train
        key = _variant(train)
        if key not in found:
            found[key] = entry.graph
            entries[id(entry.graph)] = entry
            variant_ids.setdefault(key, entry.graph_id)
    assert base is not None
    fields.setdefault("precision", sorted({v[0] for v in found}))
    fields.setdefault("checkpointing", sorted({v[1] for v in found}))
    fields.setdefault("grad_accum", sorted({2 if v[2] else 1 for v in found}))

    def graph_for(train: TrainSpec) -> StepGraph:
        graph = found.get(_variant(train))
        if graph is None:
            raise UserError(
                f"no uploaded graph for precision={train.numerics.precision}, checkpointing="
                f"{train.activations.checkpointing}, grad_accum "
                f"{'>1' if train.loop.grad_accum > 1 else '1'}",
                loc=("graph_ids",),
            )
        return graph

    return base, graph_for
