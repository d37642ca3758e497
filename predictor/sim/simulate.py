"""The `sim` backend: replay a captured step's alloc/free trace through the CUDA allocator.

The trace is the eager step's real order of storage allocations and frees (fake tensors on
the CPU, so sizes are exact), adjusted for what CUDA does differently:
- cuBLAS workspaces: one per (handle, stream), allocated at the first matmul of the main
  thread (forward) and of the autograd thread (backward), kept for the run;
- attention runs CUDA's kernels (FlashAttention-2 / memory-efficient, chosen at capture
  by `predictor.emulate.kernels` for the device's compute capability), and the scratch their
  backward allocates inside the op is allocated and freed around that node.
Then `predictor.sim.allocator` gives peak allocated / reserved, fragmentation and OOM, per step
and phase. Where the device is the CPU, the tensor-level peak of the sweep is the answer.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from memgnn.predictor.emulate.parallel import annotate
from memgnn.predictor.ir.graph import StepGraph
from memgnn.predictor.ir.vocab import MATMUL_OPS, PHASES
from memgnn.predictor.memory.analytic import STEP_NAMES, sweep
from memgnn.predictor.memory.places import place_breakdown
from memgnn.predictor.sim.allocator import AllocatorConfig, CachingAllocatorSim, SimulatedOOM
from memgnn.predictor.sim.replay.events import OP_ALLOC, OP_FREE, OP_MARK, EventArrays
from memgnn.predictor.spec.devices import DeviceProfile

log = logging.getLogger(__name__)


@dataclass(kw_only=True, slots=True)
class SimResult:
    peak_allocated_bytes: int
    peak_reserved_bytes: int | None
    device_total_bytes: int | None
    breakdown: dict[str, Any]
    stats: dict[str, Any]


# event kinds of a trace skeleton (the order of a path's events, independent of sizes)
_ALLOC, _FREE, _MARK, _CUBLAS, _SCRATCH_ALLOC, _SCRATCH_FREE = range(6)
_OPCODE = np.array([OP_ALLOC, OP_FREE, OP_MARK, OP_ALLOC, OP_ALLOC, OP_FREE], dtype=np.int64)


def _skeleton(graph: StepGraph, path: int, gpu: bool) -> tuple[np.ndarray, list[tuple]]:
    """Kinds, keys and sources [3, n] of a path's events, and the mark labels (cached).

    Keys: storage u -> u; the cuBLAS workspaces -> S, S + 1; node i's scratch -> S + 2 + i.
    Sources: the storage (allocs), the node (scratch)."""
    p = graph.paths[path]

    def make() -> tuple[np.ndarray, list[tuple]]:
        n_storages = p.num_storages
        alloc, free = p.array("storages", "alloc"), p.array("storages", "free")
        zero = {i for i, e in enumerate(graph.exprs) if e == "0"}
        scratch = p.array("nodes", "scratch") if gpu else np.zeros(p.num_nodes, np.int64)
        rows: list[tuple[int, int, int]] = [
            (_ALLOC, int(u), int(u)) for u in np.flatnonzero(alloc < 0)
        ]
        allocs_at: dict[int, list[int]] = {}
        for u in np.flatnonzero(alloc >= 0):
            allocs_at.setdefault(int(alloc[u]), []).append(int(u))
        frees_at: dict[int, list[int]] = {}
        for u in np.flatnonzero(free >= 0):
            frees_at.setdefault(int(free[u]), []).append(int(u))
        workspace_for: set[str] = set()
        marks: list[tuple] = []
        mark = None
        for i, op in enumerate(p.nodes["op"]):
            phase = PHASES[p.nodes["phase"][i]]
            step = p.nodes["step"][i]
            if (phase, step) != mark:
                mark = (phase, step)
                rows.append((_MARK, len(marks), 0))
                marks.append(mark)
            if gpu and op.startswith(MATMUL_OPS):
                handle = "backward" if phase == "backward" else "main"
                if handle not in workspace_for:
                    workspace_for.add(handle)
                    rows.append((_CUBLAS, n_storages + (handle == "backward"), 0))
            has_scratch = gpu and int(scratch[i]) not in zero
            if has_scratch:
                rows.append((_SCRATCH_ALLOC, n_storages + 2 + i, i))
            rows.extend((_ALLOC, u, u) for u in allocs_at.get(i, ()))
            if has_scratch:
                rows.append((_SCRATCH_FREE, n_storages + 2 + i, i))
            rows.extend((_FREE, u, u) for u in frees_at.get(i, ()))
        return np.array(rows, dtype=np.int64).reshape(-1, 3).T.copy(), marks

    return p.cached(f"sim.trace_skeleton.{int(gpu)}", make)


def trace_arrays(
    graph: StepGraph, path: int, resolved: dict[str, int], device: DeviceProfile
) -> EventArrays:
    """The trace of `build_trace` as arrays: the cached skeleton with this query's bytes."""
    (kind, key, src), marks = _skeleton(graph, path, device.is_gpu)
    p = graph.paths[path]
    nbytes = np.zeros(len(kind), dtype=np.int64)
    storage_bytes = graph.storage_bytes(path, resolved)
    is_alloc = kind == _ALLOC
    nbytes[is_alloc] = storage_bytes[src[is_alloc]]
    keep = slice(None)
    if device.is_gpu:
        scratch = graph.scratch_bytes(path, resolved)
        nbytes[kind == _CUBLAS] = device.cublas_workspace_bytes
        is_scratch = (kind == _SCRATCH_ALLOC) | (kind == _SCRATCH_FREE)
        at = np.where(is_scratch, src, 0)
        scratch_here = scratch[at] if len(scratch) else np.zeros(len(kind), np.int64)
        nbytes[kind == _SCRATCH_ALLOC] = scratch_here[kind == _SCRATCH_ALLOC]
        keep = ~is_scratch | (scratch_here != 0)
    return EventArrays(
        op=_OPCODE[kind[keep]],
        key=key[keep],
        nbytes=nbytes[keep],
        stream=np.zeros(len(nbytes[keep]), dtype=np.int64),
        n_keys=p.num_storages + 2 + p.num_nodes,
        marks=marks,
    )


