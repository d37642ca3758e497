"""Planning: the best training config that fits a memory budget, searched on predictions.

Variables: batch size B, gradient accumulation G, activation checkpointing C and precision
P. Each (P, C, G>1) needs its own captured graph (`graph_for`); B is a size symbol, so
trying a batch size is one query. For each graph the largest fitting B is found like
Lightning's batch-size finder, but on predictions instead of OOMs: `power` doubles B until
the predicted upper bound passes the limit; `binsearch` then bisects between the last fit
and the first miss. Limit = budget x threshold. Objective (default): effective batch B*G
per unit of cost, cost = recompute overhead of C x precision cost of P.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from memgnn.predictor.graph import StepGraph
from memgnn.predictor.limits import parse_budget  # noqa: F401  (re-exported)
from memgnn.predictor.predict import GuardViolation, MemoryModel, Prediction, Query
from memgnn.predictor.spec import PRECISIONS, TrainSpec
from memgnn.predictor.vocab import SEARCH_MODES

log = logging.getLogger(__name__)

# Relative cost of a precision (1.0 = fp32 / AMP, the numerics users start from).
PRECISION_COST = {"fp32": 1.0, "amp-bf16": 1.0, "amp-fp16": 1.05, "bf16": 1.1, "fp16": 1.2}
RECOMPUTE_COST = 1.0 / 3.0  # a full extra forward pass ~ a third of a training step


@dataclass(kw_only=True, slots=True)
class SearchSpace:
    sizes: dict[str, int] = field(default_factory=dict)  # other dims, e.g. {"S": 1024}
    max_batch: int = 4096
    grad_accum: list[int] = field(default_factory=lambda: [1])
    checkpointing: list[str] = field(default_factory=lambda: ["none", "full"])
    precision: list[str] = field(default_factory=lambda: ["fp32"])
    effective_batch: int | None = None  # keep B*G at least this (G = ceil(E / B))
    mode: str = "binsearch"  # power | binsearch
    power_of_two: bool = True  # batch granularity for the result

    def __post_init__(self) -> None:
        if self.max_batch < 1:
            raise ValueError("max_batch must be >= 1")
        if not self.grad_accum or min(self.grad_accum) < 1:
            raise ValueError("grad_accum choices must be >= 1")
        for p in self.precision:
            if p not in PRECISIONS:
                raise ValueError(f"unknown precision {p!r} in search space")
        for c in self.checkpointing:
            TrainSpec(checkpointing=c)  # validates the form
        if self.mode not in SEARCH_MODES:
            raise ValueError(f"mode must be power or binsearch, got {self.mode!r}")
        if self.effective_batch is not None and self.effective_batch < 1:
            raise ValueError("effective_batch must be >= 1")


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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(kw_only=True, slots=True)
class PlanResult:
    best: Candidate | None
    runners_up: list[Candidate]  # configs that fit, after `best`
    queries: int  # predictions made
    reason: str = ""  # why nothing fits, when best is None
    closest: Candidate | None = None  # when nothing fits: the smallest bound at B=1 (over)

    def to_dict(self) -> dict[str, Any]:
        return {
            "best": self.best.to_dict() if self.best else None,
            "runners_up": [c.to_dict() for c in self.runners_up],
            "queries": self.queries,
            "reason": self.reason,
            "closest": self.closest.to_dict() if self.closest else None,
        }


def cost(train: TrainSpec, n_blocks: int | None = None) -> float:
    """Relative step cost of checkpointing and precision (1.0 = plain fp32)."""
    blocks = train.checkpoint_blocks
    if blocks is None:
        recompute = 0.0
    elif blocks < 0 or not n_blocks:
        recompute = RECOMPUTE_COST
    else:
        recompute = RECOMPUTE_COST * min(blocks, n_blocks) / n_blocks
    return (1.0 + recompute) * PRECISION_COST[train.precision]


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
) -> PlanResult:
    """Search the space; the best candidate maximises B*G / cost with its bound under limit.

    With `exact` (e.g. the replay), the steps near the limit and the answer are decided
    by it: no batch is refused whose exact answer fits, none admitted whose does not."""
    candidates: list[Candidate] = []
    closest: Candidate | None = None  # the smallest bound at B=1, when nothing fits
    refused: GuardViolation | None = None
    queries = 0
    for precision in space.precision:
        for ckpt in space.checkpointing:
            for g in _accum_choices(space):
                train = replace(base, precision=precision, checkpointing=ckpt, grad_accum=g)
                prober = _Prober(model, graph_for(train), space, cfg, exact)
                b = largest_batch(prober, space.max_batch, space.mode, space.power_of_two)
                if exact is not None:
                    b = prober.settle(b, space.max_batch, space.mode, space.power_of_two)
                queries += prober.queries
                refused = refused or prober.refused
                if b == 0 and 1 in prober.cache:
                    one = _candidate(prober, 1, g, train, n_blocks)
                    if closest is None or one.bound_bytes < closest.bound_bytes:
                        closest = one
                if b and space.effective_batch:
                    b, g = _fit_effective(b, g, space.effective_batch)
                if b == 0:
                    continue
                candidates.append(_candidate(prober, b, g, train, n_blocks))
    candidates.sort(key=lambda c: (-c.objective, -c.batch_size, c.bound_bytes))
    if not candidates:
        return PlanResult(
            best=None,
            runners_up=[],
            queries=queries,
            reason=_no_fit_reason(cfg, closest, refused),
            closest=closest,
        )
    return PlanResult(best=candidates[0], runners_up=candidates[1:top], queries=queries)


def _candidate(prober: _Prober, b: int, g: int, train: TrainSpec, n_blocks: int | None):
    return Candidate(
        batch_size=b,
        grad_accum=g,
        checkpointing=train.checkpointing,
        precision=train.precision,
        objective=b * g / cost(train, n_blocks),
        bound_bytes=prober.bound(b),
        prediction=prober.predict(b).to_dict(),
    )


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


def _accum_choices(space: SearchSpace) -> Sequence[int]:
    # G = 1 and G >= 2 are different graphs; with a target effective batch G is derived.
    if space.effective_batch is not None:
        return [1, 2]
    return sorted(set(space.grad_accum))
