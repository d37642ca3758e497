"""The exact prediction path: replay the graph's schedule at the queried sizes.

`ReplayModel` answers a `Query` with the simulator's own label: `dataset.sim.simulate`
(the sweep, the alloc/free schedule with cuBLAS workspaces and kernel scratch, the worst
path) with the compiled core in place of the Python replay, so its bytes are the
simulator's bytes. Where the replay runs out of device memory, the answer is what the
step would need (the same trace replayed without a device limit) and the breakdown says
``would_oom`` with the simulator's message. A CPU target has no allocator to replay: the
simulator's label there is the liveness sweep, and the prediction says ``analytic``.

`choose_method` / `predict_with` route a query: ``auto`` takes the replay where its
estimated cost fits the per-request budget, else the learned model. This module sits
outside `predictor` (the base layer) because it needs the simulator in `dataset`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

from memgnn.dataset.allocator import AllocatorConfig
from memgnn.dataset.replay.trace import replay_trace_fast
from memgnn.dataset.sim import simulate
from memgnn.predictor.devices import get_profile
from memgnn.predictor.graph import StepGraph
from memgnn.predictor.onnx_model import load_default_model
from memgnn.predictor.parallel import annotate
from memgnn.predictor.predict import AnalyticModel, MemoryModel, Prediction, Query

log = logging.getLogger(__name__)

__all__ = ["ExactConfig", "ReplayModel", "choose_method", "estimate_events", "predict_with"]

METHOD_CHOICES = ("auto", "replay", "gnn", "analytic")


@dataclass(kw_only=True, slots=True)
class ExactConfig:
    """How `auto` chooses: replay when its estimated seconds fit ``budget_s``.

    The estimate is ``overhead_s + seconds_per_event x events`` (events estimated from
    the graph's storage and node counts); the defaults are measured by
    ``benchmarks/replay_speed.py`` (build the trace, encode it, replay it)."""

    budget_s: float = 0.25
    seconds_per_event: float = 3e-6
    overhead_s: float = 0.002
    allocator: AllocatorConfig | None = None  # default: the device's usable bytes

    def __post_init__(self) -> None:
        if not self.budget_s >= 0:
            raise ValueError(f"budget_s must be >= 0, got {self.budget_s}")
        if not self.seconds_per_event > 0 or not self.overhead_s >= 0:
            raise ValueError("seconds_per_event must be > 0 and overhead_s >= 0")


def estimate_events(graph: StepGraph) -> int:
    """Events one replay of every path handles: an alloc and a free per storage, and at
    most a scratch alloc/free or phase mark per node (an upper estimate)."""
    return sum(2 * p.num_storages + p.num_nodes for p in graph.paths)


def estimated_seconds(graph: StepGraph, config: ExactConfig) -> float:
    return config.overhead_s + config.seconds_per_event * estimate_events(graph)


class ReplayModel:
    """The simulator's exact answer (see the module docstring); `MemoryModel` protocol."""

    version = "replay-1"

    def __init__(self, allocator: AllocatorConfig | None = None) -> None:
        self.allocator = allocator

    def predict(self, graph: StepGraph, queries: Sequence[Query]) -> list[Prediction]:
        return [self._one(graph, q) for q in queries]

    def _one(self, graph: StepGraph, q: Query) -> Prediction:
        device = get_profile(q.device)
        metric = q.resolved_metric(device.is_gpu)
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
                allocator=_unlimited(self.allocator),
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
        breakdown["replay_seconds"] = round(time.perf_counter() - t0, 6)
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


def _unlimited(cfg: AllocatorConfig | None) -> AllocatorConfig:
    """The same allocator settings without a device limit (no capacity, no fraction)."""
    cfg = cfg or AllocatorConfig()
    fields = {name: getattr(cfg, name) for name in cfg.__slots__}
    fields.update(capacity_bytes=1 << 62, memory_fraction=None)
    fields["garbage_collection_threshold"] = None  # needs a fraction
    return AllocatorConfig(**fields)


def choose_method(method: str, graph: StepGraph, config: ExactConfig) -> str:
    """The path a query takes: ``auto`` is replay when it fits the budget, else gnn."""
    if method not in METHOD_CHOICES:
        raise ValueError(f"unknown method {method!r}; expected one of {METHOD_CHOICES}")
    if method != "auto":
        return method
    cost = estimated_seconds(graph, config)
    chosen = "replay" if cost <= config.budget_s else "gnn"
    log.info("auto: replay estimated %.1f ms, budget %.1f ms -> %s",
             cost * 1e3, config.budget_s * 1e3, chosen)  # fmt: skip
    return chosen


def predict_with(
    method: str,
    graph: StepGraph,
    queries: Sequence[Query],
    *,
    learned: MemoryModel | None = None,
    config: ExactConfig | None = None,
) -> list[Prediction]:
    """Predictions by the chosen path; ``learned`` is the GNN (default: the shipped one).

    The learned model falls back to the analytic baseline where no model ships; the
    answer's ``method`` then says ``analytic``."""
    config = config or ExactConfig()
    chosen = choose_method(method, graph, config)
    if chosen == "replay":
        return ReplayModel(config.allocator).predict(graph, queries)
    if chosen == "analytic":
        return AnalyticModel().predict(graph, queries)
    model = learned or load_default_model()
    preds = model.predict(graph, queries)
    if isinstance(model, AnalyticModel):
        preds = [replace(p, method="analytic") for p in preds]
    for p in preds:  # a sharded step: one rank's peak, and which (predictor.parallel)
        annotate(p.breakdown, graph.train)
    return preds