def build_trace(
    graph: StepGraph, path: int, resolved: dict[str, int], device: DeviceProfile
) -> list[tuple]:
    """Ordered events: ("alloc", key, nbytes) / ("free", key, 0) / ("mark", phase, step).

    Keys: storage ids, "cublas-main" / "cublas-backward" (one workspace per thread running
    a matmul, allocated at its first matmul) and "scratch-i" (kernel scratch of node i,
    allocated before node i's outputs and freed after them)."""
    ev = trace_arrays(graph, path, resolved, device)
    n_storages = graph.paths[path].num_storages

    def name(k: int) -> object:
        if k < n_storages:
            return k
        if k < n_storages + 2:
            return "cublas-backward" if k > n_storages else "cublas-main"
        return f"scratch-{k - n_storages - 2}"

    out: list[tuple] = []
    for op, k, nb in zip(ev.op.tolist(), ev.key.tolist(), ev.nbytes.tolist()):
        if op == OP_MARK:
            out.append(("mark", *ev.marks[k]))
        else:
            out.append(("alloc", name(k), nb) if op == OP_ALLOC else ("free", name(k), 0))
    return out


def replay_trace(events: list[tuple], config: AllocatorConfig) -> dict[str, Any]:
    """Replay with per-(step, phase) peaks; stops at the first OOM."""
    sim = CachingAllocatorSim(config)
    handles: dict[Any, int] = {}
    phase_peaks: dict[str, dict[str, int]] = {}
    step_peaks: dict[str, dict[str, int]] = {}
    current: tuple[str, int] | None = None
    oom: str | None = None

    def close_mark() -> None:
        if current is None:
            return
        s = sim.stats()
        phase, step = current
        for table, key in ((phase_peaks, phase), (step_peaks, STEP_NAMES[step])):
            prev = table.get(key, {"allocated": 0, "reserved": 0})
            table[key] = {
                "allocated": max(prev["allocated"], s.peak_allocated_bytes),
                "reserved": max(prev["reserved"], s.peak_reserved_bytes),
            }

    overall_alloc = overall_res = 0
    best_reserved, frag_at_peak = -1, 1.0
    for ev in events:
        if ev[0] == "mark":
            close_mark()
            s = sim.stats()
            overall_alloc = max(overall_alloc, s.peak_allocated_bytes)
            overall_res = max(overall_res, s.peak_reserved_bytes)
            sim.reset_peak_stats()
            current = (ev[1], ev[2])
            continue
        if ev[0] == "alloc":
            try:
                handles[ev[1]] = sim.malloc(ev[2])
            except SimulatedOOM as exc:
                oom = str(exc).splitlines()[0]
                break
            if sim.reserved > best_reserved:  # a new overall peak: note its fragmentation
                best_reserved, frag_at_peak = sim.reserved, sim.stats().fragmentation
        else:
            sim.free(handles.pop(ev[1]))
    close_mark()
    s = sim.stats()
    return {
        "peak_allocated_bytes": max(overall_alloc, s.peak_allocated_bytes),
        "peak_reserved_bytes": max(overall_res, s.peak_reserved_bytes),
        "phase_peaks": phase_peaks,
        "step_peaks": step_peaks,
        "num_alloc_retries": s.num_alloc_retries,
        "num_ooms": s.num_ooms,
        "inactive_split_bytes": s.inactive_split_bytes,
        "fragmentation_at_peak": frag_at_peak,
        "would_oom": oom is not None,
        "oom_message": oom,
    }


