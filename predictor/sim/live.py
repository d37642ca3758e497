"""What is live at the simulated peak: the moment `simulate` reports, and every block then.

`peak_moment` replays a path's trace (`predictor.sim.simulate.trace_arrays`: storages, the
cuBLAS workspaces, kernel scratch) through the same `CachingAllocatorSim` and settings as
`simulate` (the device's usable memory as the capacity; without it where the step would
not fit, as the answer's "what the step needs" replay does), notes the first event at
which the answer's metric reaches its peak (reserved and device_total: reserved bytes;
allocated: allocated bytes), and returns what was allocated then. On the CPU (no caching
allocator) the moment is the tensor sweep's peak node (`predictor.memory.analytic`). The
worst path is `simulate`'s: the largest peak reserved (the tensor peak on the CPU).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from memgnn.predictor.ir.graph import StepGraph
from memgnn.predictor.ir.vocab import PHASES
from memgnn.predictor.memory.analytic import STEP_NAMES, sweep
from memgnn.predictor.sim.allocator import AllocatorConfig, CachingAllocatorSim, SimulatedOOM
from memgnn.predictor.sim.replay.events import OP_ALLOC, OP_MARK
from memgnn.predictor.sim.simulate import trace_arrays
from memgnn.predictor.spec.devices import DeviceProfile

__all__ = ["CUBLAS_KEYS", "PeakMoment", "peak_moment", "sample_points", "step_timeline"]

CUBLAS_KEYS = ("cublas-main", "cublas-backward")


@dataclass(kw_only=True, slots=True)
class PeakMoment:
    """The peak: its path, the node whose allocation reached it (-1: before the first
    node), that node's phase and step, the allocator's figures then and the live blocks:
    storage uid -> requested bytes, plus the cuBLAS workspaces and a node's kernel scratch
    (`extra`: "cublas-main" / "cublas-backward" / "scratch-<node>" -> bytes)."""

    path: int
    metric: str
    node: int
    phase: str
    step: str
    allocated_bytes: int  # the allocator's (blocks rounded up); on the CPU the tensor bytes
    reserved_bytes: int | None  # None on the CPU
    peak_allocated_bytes: int  # over the whole step (the answer's figures)
    peak_reserved_bytes: int | None
    storages: dict[int, int] = field(default_factory=dict)
    extra: dict[str, int] = field(default_factory=dict)
    capacity_bytes: int | None = None  # the replay's device limit (None: unlimited)
    resolved: dict[str, int] = field(default_factory=dict)  # sizes with data symbols

    @property
    def requested_bytes(self) -> int:
        """The live tensors' own bytes (the allocator's `allocated` rounds each up)."""
        return sum(self.storages.values()) + sum(self.extra.values())


def peak_moment(
    graph: StepGraph, sizes: dict[str, int], device: DeviceProfile, *,
    scenario: str = "worst", metric: str = "reserved",
) -> PeakMoment:  # fmt: skip
    """The moment of the answer's peak and what is live then (see the module docstring)."""
    swept = sweep(graph, sizes, scenario=scenario)
    resolved = swept.sizes
    if not device.is_gpu:
        return _cpu_moment(graph, swept.path, resolved, swept.best.peak_node, metric)
    usable = None if device.total_bytes is None else device.total_bytes - device.context_bytes
    runs = [_replay(graph, k, resolved, device, usable) for k in range(len(graph.paths))]
    worst = max(range(len(runs)), key=lambda k: runs[k][1])  # simulate's choice (first max)
    return _live_at(graph, worst, resolved, device, metric, usable, runs[worst])


def _events(graph: StepGraph, path: int, resolved: dict[str, int], device: DeviceProfile):
    """(ops, keys, bytes) of the path's trace as lists (the simulator's own events)."""
    ev = trace_arrays(graph, path, resolved, device)
    return ev.op.tolist(), ev.key.tolist(), ev.nbytes.tolist()


