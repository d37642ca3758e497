"""The `sim` backend: replay a captured step's alloc/free trace through the CUDA allocator.

The trace is the eager step's real order of storage allocations and frees (fake tensors on
the CPU, so sizes are exact), adjusted for what CUDA does differently:
- cuBLAS workspaces: one per (handle, stream), allocated at the first matmul of the main
  thread (forward) and of the autograd thread (backward), kept for the run;
- attention runs CUDA's kernels (FlashAttention-2 / memory-efficient, chosen at capture
  by `predictor.kernels` for the device's compute capability), and the scratch their
  backward allocates inside the op is allocated and freed around that node.
Then `dataset.allocator` gives peak allocated / reserved, fragmentation and OOM, per step
and phase. Where the device is the CPU, the tensor-level peak of the sweep is the answer.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from dataset.allocator import AllocatorConfig, CachingAllocatorSim, SimulatedOOM
from dataset.devices import DeviceProfile
from predictor.analytic import STEP_NAMES, sweep
from predictor.graph import StepGraph
from predictor.vocab import MATMUL_OPS, PHASES

log = logging.getLogger(__name__)


@dataclass(kw_only=True, slots=True)
class SimResult:
    peak_allocated_bytes: int
    peak_reserved_bytes: int | None
    device_total_bytes: int | None
    breakdown: dict[str, Any]
    stats: dict[str, Any]


def build_trace(
    graph: StepGraph, path: int, resolved: dict[str, int], device: DeviceProfile
) -> list[tuple]:
    """Ordered events: ("alloc", key, nbytes) / ("free", key, 0) / ("mark", phase, step)."""
    p = graph.paths[path]
    nbytes = graph.storage_bytes(path, resolved)
    scratch_at = graph.scratch_bytes(path, resolved)
    alloc = np.asarray(p.storages["alloc"])
    events: list[tuple] = [("alloc", int(u), int(nbytes[u])) for u in np.flatnonzero(alloc < 0)]
    allocs_at: dict[int, list[int]] = {}
    for u in np.flatnonzero(alloc >= 0):
        allocs_at.setdefault(int(alloc[u]), []).append(int(u))
    frees_at: dict[int, list[int]] = {}
    for u, f in enumerate(p.storages["free"]):
        if f >= 0:
            frees_at.setdefault(f, []).append(u)
    workspace_for: set[str] = set()
    mark = None
    for i, op in enumerate(p.nodes["op"]):
        phase = PHASES[p.nodes["phase"][i]]
        step = p.nodes["step"][i]
        if (phase, step) != mark:
            mark = (phase, step)
            events.append(("mark", phase, step))
        if device.is_gpu and op.startswith(MATMUL_OPS):
            handle = "backward" if phase == "backward" else "main"
            if handle not in workspace_for:
                workspace_for.add(handle)
                events.append(("alloc", f"cublas-{handle}", device.cublas_workspace_bytes))
        scratch = int(scratch_at[i]) if device.is_gpu else 0
        if scratch:
            events.append(("alloc", f"scratch-{i}", scratch))
        for u in allocs_at.get(i, ()):
            events.append(("alloc", u, int(nbytes[u])))
        if scratch:
            events.append(("free", f"scratch-{i}", 0))
        for u in frees_at.get(i, ()):
            events.append(("free", u, 0))
    return events


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
    replayer: Callable[[list[tuple], AllocatorConfig], dict[str, Any]] | None = None,
) -> SimResult:
    """Simulate every path of `graph` at `sizes` on `device`; the result is the worst path.

    `replayer` replaces `replay_trace` (same contract), e.g. the compiled
    `dataset.replay.trace.replay_trace_fast`."""
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
    run = replayer or replay_trace
    results = [
        run(build_trace(graph, k, swept.sizes, device), cfg) for k in range(len(graph.paths))
    ]
    worst = max(range(len(results)), key=lambda k: results[k]["peak_reserved_bytes"])
    r = results[worst]
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
        device_total_bytes=r["peak_reserved_bytes"] + device.context_bytes,
        breakdown=breakdown,
        stats=stats,
    )


def _usable(device: DeviceProfile) -> int | None:
    if device.total_bytes is None:
        return None
    return device.total_bytes - device.context_bytes


def _fields(cfg: AllocatorConfig) -> dict[str, Any]:
    return {name: getattr(cfg, name) for name in cfg.__slots__}
