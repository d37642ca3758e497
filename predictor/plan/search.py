"""Planning: the best training config that fits a memory budget, searched on predictions.

Variables: batch size B, gradient accumulation G, activation checkpointing C, precision P,
the optimizer implementation O (foreach / fused / for-loop: foreach makes temporaries of
a whole parameter group at once, for-loop one tensor at a time, fused none), and with
several GPUs the sharding and the GPU count N. B is a size symbol, so trying a batch size
is one query; every other combination is a captured graph (`graph_for`), asked for once
per distinct capture: G = 2 stands for every G >= 2 (micro-steps past the second repeat
it exactly, see `step.TrainingStep.run`), so the accumulation choices share two graphs.
For each graph the largest fitting B is found like Lightning's batch-size finder, but on
predictions instead of OOMs: `power` doubles B until the predicted upper bound passes the
limit; `binsearch` then bisects between the last fit and the first miss. Limit = budget x
threshold. Objective (default): samples per rank per step B*G per unit of cost, cost =
recompute overhead of C x precision cost of P x optimizer cost of O x communication cost
of the sharding x the copy cost of activation offloading (`space.offload_cost`, from the
bytes the graph keeps on the host at B); ties go to fewer GPUs, then the larger B. Each
candidate carries its `decision.Decision`: state bytes, per-sample bytes and the
straight-line largest batch.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from memgnn.predictor.emulate.parallel import annotate
from memgnn.predictor.errors import LimitExceeded, UserError
from memgnn.predictor.ir.graph import StepGraph
from memgnn.predictor.memory.base import GuardViolation, MemoryModel, Prediction, Query
from memgnn.predictor.memory.places import place_peaks
from memgnn.predictor.plan.decision import decide
from memgnn.predictor.plan.space import (
    SearchSpace,
    capture_key,
    capture_spec,
    cost,
    offload_cost,
    variants,
    work_share,
)
from memgnn.predictor.spec.train import TrainSpec

log = logging.getLogger(__name__)


@dataclass(kw_only=True, slots=True)
class PlanConfig:
    budget_bytes: int
    device: str = "h100-80gb"
    metric: str | None = None
    threshold: float = 1.0  # fraction of the budget a bound may reach
    use_upper_bound: bool = True

    def __post_init__(self) -> None:
        if self.budget_bytes <= 0:
            raise ValueError("budget must be positive")
        if not 0 < self.threshold <= 1:
            raise ValueError("threshold must be in (0, 1]")

    @property
    def limit(self) -> int:
        return int(self.budget_bytes * self.threshold)


@dataclass(kw_only=True, slots=True)
class Candidate:
    batch_size: int
    grad_accum: int
    checkpointing: str
    precision: str
    objective: float
    bound_bytes: int
    prediction: dict[str, Any]
    optimizer_impl: str = "auto"
    gpus: int = 1
    sharding: str = "none"
    tp: int = 1  # tensor-parallel degree: gpus / tp data-parallel ranks
    pp: int = 1  # pipeline stages (--pp): gpus / (tp x pp) data-parallel ranks
    microbatches: int = 1  # --pp: micro-batches of batch_size samples per step
    pp_schedule: str = "1f1b"  # --pp: the schedule
    stage_peaks: list[int] = field(default_factory=list)  # --pp: each stage's peak, by stage
    fsdp_reshard_after_forward: bool = True
    offload_activations: str = "none"
    decision: dict[str, Any] = field(default_factory=dict)  # `decision.Decision.to_dict`
    train: TrainSpec | None = None  # the configuration itself (not in `to_dict`)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(replace(self, train=None))
        del out["train"]
        return out


@dataclass(kw_only=True, slots=True)
class PlanResult:
    best: Candidate | None
    runners_up: list[Candidate]  # configs that fit, after `best`
    queries: int  # predictions made
    reason: str = ""  # why nothing fits, when best is None
    closest: Candidate | None = None  # when nothing fits: the smallest bound at B=1 (over)
    graphs: int = 0  # distinct captured graphs the search asked for (captured or cached)
    variants: int = 0  # training configurations searched (each answered by one of them)
    left_out: list[str] = field(default_factory=list)  # refused by the spec or the capture, why

    def to_dict(self) -> dict[str, Any]:
        return {
            "best": self.best.to_dict() if self.best else None,
            "runners_up": [c.to_dict() for c in self.runners_up],
            "queries": self.queries,
            "reason": self.reason,
            "closest": self.closest.to_dict() if self.closest else None,
            "graphs": self.graphs,
            "variants": self.variants,
            "left_out": self.left_out,
        }


class _Prober:
    """Predicts the bound for one graph at a batch size, counting queries.

    With an `exact` model (the replay), a batch whose learned answer lies near the limit
    (bound above limit x (1 - margin) and estimate below limit x (1 + margin)) is decided
    by the exact model instead."""

    def __init__(
        self,
        model: MemoryModel,
        graph: StepGraph,
        space: SearchSpace,
        cfg: PlanConfig,
        exact: MemoryModel | None = None,
        margin: float = 0.1,
    ):
        self.model, self.graph, self.space, self.cfg = model, graph, space, cfg
        self.exact, self.margin = exact, margin
        self.queries = 0
        self.cache: dict[int, Prediction] = {}
        self.exact_cache: dict[int, Prediction] = {}
        self.refused: GuardViolation | None = None

    def predict(self, batch: int) -> Prediction:
        if batch in self.exact_cache:
            return self.exact_cache[batch]
        if batch not in self.cache:
            self.cache[batch] = self.model.predict(self.graph, [self._query(batch)])[0]
            self.queries += 1
        return self.cache[batch]

    def _query(self, batch: int) -> Query:
        sizes = {**self.space.sizes, "B": batch}
        return Query(sizes=sizes, device=self.cfg.device, metric=self.cfg.metric)

    def bound(self, batch: int) -> int:
        p = self.predict(batch)
        return p.upper_bound_bytes if self.cfg.use_upper_bound else p.predicted_peak_bytes

    def line_bounds(self, batches: tuple[int, int]) -> tuple[int, int] | None:
        """The bounds at two batch sizes from one model: the exact one where it answered
        both already, else the learned one (asking it where needed); no exact query is
        added. None where the graph's guards refuse a batch."""
        exact = self.exact_cache
        try:
            if all(b in exact for b in batches):
                return exact[batches[0]].upper_bound_bytes, exact[batches[1]].upper_bound_bytes
            out = []
            for b in batches:
                if b not in self.cache:
                    self.cache[b] = self.model.predict(self.graph, [self._query(b)])[0]
                    self.queries += 1
                p = self.cache[b]
                out.append(
                    p.upper_bound_bytes if self.cfg.use_upper_bound else p.predicted_peak_bytes
                )
            return out[0], out[1]
        except GuardViolation:
            return None

    def exact_fits(self, batch: int) -> bool:
        assert self.exact is not None
        if batch not in self.exact_cache:
            self.exact_cache[batch] = self.exact.predict(self.graph, [self._query(batch)])[0]
            self.queries += 1
        return self.exact_cache[batch].upper_bound_bytes <= self.cfg.limit

    def fits(self, batch: int) -> bool:
        """Whether `batch` fits under the limit: by the learned bound, or by the exact model
        near the limit; a batch size where the graph's guards fail (another graph would be
        needed) does not fit."""
        return self._guarded(self._fits, batch)

    def _guarded(self, check, batch: int) -> bool:
        try:
            return check(batch)
        except GuardViolation as exc:
            self.refused = exc
            return False

    def _fits(self, batch: int) -> bool:
        if self.exact is None or batch in self.exact_cache:
            return self.bound(batch) <= self.cfg.limit
        limit, p = self.cfg.limit, self.predict(batch)
        if self.bound(batch) <= limit * (1 - self.margin):
            return True
        if p.predicted_peak_bytes >= limit * (1 + self.margin):
            return False
        return self.exact_fits(batch)

    def settle(self, b: int, max_batch: int, mode: str, power_of_two: bool) -> int:
        """Check the answer and the step after it by the exact model; where the learned
        model misled, search again deciding every step exactly."""
        nxt = max(1, b * 2 if mode == "power" or power_of_two else b + 1)
        fits_now = b == 0 or self._guarded(self.exact_fits, b)
        if fits_now and not (nxt <= max_batch and self._guarded(self.exact_fits, nxt)):
            return b
        self.margin = float("inf")
        return largest_batch(self, max_batch, mode, power_of_two)