def _replay(
    graph: StepGraph, path: int, resolved: dict[str, int], device: DeviceProfile,
    usable: int | None,
) -> tuple[int, int, int, int, int | None]:  # fmt: skip
    """(peak allocated, peak reserved, event of the allocated peak, of the reserved peak,
    capacity used) of one path; without a capacity where it would not fit."""
    ops, keys, nbytes = _events(graph, path, resolved, device)
    for capacity in dict.fromkeys((usable, None)):
        sim = CachingAllocatorSim(AllocatorConfig(capacity_bytes=capacity))
        handles: dict[int, int] = {}
        best_a = best_r = -1
        at_a = at_r = -1
        try:
            for i, (op, k, nb) in enumerate(zip(ops, keys, nbytes)):
                if op == OP_MARK:
                    continue
                if op == OP_ALLOC:
                    handles[k] = sim.malloc(nb)
                    if sim.allocated > best_a:
                        best_a, at_a = sim.allocated, i
                    if sim.reserved > best_r:
                        best_r, at_r = sim.reserved, i
                else:
                    sim.free(handles.pop(k))
        except SimulatedOOM:
            continue
        return max(best_a, 0), max(best_r, 0), at_a, at_r, capacity
    raise AssertionError("an unlimited replay cannot run out of memory")


def _live_at(
    graph: StepGraph, path: int, resolved: dict[str, int], device: DeviceProfile,
    metric: str, usable: int | None, run: tuple[int, int, int, int, int | None],
) -> PeakMoment:  # fmt: skip
    peak_a, peak_r, at_a, at_r, capacity = run
    at = at_a if metric == "allocated" else at_r
    ops, keys, nbytes = _events(graph, path, resolved, device)
    p = graph.paths[path]
    n_st = p.num_storages
    alloc = p.storages["alloc"]
    sim = CachingAllocatorSim(AllocatorConfig(capacity_bytes=capacity))
    handles: dict[int, int] = {}
    live: dict[int, int] = {}
    for op, k, nb in zip(ops[: at + 1], keys[: at + 1], nbytes[: at + 1]):
        if op == OP_MARK:
            continue
        if op == OP_ALLOC:
            handles[k] = sim.malloc(nb)
            live[k] = nb
        else:
            sim.free(handles.pop(k))
            del live[k]
    node = -1
    if at >= 0:
        k = keys[at]
        node = alloc[k] if k < n_st else (k - n_st - 2 if k >= n_st + 2 else -1)
        if node < 0:  # a cuBLAS workspace: the next node's (its first matmul)
            node = next((alloc[j] for j in keys[at + 1 :] if j < n_st and alloc[j] >= 0), -1)
    storages = {k: b for k, b in live.items() if k < n_st and b}  # an empty one holds nothing
    extra = {_extra_name(k, n_st): b for k, b in live.items() if k >= n_st and b}
    return PeakMoment(
        path=path,
        metric=metric,
        node=node,
        phase=PHASES[p.nodes["phase"][node]] if node >= 0 else "setup",
        step=STEP_NAMES[p.nodes["step"][node]] if node >= 0 else STEP_NAMES[0],
        allocated_bytes=sim.allocated,
        reserved_bytes=sim.reserved,
        peak_allocated_bytes=peak_a,
        peak_reserved_bytes=peak_r,
        storages=storages,
        extra=extra,
        capacity_bytes=capacity,
        resolved=resolved,
    )


