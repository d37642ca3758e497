"""The analytic estimate: a liveness sweep over a captured schedule at any sizes, in numpy.

Live bytes after node i's outputs are allocated (and before the storages that die after
node i are released) = storages alive before the step + all allocations up to i - all
frees before i. The peak over the schedule is the tensor-level peak of the step: what a
storage tracker sees on a real CPU run. `round_to=512` applies the CUDA allocator's block
rounding to each storage (an estimate of allocated bytes without the caching effects that
`predictor.sim.allocator` simulates).

`AnalyticModel` is the baseline the learned model corrects: the sweep with the CUDA
allocator's 512-byte block rounding, plus the device's cuBLAS workspaces (allocated) and
CUDA context (device total); it models no caching or fragmentation, so its reserved
estimate equals its allocated one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from memgnn.predictor.emulate.parallel import annotate
from memgnn.predictor.ir.graph import PathGraph, StepGraph
from memgnn.predictor.ir.vocab import CATEGORIES, PHASES, category_bytes, cublas_workspaces
from memgnn.predictor.memory.base import Prediction, Query, check_guards
from memgnn.predictor.memory.places import place_breakdown
from memgnn.predictor.spec.devices import get_profile

STEP_NAMES = ("first", "steady")


@dataclass(kw_only=True, slots=True)
class PathPeak:
    path: int
    peak_bytes: int
    peak_node: int  # -1: the peak is the state before the first node
    peak_op: str
    peak_phase: str
    breakdown: dict[str, int]  # live bytes by category at the peak
    step_peaks: dict[str, int]  # first / steady
    phase_peaks: dict[str, int]
    conditions: list[dict[str, Any]] = field(default_factory=list)


@dataclass(kw_only=True, slots=True)
class SweepResult:
    peak_bytes: int
    path: int
    scenario: str
    sizes: dict[str, int]
    paths: list[PathPeak]
    violated_guards: list[str]

    @property
    def best(self) -> PathPeak:
        return self.paths[self.path]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def round_bytes(nbytes: np.ndarray, round_to: int) -> np.ndarray:
    if round_to <= 1:
        return nbytes
    return np.where(nbytes > 0, -(-nbytes // round_to) * round_to, 0)


@dataclass(frozen=True, slots=True)
class LiveIndex:
    """A path's allocation schedule in a form that turns storage bytes into live-byte
    curves with two cumulative sums (no per-node loop)."""

    initial_order: np.ndarray  # storages alive before the first node
    alloc_order: np.ndarray  # storages allocated in the step, by node
    alloc_pos: np.ndarray  # [nodes] how many of them are allocated at nodes <= i
    free_order: np.ndarray  # storages freed in the step, by node
    free_pos: np.ndarray  # [nodes] how many of them are freed at nodes < i


def live_index(path: PathGraph) -> LiveIndex:
    def make() -> LiveIndex:
        alloc, free = path.array("storages", "alloc"), path.array("storages", "free")
        nodes = np.arange(path.num_nodes, dtype=np.int64)
        a = np.flatnonzero(alloc >= 0)
        a = a[np.argsort(alloc[a], kind="stable")]
        f = np.flatnonzero(free >= 0)
        f = f[np.argsort(free[f], kind="stable")]
        return LiveIndex(
            initial_order=np.flatnonzero(alloc < 0),
            alloc_order=a,
            alloc_pos=np.searchsorted(alloc[a], nodes, side="right"),
            free_order=f,
            free_pos=np.searchsorted(free[f], nodes, side="left"),
        )

    return path.cached("live_index", make)


def live_curves(
    index: LiveIndex, nbytes_KS: np.ndarray, scratch_KN: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """For K byte assignments at once: (bytes alive before the first node [K], live bytes
    at each node [K, N]); a node's kernel scratch counts at that node only."""
    # np.take: several times faster than fancy indexing on these sizes
    initial = np.take(nbytes_KS, index.initial_order, axis=1).sum(axis=1)
    k = nbytes_KS.shape[0]
    zero = np.zeros((k, 1), dtype=nbytes_KS.dtype)
    added = np.cumsum(np.take(nbytes_KS, index.alloc_order, axis=1), axis=1)
    freed = np.cumsum(np.take(nbytes_KS, index.free_order, axis=1), axis=1)
    live = np.take(np.concatenate([zero, added], axis=1), index.alloc_pos, axis=1)
    live -= np.take(np.concatenate([zero, freed], axis=1), index.free_pos, axis=1)
    live += initial[:, None]
    if scratch_KN is not None:
        live += scratch_KN
    return initial, live


def live_curve(
    graph: StepGraph, path: int, nbytes: np.ndarray, scratch: np.ndarray | None = None
) -> tuple[int, np.ndarray]:
    """(bytes alive before the first node, live bytes at each node) for one path; a node's
    kernel scratch counts at that node only."""
    index = live_index(graph.paths[path])
    initial, live = live_curves(index, nbytes[None], None if scratch is None else scratch[None])
    return int(initial[0]), live[0]


