"""The exact prediction path: replay the graph's schedule at the queried sizes.

`ReplayModel` answers a `Query` with the simulator's own label: `predictor.sim.simulate.simulate`
(the sweep, the alloc/free schedule with cuBLAS workspaces and kernel scratch, the worst
path) with the compiled core in place of the Python replay, so its bytes are the
simulator's bytes. Where the replay runs out of device memory, the answer is what the
step would need (the same trace replayed without a device limit) and the breakdown says
``would_oom`` with the simulator's message. A CPU target has no allocator to replay: the
simulator's label there is the liveness sweep, and the prediction says ``analytic``.
A query asked again on the same graph object is answered from that graph's replay memo
(``breakdown["replay_memo"]``; `MEMO_SIZE` queries a graph; it lives and dies with the graph).

`decide` routes a query (`answer.predict` runs the path): ``auto`` takes the replay where
its estimated cost fits the per-request budget, else the learned model. The estimate is the fixed
constants' (``overhead_s + seconds_per_event x events``) times the factor this process
measured on its own warm replays, plus the JIT's first-call cost where the compiled core
is not loaded yet (`predictor.sim.replay.cost`). Every answer's ``breakdown["route"]`` says
which path ran and why. This module sits outside `predictor` (the base layer) because it
needs the simulator in `dataset`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from memgnn.predictor.ir.graph import StepGraph
from memgnn.predictor.ir.vocab import METHOD_CHOICES
from memgnn.predictor.memory.base import Prediction, Query
from memgnn.predictor.sim.allocator import AllocatorConfig
from memgnn.predictor.sim.replay.cost import REPLAY_COST, CostEstimate, ReplayCost, jit_state
from memgnn.predictor.sim.replay.trace import replay_trace_fast
from memgnn.predictor.sim.simulate import simulate
from memgnn.predictor.spec.devices import get_profile

log = logging.getLogger(__name__)

__all__ = [
    "Choice",
    "ExactConfig",
    "ReplayModel",
    "decide",
    "estimate_cost",
    "estimate_events",
    "with_route",
]


@dataclass(kw_only=True, slots=True)
class ExactConfig:
    """How `auto` chooses: replay when its estimated seconds fit ``budget_s``.

    The prior estimate is ``overhead_s + seconds_per_event x events`` (events estimated
    from the graph's storage and node counts; the defaults measured by
    ``benchmarks/replay_speed.py``: build the trace, encode it, replay it), scaled by the
    factor measured on this process's warm replays, plus ``jit_load_s`` (machine code in
    numba's on-disk cache) or ``jit_compile_s`` (none) while the compiled core is not
    loaded in this process (both measured by the same benchmark, "JIT warm-up")."""

    budget_s: float = 0.25
    seconds_per_event: float = 3e-6
    overhead_s: float = 0.002
    jit_load_s: float = 2.19
    jit_compile_s: float = 67.59
    allocator: AllocatorConfig | None = None  # default: the device's usable bytes

    def __post_init__(self) -> None:
        if not self.budget_s >= 0:
            raise ValueError(f"budget_s must be >= 0, got {self.budget_s}")
        if not self.seconds_per_event > 0 or not self.overhead_s >= 0:
            raise ValueError("seconds_per_event must be > 0 and overhead_s >= 0")
        if not self.jit_load_s >= 0 or not self.jit_compile_s >= 0:
            raise ValueError("jit_load_s and jit_compile_s must be >= 0")


def estimate_events(graph: StepGraph) -> int:
    """Events one replay of every path handles: an alloc and a free per storage, and at
    most a scratch alloc/free or phase mark per node (an upper estimate)."""
    return sum(2 * p.num_storages + p.num_nodes for p in graph.paths)


def estimated_seconds(graph: StepGraph, config: ExactConfig) -> float:
    """The prior estimate of one warm replay of `graph`: the fixed constants only."""
    return config.overhead_s + config.seconds_per_event * estimate_events(graph)


def estimate_cost(graph: StepGraph, config: ExactConfig, *, cost: ReplayCost | None = None,
                  jit: str | None = None) -> CostEstimate:  # fmt: skip
    """One replay of `graph` now: the prior times the measured factor, plus the JIT's
    first call in state `jit` (default: this process's, `jit_state()`)."""
    return (cost or REPLAY_COST).estimate(
        estimated_seconds(graph, config), jit=jit or jit_state(),
        jit_load_s=config.jit_load_s, jit_compile_s=config.jit_compile_s,
    )  # fmt: skip


class ReplayModel:
    """The simulator's exact answer (see the module docstring); `MemoryModel` protocol."""

    version = "replay-1"

    def __init__(
        self,
        allocator: AllocatorConfig | None = None,
        *,
        config: ExactConfig | None = None,
        cost: ReplayCost | None = None,
    ) -> None:
        self.allocator = allocator
        self.config = config or ExactConfig()  # the prior the measured factor scales
        self.cost = cost or REPLAY_COST

    def predict(self, graph: StepGraph, queries: Sequence[Query]) -> list[Prediction]:
        return [self._memo(graph, q) for q in queries]

    def _memo(self, graph: StepGraph, q: Query) -> Prediction:
        """`_one`, remembered: a replay is a pure function of the graph, the sizes, the
        device, the scenario, the metric and the allocator settings, so a query asked again
        (a training job polling its config) gets the same bytes without replaying; its
        breakdown says ``replay_memo`` and keeps the first replay's ``replay_seconds``."""
        device = get_profile(q.device)
        key = (tuple(sorted(q.sizes.items())), repr(device), q.scenario,
               q.resolved_metric(device.is_gpu), repr(self.allocator))  # fmt: skip
        if not graph.paths:
            return self._one(graph, q)
        with _MEMO_LOCK:
            memo = _memo_of(graph)
            hit = memo.get(key)
            if hit is not None:
                memo.move_to_end(key)
                return hit.copy(replay_memo=True)
        p = self._one(graph, q)
        with _MEMO_LOCK:
            memo[key] = p.copy()
            while len(memo) > MEMO_SIZE:
                memo.popitem(last=False)
        return p

    def _one(self, graph: StepGraph, q: Query) -> Prediction:
        device = get_profile(q.device)
        metric = q.resolved_metric(device.is_gpu)
        warm = jit_state() == "warm"  # a replay that loads or compiles the JIT is not timed
        t0 = time.perf_counter()
        res = simulate(
            graph, q.sizes, device, scenario=q.scenario, allocator=self.allocator,
            replayer=replay_trace_fast,
        )  # fmt: skip
        breakdown = dict(res.breakdown)
        breakdown.update(
            would_oom=bool(res.stats.get("would_oom", False)),
            oom_message=res.stats.get("oom_message"),
            num_alloc_retries=res.stats.get("num_alloc_retries", 0),
            fragmentation_at_peak=res.stats.get("fragmentation_at_peak"),
            violated_guards=res.stats["violated_guards"],
        )
        if breakdown["would_oom"]:  # what the step needs: no device limit
            need = simulate(
                graph, q.sizes, device, scenario=q.scenario, replayer=replay_trace_fast,
                allocator=(self.allocator or AllocatorConfig()).unlimited(),
            )  # fmt: skip
            breakdown.update(
                sim_peak_allocated_bytes=res.peak_allocated_bytes,
                sim_peak_reserved_bytes=res.peak_reserved_bytes,
            )
            res = need
        value = {
            "allocated": res.peak_allocated_bytes,
            "reserved": res.peak_reserved_bytes,
            "device_total": res.device_total_bytes,
        }[metric]
        seconds = time.perf_counter() - t0
        breakdown["replay_seconds"] = round(seconds, 6)
        if warm and device.is_gpu:  # an OOM replays twice
            runs = 2 if breakdown["would_oom"] else 1
            self.cost.observe(runs * estimated_seconds(graph, self.config), seconds)
        paths = [
            {
                "conditions": p["conditions"],
                "predicted_peak_bytes": p.get(f"peak_{metric}_bytes", p["tensor_peak_bytes"]),
            }
            for p in res.breakdown["paths"]
        ]
        if metric == "device_total":
            for p, src in zip(paths, res.breakdown["paths"]):
                p["predicted_peak_bytes"] = src["peak_reserved_bytes"] + device.context_bytes
        return Prediction(
            predicted_peak_bytes=int(value),
            upper_bound_bytes=int(value),
            metric=metric,
            breakdown=breakdown,
            model_version=self.version,
            paths=paths,
            method="replay" if device.is_gpu else "analytic",
        )


MEMO_SIZE = 1024  # replays remembered per graph
_MEMO_LOCK = threading.Lock()


def _memo_of(graph: StepGraph) -> OrderedDict[tuple[Any, ...], Prediction]:
    """The graph's replay memo, kept in its first path's derived-data cache: it lives and
    dies with the graph (and is not pickled with it)."""
    return graph.paths[0].cached("replay_memo", OrderedDict)


@dataclass(frozen=True, slots=True)
class Choice:
    """The path a query takes, and why (`to_dict` is the answer's ``breakdown["route"]``)."""

    asked: str
    method: str
    reason: str
    budget_s: float
    cost: CostEstimate

    def to_dict(self) -> dict[str, object]:
        return {"asked": self.asked, "method": self.method, "reason": self.reason,
                "budget_ms": round(self.budget_s * 1e3, 3), **self.cost.to_dict()}  # fmt: skip


def decide(method: str, graph: StepGraph, config: ExactConfig, *,
           cost: ReplayCost | None = None, jit: str | None = None) -> Choice:  # fmt: skip
    """``auto`` is replay when one replay's estimate (JIT included) fits the budget, else
    gnn; another method is taken as asked, the reason saying what a replay costs now."""
    if method not in METHOD_CHOICES:
        raise ValueError(f"unknown method {method!r}; expected one of {METHOD_CHOICES}")
    est = estimate_cost(graph, config, cost=cost, jit=jit)
    budget = f"the {config.budget_s * 1e3:g} ms budget"
    measured = (f"x{est.factor:.2f} from {est.samples} measured replays" if est.samples
                else "no replay measured yet")  # fmt: skip
    first = "loads it from numba's cache" if est.jit == "cached" else "compiles it"
    jit_why = f"JIT {est.jit}: this process's first replay {first} (~{est.jit_seconds:.1f} s)"
    if method != "auto":
        chosen, why = method, "asked for by name"
        if method == "replay" and est.jit != "warm":
            why += f"; {jit_why}"
    elif est.jit != "warm" and est.replay_seconds <= config.budget_s < est.seconds:
        chosen, why = "gnn", f"replay {jit_why}, over {budget}"
    else:
        chosen = "replay" if est.seconds <= config.budget_s else "gnn"
        jit_part = "" if est.jit == "warm" else f"; {jit_why}"
        within = "within" if chosen == "replay" else "over"
        why = (
            f"replay estimated {est.seconds * 1e3:.1f} ms ({measured}{jit_part}), {within} {budget}"
        )
    log.info("%s: %s -> %s", method, why, chosen)
    return Choice(asked=method, method=chosen, reason=why, budget_s=config.budget_s, cost=est)


def with_route(p: Prediction, choice: Choice) -> Prediction:
    """`p` with ``breakdown["route"]``: the path that ran (`p.method`) and why."""
    route = choice.to_dict() | {"method": p.method}
    return replace(p, breakdown={**p.breakdown, "route": route})