def sample_points(allocated: list[int], reserved: list[int], most: int) -> list[int]:
    """Event indices to draw: all of them up to `most`; beyond, per bucket of events the
    ones with the highest allocated and reserved bytes (peaks stay visible)."""
    n = len(allocated)
    if n <= most:
        return list(range(n))
    step = -(-n // max(most // 2, 1))
    keep = set()
    for lo in range(0, n, step):
        hi = min(lo + step, n)
        keep.add(max(range(lo, hi), key=allocated.__getitem__))
        keep.add(max(range(lo, hi), key=reserved.__getitem__))
    return sorted(keep | {0, n - 1})


def step_timeline(
    graph: StepGraph, moment: PeakMoment, device: DeviceProfile, *, most: int = 1500
) -> dict[str, object] | None:
    """The memory timeline of the moment's path (None on the CPU: no caching allocator):
    allocated and reserved bytes after each alloc/free event of the same replay as
    `peak_moment`'s (its capacity), sampled to about `most` points (`sample_points`:
    bucket maxima), the (phase, step) spans in events ("setup": what is allocated before
    the first node), and the event of the peak."""
    if not device.is_gpu:
        return None
    ev = trace_arrays(graph, moment.path, moment.resolved, device)
    ops, keys, nbytes = ev.op.tolist(), ev.key.tolist(), ev.nbytes.tolist()
    sim = CachingAllocatorSim(AllocatorConfig(capacity_bytes=moment.capacity_bytes))
    handles: dict[int, int] = {}
    allocated: list[int] = []
    reserved: list[int] = []
    # before the first node: what the step starts with (parameters, optimizer state)
    spans: list[dict[str, object]] = [{"phase": "setup", "step": STEP_NAMES[0], "start": 0,
                                       "end": 0}]  # fmt: skip
    for op, k, nb in zip(ops, keys, nbytes):
        if op == OP_MARK:
            phase, step = ev.marks[k]
            if spans and spans[-1]["start"] == len(allocated):  # an empty span: replaced
                spans.pop()
            if spans and (spans[-1]["phase"], spans[-1]["step"]) == (phase, STEP_NAMES[step]):
                continue
            spans.append({"phase": phase, "step": STEP_NAMES[step], "start": len(allocated),
                          "end": len(allocated)})  # fmt: skip
            continue
        if op == OP_ALLOC:
            handles[k] = sim.malloc(nb)
        else:
            sim.free(handles.pop(k))
        allocated.append(sim.allocated)
        reserved.append(sim.reserved)
        spans[-1]["end"] = len(allocated)
    series = reserved if moment.metric != "allocated" else allocated
    peak_event = max(range(len(series)), key=series.__getitem__) if series else -1
    x = sample_points(allocated, reserved, most)
    return {
        "events": len(allocated),
        "event": x,
        "allocated": [allocated[i] for i in x],
        "reserved": [reserved[i] for i in x],
        "phases": spans,
        "peak_event": peak_event,
        "capacity_bytes": moment.capacity_bytes,
    }


def _extra_name(k: int, n_storages: int) -> str:
    if k < n_storages + 2:
        return CUBLAS_KEYS[k - n_storages]
    return f"scratch-{k - n_storages - 2}"


def _cpu_moment(
    graph: StepGraph, path: int, resolved: dict[str, int], node: int, metric: str
) -> PeakMoment:
    p = graph.paths[path]
    nbytes = graph.storage_bytes(path, resolved)
    alloc, free = p.array("storages", "alloc"), p.array("storages", "free")
    if node < 0:
        alive = alloc < 0
    else:
        alive = (alloc <= node) & ((free < 0) | (free >= node))
    storages = {int(u): int(nbytes[u]) for u in np.flatnonzero(alive) if nbytes[u] > 0}
    extra = {}
    if node >= 0 and p.num_nodes:
        scratch = int(graph.scratch_bytes(path, resolved)[node])
        if scratch:
            extra[f"scratch-{node}"] = scratch
    total = sum(storages.values()) + sum(extra.values())
    return PeakMoment(
        path=path,
        metric=metric,
        node=node,
        phase=PHASES[p.nodes["phase"][node]] if node >= 0 else "setup",
        step=STEP_NAMES[p.nodes["step"][node]] if node >= 0 else STEP_NAMES[0],
        allocated_bytes=total,
        reserved_bytes=None,
        peak_allocated_bytes=total,
        peak_reserved_bytes=None,
        storages=storages,
        extra=extra,
        resolved=resolved,
    )