def _breakdown_at(graph: StepGraph, path: int, nbytes: np.ndarray, node: int) -> dict[str, int]:
    p = graph.paths[path]
    alloc, free = p.array("storages", "alloc"), p.array("storages", "free")
    cat = p.array("storages", "category")
    alive = (alloc <= node) & ((free < 0) | (free >= node))
    if node < 0:
        alive = alloc < 0
    per = np.bincount(cat[alive], weights=nbytes[alive], minlength=len(CATEGORIES))
    return category_bytes(per)


def sweep_path(graph: StepGraph, path: int, resolved: dict[str, int], round_to: int = 1):
    p = graph.paths[path]
    nbytes = round_bytes(graph.storage_bytes(path, resolved), round_to)
    scratch = round_bytes(graph.scratch_bytes(path, resolved), round_to)
    initial, live = live_curve(graph, path, nbytes, scratch)
    if len(live) == 0 or initial >= live.max():
        peak_node, peak = -1, initial
    else:
        peak_node = int(np.argmax(live))
        peak = int(live[peak_node])
    steps, phases = p.array("nodes", "step"), p.array("nodes", "phase")
    step_peaks = {STEP_NAMES[s]: int(live[steps == s].max()) for s in (0, 1) if np.any(steps == s)}
    phase_peaks = {
        PHASES[k]: int(live[phases == k].max()) for k in range(len(PHASES)) if np.any(phases == k)
    }
    return PathPeak(
        path=path,
        peak_bytes=peak,
        peak_node=peak_node,
        peak_op=p.nodes["op"][peak_node] if peak_node >= 0 else "<before step>",
        peak_phase=PHASES[p.nodes["phase"][peak_node]] if peak_node >= 0 else "setup",
        breakdown=_breakdown_at(graph, path, nbytes, peak_node),
        step_peaks=step_peaks,
        phase_peaks=phase_peaks,
        conditions=p.conditions,
    )


def sweep(
    graph: StepGraph, sizes: dict[str, int], *, scenario: str = "worst", round_to: int = 1
) -> SweepResult:
    """Peak live bytes of every path at `sizes`; the result's peak is the max over paths."""
    resolved = graph.resolve_sizes(sizes, scenario)
    peaks = [sweep_path(graph, k, resolved, round_to) for k in range(len(graph.paths))]
    best = max(range(len(peaks)), key=lambda k: peaks[k].peak_bytes)
    return SweepResult(
        peak_bytes=peaks[best].peak_bytes,
        path=best,
        scenario=scenario,
        sizes=resolved,
        paths=peaks,
        violated_guards=graph.violated_guards(resolved),
    )


class AnalyticModel:
    """Liveness sweep + block rounding + workspaces + context (see module docstring)."""

    version = "analytic-1"

    def predict(self, graph: StepGraph, queries: Sequence[Query]) -> list[Prediction]:
        check_guards(graph, queries)
        out = []
        for q in queries:
            device = get_profile(q.device)
            metric = q.resolved_metric(device.is_gpu)
            round_to = 512 if device.is_gpu else 1
            swept = sweep(graph, q.sizes, scenario=q.scenario, round_to=round_to)
            places = [
                place_breakdown(graph, k, swept.sizes, gpu=device.is_gpu)
                for k in range(len(swept.paths))
            ]
            extras = [
                _extra_bytes(graph, k, device, metric) + managed_bytes(places[k], metric)
                for k in range(len(swept.paths))
            ]
            per_path = [
                {"conditions": p.conditions, "predicted_peak_bytes": p.peak_bytes + extra}
                for p, extra in zip(swept.paths, extras, strict=True)
            ]
            best = max(range(len(per_path)), key=lambda k: per_path[k]["predicted_peak_bytes"])
            value, extra = per_path[best]["predicted_peak_bytes"], extras[best]
            out.append(
                Prediction(
                    predicted_peak_bytes=value,
                    upper_bound_bytes=value,
                    metric=metric,
                    breakdown=annotate(
                        {
                            "categories": swept.best.breakdown,
                            "phase": swept.best.peak_phase,
                            "step_peaks": swept.best.step_peaks,
                            "workspace_and_context_bytes": extra,
                            "violated_guards": swept.violated_guards,
                            **places[best],
                        },
                        graph.train,
                        per_path,
                    ),
                    model_version=self.version,
                    paths=per_path,
                )
            )
        return out


def managed_bytes(places: dict[str, Any], metric: str) -> int:
    """Unified memory (paged optimizer states) in a device_total answer: resident on the
    device while it has room (`predictor.memory.places`); never allocated or reserved."""
    return places.get("managed_peak_bytes", 0) if metric == "device_total" else 0


def _extra_bytes(graph: StepGraph, path: int, device: Any, metric: str) -> int:
    """cuBLAS workspaces (one per thread running a matmul) and, for device_total, the
    CUDA context: what the device holds besides the step's tensors."""
    if not device.is_gpu:
        return 0
    p = graph.paths[path]
    handles = p.cached(
        "cublas_workspaces", lambda: cublas_workspaces(p.nodes["op"], p.nodes["phase"])
    )
    extra = handles * device.cublas_workspace_bytes
    return extra + (device.context_bytes if metric == "device_total" else 0)
