"""Write a simulated run as a ``torch.cuda.memory._dump_snapshot()`` file.

:class:`SnapshotRecorder` wraps :class:`predictor.sim.allocator.CachingAllocatorSim` and
records what PyTorch's allocator records with ``_record_memory_history``: the trace
actions ``segment_alloc``, ``alloc``, ``free_requested``, ``free_completed`` and
``segment_free`` (with ``addr``, ``size`` = requested bytes, ``stream``, optional
``frames``), and at the end ``segments`` with their ``blocks``. So a memgnn prediction
opens in PyTorch's memory viewer (pytorch.org/memory_viz) and in ``memgnn snapshot
replay``. Each event may carry a ``category`` (memgnn's storage category) and an alloc a
``phase`` and ``step`` (from the simulated trace's phase markers; ``setup`` before the
first); neither is a PyTorch field, and viewers ignore them.

:func:`step_snapshot` does this for a captured training step (the path with the highest
simulated reserved peak), with frames naming the node: the source line the capture recorded
(`predictor.ir.sources`), then the module path with the op, phase and step.
"""

from __future__ import annotations

import dataclasses
import gzip
import logging
import pickle
from pathlib import Path
from typing import Any

from memgnn.predictor.errors import UserError
from memgnn.predictor.ir.graph import StepGraph
from memgnn.predictor.ir.sources import node_sources
from memgnn.predictor.ir.vocab import CATEGORIES, PHASES
from memgnn.predictor.memory.analytic import STEP_NAMES, sweep
from memgnn.predictor.sim.allocator import AllocatorConfig, CachingAllocatorSim, SimulatedOOM
from memgnn.predictor.sim.simulate import build_trace, replay_trace
from memgnn.predictor.spec.devices import DeviceProfile

logger = logging.getLogger(__name__)

__all__ = ["SnapshotRecorder", "simulated_step_snapshot", "step_snapshot", "write_snapshot"]


class SnapshotRecorder:
    """A simulator that records its run in PyTorch's snapshot format (native segments)."""

    def __init__(self, config: AllocatorConfig | None = None) -> None:
        self.sim = CachingAllocatorSim(config)
        if self.sim.config.expandable_segments:
            raise UserError("snapshot export supports native segments (expandable_segments off)")
        self.trace: list[dict[str, Any]] = []
        self._info: dict[int, dict[str, Any]] = {}  # live handle -> frames / category
        self.sim.segment_observer = self._segment

    def _segment(self, action: str, addr: int, size: int, stream: int) -> None:
        self.trace.append({"action": action, "addr": addr, "size": size, "stream": stream})

    def malloc(
        self,
        size: int,
        stream: int = 0,
        *,
        frames: list[dict[str, Any]] | None = None,
        category: str | None = None,
        phase: tuple[str, str] | None = None,
    ) -> int:
        """Allocate; a zero-byte request records nothing (PyTorch returns null).
        ``phase``: (phase, step) written on the alloc event only."""
        handle = self.sim.malloc(size, stream)
        if handle == 0:
            return 0
        ev: dict[str, Any] = {"action": "alloc", "addr": handle, "size": size, "stream": stream}
        extra: dict[str, Any] = {}
        if frames is not None:
            extra["frames"] = frames
        if category is not None:
            extra["category"] = category
        marks = {} if phase is None else {"phase": phase[0], "step": phase[1]}
        self.trace.append(ev | extra | marks)
        self._info[handle] = extra | {"requested": size, "stream": stream}
        return handle

    def free(self, handle: int) -> None:
        if handle == 0:
            return
        info = self._info.pop(handle)
        size, stream = info["requested"], info["stream"]
        extra = {k: info[k] for k in ("frames", "category") if k in info}
        for action in ("free_requested", "free_completed"):
            ev = {"action": action, "addr": handle, "size": size, "stream": stream}
            self.trace.append(ev | extra)
        self.sim.free(handle)

    def empty_cache(self) -> None:
        self.sim.empty_cache()

    def snapshot(self) -> dict[str, Any]:
        """The ``_dump_snapshot`` dict of the state now and the trace so far."""
        segments = []
        for seg in self.sim.snapshot():
            blocks = []
            for b in seg["blocks"]:
                block = {
                    "address": b["address"],
                    "size": b["size"],
                    "requested_size": b["requested_size"],
                    "state": "active_allocated" if b["allocated"] else "inactive",
                }
                info = self._info.get(b["address"]) if b["allocated"] else None
                if info and "frames" in info:
                    block["frames"] = info["frames"]
                blocks.append(block)
            allocated = sum(b["size"] for b in blocks if b["state"] != "inactive")
            segments.append(
                {
                    "device": 0,
                    "address": seg["address"],
                    "total_size": seg["size"],
                    "allocated_size": allocated,
                    "active_size": allocated,
                    "requested_size": sum(b["requested_size"] for b in blocks),
                    "stream": seg["stream"],
                    "segment_type": seg["pool"],
                    "segment_pool_id": (0, 0),
                    "is_expandable": False,
                    "blocks": blocks,
                }
            )
        cfg = self.sim.config
        return {
            "segments": segments,
            "device_traces": [list(self.trace)],
            "allocator_settings": {
                "PYTORCH_CUDA_ALLOC_CONF": "",
                "max_split_size": -1 if cfg.max_split_size is None else cfg.max_split_size,
                "garbage_collection_threshold": cfg.garbage_collection_threshold or 0.0,
                "expandable_segments": False,
                "roundup_power2_divisions": {"1": cfg.roundup_power2_divisions},
            },
        }


