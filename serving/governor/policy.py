"""The governor's decisions: micro-batch B, accumulation G, checkpointing C, precision P.

Per length bucket (the padded sequence length S of a batch) the policy keeps the micro-batch
size it uses. A new bucket is planned with `predictor.plan.search.plan` on corrected predictions,
ranked by throughput: tokens / (overhead + tokens x cost(C, P)) per micro-batch, so
checkpointing (a third more compute) is chosen only where the batch it frees is small enough
for the fixed per-micro-batch cost to matter. The default search doubles B through the
powers of two until the bound passes the limit, then bisects between the last fit and the
first miss (`mode= "binsearch"`, any B): the batch's GEMMs run on B x S rows and S is a
multiple of the bucket multiple (16), so a power-of-two B buys no alignment, while stopping
at the power of two (`mode="power", power_of_two=True`, the default before) leaves up to
half the budget unused (`benchmarks/governor.py` compares both). After that, each step only
checks that the current choice still fits (one cached lookup); it searches again when it no
longer fits (shrink at once), when the stability window has passed (grow, by at most the
growth factor), or when an alert tier asks for it. An OOM caps the bucket below the size
that failed and halves the growth step.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from memgnn.predictor.ir.graph import StepGraph
from memgnn.predictor.ir.vocab import SEARCH_MODES
from memgnn.predictor.plan.search import Candidate, PlanConfig, plan
from memgnn.predictor.plan.space import SearchSpace, cost
from memgnn.predictor.spec.choices import PRECISIONS
from memgnn.predictor.spec.limits import DEFAULT_THRESHOLD
from memgnn.predictor.spec.train import TrainSpec
from memgnn.serving.governor.correction import GovernedPredictor
from memgnn.serving.governor.world import World, WorldChoice, agree, resolve_world

log = logging.getLogger(__name__)

Found = tuple[int, str | None, str | None]  # micro-batch, checkpointing, precision of a search

__all__ = ["RUNTIME_PRECISIONS", "BucketState", "Decision", "Policy", "PolicyConfig"]


@dataclass(kw_only=True, slots=True)
class Decision:
    micro: int  # samples per micro-batch
    grad_accum: int  # micro-batches per optimizer step
    checkpointing: str
    precision: str
    bound_bytes: int  # corrected upper bound at the bucket's length
    fits: bool = True


@dataclass(kw_only=True, slots=True)
class BucketState:
    micro: int
    checkpointing: str
    precision: str
    changed: int  # step of the last change of micro
    checked: int  # step of the last search
    ceiling: int  # never above this (after an OOM)
    growth: float
    force: bool = False
    last_safe: int = 0  # largest micro that completed a step


# precisions the governor can switch between at run time (parameters stay in their dtype)
RUNTIME_PRECISIONS = ("fp32", "amp-bf16", "amp-fp16")


@dataclass(kw_only=True, slots=True)
class PolicyConfig:
    threshold: float = DEFAULT_THRESHOLD  # corrected bounds stay under this share of the device
    mode: str = "binsearch"  # power (doubling only) | binsearch (doubling, then bisection)
    power_of_two: bool = False  # micro-batch granularity: powers of two only
    max_batch: int = 1024
    stability_window: int = 20  # steps before a bucket may grow again (10-50)
    growth: float = 2.0  # at most this factor per growth (halved after an OOM)
    checkpointing: list[str] = field(default_factory=lambda: ["none", "full"])
    precision: list[str] | None = None  # None: the TrainSpec's precision only
    sizes: dict[str, int] = field(default_factory=dict)  # other fixed input sizes
    # a micro-batch's fixed cost (its kernel launches; with free batch sizes, one optimizer
    # update per batch) in tokens of compute (samples for batches without a length): ranks
    # a larger checkpointed batch against a smaller plain one, whose throughput per token
    # saturates as B grows
    overhead_tokens: int = 512
    # ranks deciding together (serving.governor.world): None = torch.distributed's world
    # size when a process group is initialised, else the TrainSpec's gpus
    world_size: int | None = None

    def __post_init__(self) -> None:
        if self.world_size is not None and (
            isinstance(self.world_size, bool) or self.world_size < 1
        ):
            raise ValueError(f"world_size must be an integer >= 1, got {self.world_size!r}")
        if self.overhead_tokens < 0:
            raise ValueError(f"overhead_tokens must be >= 0, got {self.overhead_tokens}")
        if not 0 < self.threshold <= 1:
            raise ValueError(f"threshold must be in (0, 1], got {self.threshold}")
        if self.mode not in SEARCH_MODES:
            raise ValueError(f"mode must be power or binsearch, got {self.mode!r}")
        if self.max_batch < 1:
            raise ValueError("max_batch must be >= 1")
        if not 1 <= self.stability_window <= 10_000:
            raise ValueError("stability_window must be in [1, 10000] (10-50 is typical)")
        if self.growth <= 1:
            raise ValueError(f"growth must be > 1, got {self.growth}")
        if not self.checkpointing:
            raise ValueError("checkpointing choices must not be empty")
        for c in self.checkpointing:
            TrainSpec.of(checkpointing=c)
        for p in self.precision or ():
            if p not in PRECISIONS:
                raise ValueError(f"unknown precision {p!r}")
            if p not in RUNTIME_PRECISIONS:
                raise ValueError(
                    f"precision {p!r} changes parameter dtypes; the governor switches only "
                    f"between {RUNTIME_PRECISIONS}"
                )


class Policy:
    def __init__(
        self,
        predictor: GovernedPredictor,
        graph_for: Callable[[TrainSpec], StepGraph],
        base: TrainSpec,
        config: PolicyConfig,
        *,
        capacity: int,
        device: str,
        metric: str | None,
        n_blocks: int,
        world: World | None = None,
    ) -> None:
        self.predictor, self.graph_for, self.base, self.cfg = predictor, graph_for, base, config
        self.world = world or resolve_world(config.world_size, base.parallel.gpus)
        self.capacity, self.n_blocks = capacity, n_blocks
        # the search space: what the config allows and the model can do
        self.checkpointing = list(config.checkpointing) if n_blocks else ["none"]
        self.precisions = list(config.precision or [base.numerics.precision])
        self.plan_cfg = PlanConfig(
            budget_bytes=capacity, device=device, metric=metric, threshold=config.threshold
        )
        self.limit = self.plan_cfg.limit
        self.states: dict[int | None, BucketState] = {}
        self.searches = 0  # plan() runs (memo misses)
        self._memo: dict[tuple, int] = {}
        self.forced = 0  # re-plans asked by the `optimize` tier

    # ---- predictions -------------------------------------------------------------------
    def sizes(self, bucket: int | None, b: int) -> dict[str, int]:
        out = {**self.cfg.sizes, "B": b}
        if bucket is not None:
            out["S"] = bucket
        return out

    def train_for(self, ckpt: str, precision: str, g: int) -> TrainSpec:
        return self.base.with_options(checkpointing=ckpt, precision=precision, grad_accum=min(g, 2))

    def graph(self, ckpt: str, precision: str, g: int) -> StepGraph:
        return self.graph_for(self.train_for(ckpt, precision, g))

    def bound(self, bucket: int | None, b: int, ckpt: str, precision: str, g: int) -> int:
        return self.predictor.bound(self.graph(ckpt, precision, g), self.sizes(bucket, b))

    def config_for(self, bucket: int | None, b: int, g: int) -> tuple[str, str, int] | None:
        """The cheapest (C, P) whose bound at micro-batch b fits; None if none does."""
        best = None
        for p in self.precisions:
            for c in self.checkpointing:
                bound = self.bound(bucket, b, c, p, g)
                if bound > self.limit:
                    continue
                key = (cost(self.train_for(c, p, g), self.n_blocks), bound)
                if best is None or key < best[0]:
                    best = (key, c, p, bound)
        return None if best is None else (best[1], best[2], best[3])

    def _prefer(
        self, bucket: int | None, b: int, g: int, prefer: tuple[str | None, str | None]
    ) -> tuple[str, str, int] | None:
        ckpt, prec = prefer
        if ckpt is None or prec is None:
            return None
        bound = self.bound(bucket, b, ckpt, prec, g)
        return (ckpt, prec, bound) if bound <= self.limit else None

    def _granule(self, b: int) -> int:
        """The largest allowed size <= b."""
        if b < 1:
            return 1
        return 1 << (b.bit_length() - 1) if self.cfg.power_of_two else b

    # ---- search ------------------------------------------------------------------------
    def search(self, bucket: int | None, n: int | None) -> Found:
        """Largest micro-batch (plan's best candidate) for a batch of n (None: free B).

        Memoized per (bucket, n) while the corrector's bound factor stays in the same 0.5%
        bin; `decide` checks the result against the exact bound before using it."""
        c = self.predictor.corrector
        key = (bucket, n, round(math.log(max(c.bound_factor, 1e-9)) / 0.005), self.predictor.steady)
        got = self._memo.get(key)
        if got is None:
            got = self._memo[key] = self._search(bucket, n)
        return got

    def _search(self, bucket: int | None, n: int | None) -> Found:
        self.searches += 1
        if n is not None and n <= self.cfg.max_batch:
            whole = self.config_for(bucket, n, 1)  # the cheapest config fitting all n at once
            cheapest = min(
                cost(self.train_for(c, p, 1), self.n_blocks)
                for c in self.checkpointing
                for p in self.precisions
            )
            fit_cost = whole and cost(self.train_for(whole[0], whole[1], 1), self.n_blocks)
            if whole is not None and fit_cost <= cheapest:
                return n, whole[0], whole[1]  # nothing beats the whole batch at the lowest cost
        space = SearchSpace(
            sizes={k: v for k, v in self.sizes(bucket, 1).items() if k != "B"},
            max_batch=min(n, self.cfg.max_batch) if n is not None else self.cfg.max_batch,
            grad_accum=[1],
            checkpointing=list(self.checkpointing),
            precision=list(self.precisions),
            effective_batch=n if n is not None and n > 1 else None,
            mode=self.cfg.mode,
            power_of_two=self.cfg.power_of_two,
        )
        result = plan(
            self.predictor,
            self.graph_for,
            self.base,
            space,
            self.plan_cfg,
            n_blocks=self.n_blocks,
            top=64,  # every (C, P, G class): ranked below by throughput
        )
        if result.best is None:
            return 0, None, None
        candidates = [result.best, *result.runners_up]
        best = max(candidates, key=lambda c: self.rate(bucket, c))
        return best.batch_size, best.checkpointing, best.precision

    def rate(self, bucket: int | None, c: Candidate) -> float:
        """Relative tokens per second of a candidate: a micro-batch costs a fixed overhead
        (as much as `overhead_tokens` tokens of compute) plus its tokens x cost(C, P)."""
        tokens = c.batch_size * (bucket or 1)
        train = self.train_for(c.checkpointing, c.precision, c.grad_accum)
        return tokens / (self.cfg.overhead_tokens + tokens * cost(train, self.n_blocks))

    def decide(self, bucket: int | None, n: int | None, step: int) -> Decision:
        """This rank's decision, agreed with every other rank's when a process group runs
        (`serving.governor.world`): the same micro-batch, G, C and P on all of them, and
        `fits` only where it fits on each (every rank calls this once per step)."""
        local = self._decide_local(bucket, n, step)
        if not self.world.active:
            return local
        mine = WorldChoice(
            rank=self.world.rank, micro=local.micro, checkpointing=local.checkpointing,
            precision=local.precision, bound_bytes=local.bound_bytes, limit_bytes=self.limit,
            fits=local.fits,
        )  # fmt: skip
        chosen = agree(self.world.gather(mine), self.checkpointing, self.precisions)
        g = -(-n // chosen.micro) if n is not None else 1
        bound = self.bound(bucket, chosen.micro, chosen.checkpointing, chosen.precision, g)
        fits = self.world.all_fit(bound <= self.limit)
        st = self.states.get(bucket)
        if st is not None:
            st.micro, st.checkpointing, st.precision = (
                chosen.micro, chosen.checkpointing, chosen.precision,
            )  # fmt: skip
        return Decision(
            micro=chosen.micro, grad_accum=g, checkpointing=chosen.checkpointing,
            precision=chosen.precision, bound_bytes=bound, fits=fits,
        )  # fmt: skip

    def _decide_local(self, bucket: int | None, n: int | None, step: int) -> Decision:
        cap = n if n is not None else self.cfg.max_batch
        st = self.states.get(bucket)
        if st is not None and not st.force:
            b = min(st.micro, cap)
            stable = step - max(st.changed, st.checked) < self.cfg.stability_window
            can_grow = b < min(cap, st.ceiling)
            if stable or not can_grow:
                g = -(-cap // b) if n is not None else 1
                bound = self.bound(bucket, b, st.checkpointing, st.precision, g)
                if bound <= self.limit:
                    return Decision(
                        micro=b,
                        grad_accum=g,
                        checkpointing=st.checkpointing,
                        precision=st.precision,
                        bound_bytes=bound,
                    )
        found, *prefer = self.search(bucket, n)
        if st is None:
            b = max(min(found, self.cfg.max_batch), 1)
            st = self.states[bucket] = BucketState(
                micro=b,
                checkpointing=self.base.activations.checkpointing,
                precision=self.base.numerics.precision,
                changed=step,
                checked=step,
                ceiling=self.cfg.max_batch,
                growth=self.cfg.growth,
            )
        else:
            b = max(min(found, st.ceiling), 1)
            current = min(st.micro, cap)
            if b > current:
                if step - st.changed >= self.cfg.stability_window:
                    b = min(b, self._grow(current, st.growth))
                    st.changed = step
                else:
                    b = current
            elif b < current:
                st.changed = step
            st.checked = step
        st.force = False
        return self._settle(st, bucket, b, n, tuple(prefer))

    def _settle(
        self,
        st: BucketState,
        bucket: int | None,
        b: int,
        n: int | None,
        prefer: tuple[str | None, str | None] = (None, None),
    ) -> Decision:
        """The decision at micro-batch b: the searched (C, P) when it fits there (a cheaper
        C at a slightly larger b must not win over it), else the cheapest that fits."""
        g = -(-n // b) if n is not None else 1
        chosen = self._prefer(bucket, b, g, prefer)
        if chosen is None and b > 1 and prefer[0] is not None:
            # a memoized search from a slightly different factor: search again rather than
            # switch to a costlier config at the same size
            found, *again = self._search(bucket, n)
            b = max(1, min(found, b))
            g = -(-n // b) if n is not None else 1
            chosen = self._prefer(bucket, b, g, (again[0], again[1]))
        chosen = chosen or self.config_for(bucket, b, g)
        if chosen is None and b > 1:  # nothing fits at b: the best size the search finds
            b = max(1, min(self._search(bucket, n)[0], b))
            g = -(-n // b) if n is not None else 1
            chosen = self.config_for(bucket, b, g)
        fits = chosen is not None
        if chosen is None:  # not even micro-batch 1: the most memory-saving config
            ckpt = "full" if "full" in self.checkpointing else self.checkpointing[-1]
            prec = self.precisions[-1]
            chosen = (ckpt, prec, self.bound(bucket, b, ckpt, prec, g))
        st.micro, st.checkpointing, st.precision = b, chosen[0], chosen[1]
        return Decision(
            micro=b,
            grad_accum=g,
            checkpointing=chosen[0],
            precision=chosen[1],
            bound_bytes=chosen[2],
            fits=fits,
        )

    def _grow(self, b: int, growth: float) -> int:
        if self.cfg.power_of_two and growth >= 2:
            return self._granule(b) * 2
        return max(int(b * growth), b + 1)

    # ---- feedback ----------------------------------------------------------------------
    def on_success(self, bucket: int | None, micro: int) -> None:
        st = self.states.get(bucket)
        if st is not None:
            st.last_safe = max(st.last_safe, micro) if micro <= st.ceiling else st.last_safe

    def on_oom(self, bucket: int | None, failed: Decision, step: int, n: int | None) -> Decision:
        """Restore a safe micro-batch below the one that failed; halve the growth step."""
        st = self.states[bucket]
        below = failed.micro - 1
        st.ceiling = max(1, min(st.ceiling, self._granule(below) if below >= 1 else 1))
        st.growth = max(1.125, 1 + (st.growth - 1) / 2)
        safe = st.last_safe if 0 < st.last_safe < failed.micro else max(failed.micro // 2, 1)
        b = max(1, min(safe, st.ceiling))
        st.changed = st.checked = step
        return self._settle(st, bucket, b, n, (st.checkpointing, st.precision))

    def force(self, bucket: int | None, step: int, shrink: bool = False) -> None:
        """Tier `optimize`: search again at the next step (not more than once per window);
        tier `pause` (`shrink`): one size down now, growth held for a window."""
        st = self.states.get(bucket)
        if st is None:
            return
        if not shrink:  # re-plan with the latest correction (at most once per window)
            if not st.force and step - st.checked >= self.cfg.stability_window:
                st.force = True
                self.forced += 1
            return
        st.changed = step
        if shrink and st.micro > 1:
            st.micro = self._granule(st.micro - 1) if self.cfg.power_of_two else st.micro * 3 // 4
            st.micro = max(st.micro, 1)