def largest_batch(prober: _Prober, max_batch: int, mode: str, power_of_two: bool) -> int:
    """Largest B that fits (0 if even B=1 does not), power mode then optional bisection."""
    if not prober.fits(1):
        return 0
    lo, hi = 1, None
    while lo * 2 <= max_batch:
        if prober.fits(lo * 2):
            lo *= 2
        else:
            hi = lo * 2
            break
    if mode == "power" or power_of_two:
        return lo
    hi = hi if hi is not None else max_batch + 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if prober.fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


def plan(
    model: MemoryModel,
    graph_for: Callable[[TrainSpec], StepGraph],
    base: TrainSpec,
    space: SearchSpace,
    cfg: PlanConfig,
    *,
    n_blocks: int | None = None,
    top: int = 5,
    exact: MemoryModel | None = None,
    hidden: int | None = None,
) -> PlanResult:
    """Search the space; the best candidate maximises B*G / cost with its bound under limit.

    With `exact` (e.g. the replay), the steps near the limit and the answer are decided
    by it: no batch is refused whose exact answer fits, none admitted whose does not.
    `graph_for` is called once per distinct capture (`capture_spec`), never per batch.
    `n_blocks` and `hidden` (the model's) weigh checkpointing and --tp in the cost."""
    candidates: list[Candidate] = []
    closest: Candidate | None = None  # the smallest bound at B=1, when nothing fits
    refused: GuardViolation | None = None
    queries = 0
    graphs: dict[str, Any] = {}
    probers: dict[int, _Prober] = {}
    spec_refused: dict[str, str] = {}  # the spec's reason: the first layout it refused
    trains = variants(base, space, spec_refused)
    refusals: dict[str, tuple[str, UserError]] = {}  # by capture: (its options, why)
    for train in trains:
        key = capture_key(train)
        if key in refusals:
            continue
        if key not in graphs:
            spec = capture_spec(train)
            try:
                graphs[key] = graph_for(spec)
            except UserError as exc:  # e.g. --pp stages that do not split the blocks evenly
                if isinstance(exc, LimitExceeded) or getattr(exc, "status", None) == 503:
                    raise
                refusals[key] = (_layout_text(spec), exc)
                continue
        prober = _Prober(model, graphs[key], space, cfg, exact)
        b = largest_batch(prober, space.max_batch, space.mode, space.power_of_two)
        if exact is not None:
            b = prober.settle(b, space.max_batch, space.mode, space.power_of_two)
        refused = refused or prober.refused
        g = train.loop.grad_accum
        if b == 0 and 1 in prober.cache:
            one = _candidate(prober, 1, g, train, (n_blocks, hidden))
            if closest is None or one.bound_bytes < closest.bound_bytes:
                closest = one
        if b and space.effective_batch:
            b, g = _fit_effective(b, g, space.effective_batch)
        if b:
            candidates.append(_candidate(prober, b, g, train, (n_blocks, hidden)))
            probers[id(candidates[-1])] = prober
        queries += prober.queries
    candidates.sort(key=lambda c: (-c.objective, c.gpus, -c.batch_size, c.bound_bytes))
    counts: dict[str, Any] = {"queries": queries, "graphs": len(graphs), "variants": len(trains)}
    if refusals and not graphs:  # every configuration refused: the first reason is the answer
        raise next(iter(refusals.values()))[1]
    counts["left_out"] = [f"{where}: {why}" for why, where in spec_refused.items()] + [
        f"{text}: {exc}" for text, exc in refusals.values()
    ]
    if not candidates:
        reason = _no_fit_reason(cfg, closest, refused)
        return PlanResult(best=None, runners_up=[], reason=reason, closest=closest, **counts)
    best = candidates[0]
    if exact is not None:  # the answer's reasoning on the model that decided it
        prober = probers[id(best)]
        before = prober.queries
        for b in (1, best.batch_size if best.batch_size > 1 else 2):
            prober._guarded(prober.exact_fits, b)
        best.decision = decide(
            prober.line_bounds, prober.graph, space.sizes, best.batch_size, cfg.limit
        ).to_dict()
        counts["queries"] += prober.queries - before
    return PlanResult(best=best, runners_up=candidates[1:top], **counts)