def _frames(
    graph: StepGraph, path: int, node: int, sources: list[str] | None
) -> list[dict[str, Any]]:
    """A node's frames, innermost first as PyTorch records them: the line of the user's
    code that made the tensor (where the capture recorded it), then the module path with
    the op, phase and step (`line` is the node's index in the path)."""
    p = graph.paths[path]
    phase, step = PHASES[p.nodes["phase"][node]], STEP_NAMES[p.nodes["step"][node]]
    module = p.nodes["module"][node] or "<model>"
    name = f"{p.nodes['op'][node]} [{phase}, {step}]"
    frames = [{"filename": module, "line": node, "name": name}]
    where = sources[node] if sources else ""
    file, _, line = where.rpartition(":")
    if file and line.isdigit():
        frames.insert(0, {"filename": file, "line": int(line), "name": name})
    return frames


def step_snapshot(
    graph: StepGraph,
    resolved: dict[str, int],
    device: DeviceProfile,
    config: AllocatorConfig,
    *,
    path: int,
) -> dict[str, Any]:
    """The simulated step of ``graph``'s ``path`` as a snapshot dict (stops at an OOM)."""
    p = graph.paths[path]
    alloc_node, category = p.storages["alloc"], p.storages["category"]
    rec = SnapshotRecorder(config)
    handles: dict[Any, int] = {}
    phase = ("setup", STEP_NAMES[0])  # before the trace's first phase marker
    sources = node_sources(graph, path)
    for ev in build_trace(graph, path, resolved, device):
        op, key = ev[0], ev[1]
        if op == "mark":
            phase = (ev[1], STEP_NAMES[ev[2]])
            continue
        if op == "free":
            rec.free(handles.pop(key))
            continue
        if isinstance(key, str) and key.startswith("cublas-"):
            frames, cat = [{"filename": "cuBLAS", "line": 0, "name": key}], "workspace"
        elif isinstance(key, str):  # scratch-<node>
            node = int(key.split("-", 1)[1])
            frames, cat = _frames(graph, path, node, sources), "scratch"
        else:
            node = alloc_node[key]
            frames = _frames(graph, path, node, sources) if node >= 0 else None
            cat = CATEGORIES[category[key]]
        try:
            handles[key] = rec.malloc(ev[2], frames=frames, category=cat, phase=phase)
        except SimulatedOOM:
            cap = rec.sim.config.capacity_bytes  # PyTorch records what CUDA reports free
            free = 0 if cap is None else max(cap - rec.sim.reserved, 0)
            rec.trace.append({"action": "oom", "size": ev[2], "device_free": free, "stream": 0})
            logger.info("export: simulated OOM at a %d-byte request; trace ends there", ev[2])
            break
    return rec.snapshot()


def simulated_step_snapshot(
    graph: StepGraph,
    sizes: dict[str, int],
    device: DeviceProfile,
    *,
    scenario: str = "balanced",
    allocator: AllocatorConfig | None = None,
) -> dict[str, Any]:
    """The snapshot of the path :func:`predictor.sim.simulate.simulate` reports (highest reserved
    peak), at ``sizes`` on a GPU ``device`` (capacity: the device minus its context)."""
    if not device.is_gpu:
        raise UserError("a snapshot needs a GPU device profile (the CUDA allocator)")
    swept = sweep(graph, sizes, scenario=scenario)
    usable = None if device.total_bytes is None else device.total_bytes - device.context_bytes
    cfg = allocator or AllocatorConfig(capacity_bytes=usable)
    if cfg.capacity_bytes is None:  # as `simulate` does: the device's usable bytes
        cfg = dataclasses.replace(cfg, capacity_bytes=usable)
    peaks = [
        replay_trace(build_trace(graph, k, swept.sizes, device), cfg)["peak_reserved_bytes"]
        for k in range(len(graph.paths))
    ]
    worst = max(range(len(peaks)), key=peaks.__getitem__)
    return step_snapshot(graph, swept.sizes, device, cfg, path=worst)


def write_snapshot(snapshot: dict[str, Any], path: str | Path) -> Path:
    """Pickle ``snapshot`` (gzip when the name ends in .gz), as ``_dump_snapshot`` does."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = pickle.dumps(snapshot, protocol=pickle.HIGHEST_PROTOCOL)
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
    return path