def simulate(
    graph: StepGraph,
    sizes: dict[str, int],
    device: DeviceProfile,
    *,
    scenario: str = "balanced",
    allocator: AllocatorConfig | None = None,
    replayer: Callable[[EventArrays, AllocatorConfig], dict[str, Any]] | None = None,
    snapshot_path: str | None = None,
) -> SimResult:
    """Simulate every path of `graph` at `sizes` on `device`; the result is the worst path.

    `replayer` replaces `replay_trace` (same result) and gets the `trace_arrays` of each
    path, e.g. the compiled `predictor.sim.replay.trace.replay_trace_fast`.
    `snapshot_path`: also write the worst path's step as a `_dump_snapshot` pickle
    (`predictor.snapshot.export`; gzip if it ends in .gz). GPU devices only."""
    swept = sweep(graph, sizes, scenario=scenario)
    breakdown: dict[str, Any] = {
        "categories": swept.best.breakdown,
        "tensor_peak_bytes": swept.peak_bytes,
        "tensor_step_peaks": swept.best.step_peaks,
        "tensor_phase_peaks": swept.best.phase_peaks,
        "paths": [
            {"conditions": p.conditions, "tensor_peak_bytes": p.peak_bytes} for p in swept.paths
        ],
    }
    # a sharded step: one rank's peak, and which (under --pp: the worst stage)
    annotate(breakdown, graph.train, breakdown["paths"])
    # offloading: host and unified-memory figures of the worst path, each its own number
    breakdown.update(place_breakdown(graph, swept.path, swept.sizes, gpu=device.is_gpu))
    stats: dict[str, Any] = {"scenario": scenario, "violated_guards": swept.violated_guards}
    if not device.is_gpu:
        return SimResult(
            peak_allocated_bytes=swept.peak_bytes,
            peak_reserved_bytes=None,
            device_total_bytes=None,
            breakdown=breakdown,
            stats=stats,
        )
    cfg = allocator or AllocatorConfig()
    if cfg.capacity_bytes is None:
        cfg = AllocatorConfig(**{**_fields(cfg), "capacity_bytes": _usable(device)})
    if replayer is None:
        traces = [build_trace(graph, k, swept.sizes, device) for k in range(len(graph.paths))]
        results = [replay_trace(t, cfg) for t in traces]
    else:
        arrays = [trace_arrays(graph, k, swept.sizes, device) for k in range(len(graph.paths))]
        results = [replayer(a, cfg) for a in arrays]
    worst = max(range(len(results)), key=lambda k: results[k]["peak_reserved_bytes"])
    r = results[worst]
    if worst != swept.path:  # the figures off the device of the path the answer is
        breakdown.update(place_breakdown(graph, worst, swept.sizes, gpu=True))
    breakdown.update(
        phases=r["phase_peaks"],
        first_step=r["step_peaks"].get("first"),
        steady_state=r["step_peaks"].get("steady"),
        cublas_workspace_bytes=device.cublas_workspace_bytes,
        context_bytes=device.context_bytes,
    )
    for k, res in enumerate(results):
        breakdown["paths"][k].update(
            peak_allocated_bytes=res["peak_allocated_bytes"],
            peak_reserved_bytes=res["peak_reserved_bytes"],
        )
    stats.update(
        {
            k: r[k]
            for k in (
                "num_alloc_retries",
                "num_ooms",
                "inactive_split_bytes",
                "fragmentation_at_peak",
                "would_oom",
                "oom_message",
            )
        }
    )
    return SimResult(
        peak_allocated_bytes=r["peak_allocated_bytes"],
        peak_reserved_bytes=r["peak_reserved_bytes"],
        # + unified memory (paged optimizer states): resident on the device, not reserved
        device_total_bytes=r["peak_reserved_bytes"]
        + device.context_bytes
        + breakdown.get("managed_peak_bytes", 0),
        breakdown=breakdown,
        stats=stats,
    )


def _usable(device: DeviceProfile) -> int | None:
    if device.total_bytes is None:
        return None
    return device.total_bytes - device.context_bytes


def _fields(cfg: AllocatorConfig) -> dict[str, Any]:
    return {name: getattr(cfg, name) for name in cfg.__slots__}