def _layout_text(train: TrainSpec) -> str:
    """A configuration as its options read (those that differ from the defaults)."""
    return " ".join(f"{k}={v}" for k, v in sorted(train.changed().items()))


def _candidate(
    prober: _Prober, b: int, g: int, train: TrainSpec, shape: tuple[int | None, int | None]
) -> Candidate:
    """The candidate at batch b; its objective is whole-model sample passes per rank per
    step (B*G x `work_share`) per unit of cost (`shape`: the model's blocks and hidden)."""
    decision = decide(
        prober.line_bounds, prober.graph, prober.space.sizes, b, prober.cfg.limit
    ).to_dict()
    prediction = prober.predict(b)
    pipeline = train.parallel.pp > 1  # one path per stage
    note = annotate({}, prober.graph.train, prediction.paths)["parallel"] if pipeline else {}
    return Candidate(
        batch_size=b,
        grad_accum=g,
        checkpointing=train.activations.checkpointing,
        precision=train.numerics.precision,
        objective=b
        * g
        * work_share(train)
        / (cost(train, *shape) * _offload_cost(prober, b, train)),
        bound_bytes=prober.bound(b),
        prediction=prediction.to_dict(),
        optimizer_impl=train.optim.impl,
        gpus=train.parallel.gpus,
        sharding=train.parallel.sharding,
        tp=train.parallel.tp,
        pp=train.parallel.pp,
        microbatches=train.parallel.pp_microbatches if train.parallel.pp > 1 else 1,
        pp_schedule=train.parallel.pp_schedule,
        stage_peaks=note.get("stage_peak_bytes", []),
        train=train,
        fsdp_reshard_after_forward=train.parallel.reshard_after_forward,
        offload_activations=train.offload.activations,
        decision=decision,
    )


def _offload_cost(prober: _Prober, b: int, train: TrainSpec) -> float:
    """`space.offload_cost` at batch b: the bytes the step keeps on the host, read off the
    graph (whatever model answers the device peak), the model's parameters, its tokens."""
    kind = train.offload.activations
    if kind == "none":
        return 1.0
    sizes = {**prober.space.sizes, "B": b}
    graph = prober.graph
    host = max(
        place_peaks(graph, k, graph.resolve_sizes(sizes))["host_pinned_peak_bytes"]
        for k in range(len(graph.paths))
    )
    info = graph.meta.get("model_info") or {}
    tokens = b * sizes.get("S", 1)
    return offload_cost(kind, host, int(info.get("parameters") or 0), tokens)


def _no_fit_reason(cfg: PlanConfig, closest: Candidate | None, refused: Any) -> str:
    which = "upper bound" if cfg.use_upper_bound else "predicted peak"
    text = (
        f"no config in the space fits {cfg.limit} bytes (budget {cfg.budget_bytes} x "
        f"threshold {cfg.threshold}), not even batch size 1; each config's {which} was "
        "compared with it"
    )
    if closest is not None:
        p = closest.prediction
        text += (
            f"; the closest, B=1 G={closest.grad_accum} checkpointing={closest.checkpointing} "
            f"precision={closest.precision}, has an upper bound of {p['upper_bound_bytes']} "
            f"bytes ({p['metric']} prediction {p['predicted_peak_bytes']})"
        )
    if refused is not None:
        text += f"; some sizes were refused: {refused}"
    return text


def _fit_effective(b: int, g_class: int, effective: int) -> tuple[int, int]:
    """(B, G) with B*G >= effective for a graph captured with G=1 or G>=2; (0, 0) if the
    class does not apply (G=1 needs B >= effective; G>=2 is for when it does not)."""
    if g_class == 1:
        return (effective, 1) if b >= effective else (0, 0)
    if b >= effective:
        return 0, 0
    g = -(-effective // b)
    return -(-effective // g), g
