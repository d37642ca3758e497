"""The replay report (the ``memgnn snapshot replay`` contract) and the OOM post-mortem.

``replay_report`` runs the recorded pass and one simulated pass of a snapshot
(:mod:`predictor.snapshot.replay`) under the recorded settings or a what-if
``PYTORCH_CUDA_ALLOC_CONF``; with a capacity it says whether the run would OOM, and for
an OOM, the first failing request, the bytes at that moment, and which of the
alternative settings would have avoided it.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from memgnn.predictor.errors import UserError
from memgnn.predictor.sim.allocator import AllocatorConfig
from memgnn.predictor.snapshot.conf import allocator_config, recorded_alloc_conf
from memgnn.predictor.snapshot.loader import Snapshot
from memgnn.predictor.snapshot.replay import (
    RecordedTimeline,
    SimulatedRun,
    blocks_differing,
    dump_blocks,
    recorded_timeline,
    simulate_snapshot,
)
from memgnn.predictor.snapshot.state import InitialState, initial_state

logger = logging.getLogger(__name__)

__all__ = ["ALTERNATIVES", "CONTRACT_FIELDS", "replay_devices", "replay_report"]

CONTRACT_FIELDS = (
    "initial_reserved_bytes",
    "recorded_peak_reserved_bytes",
    "simulated_peak_reserved_bytes",
    "recorded_peak_allocated_bytes",
    "simulated_peak_allocated_bytes",
    "recorded_segment_allocs",
    "simulated_segment_allocs",
    "segment_allocs_matched",
    "first_divergence",
    "fragmentation_at_peak",
    "would_oom",
    "alloc_conf",
)
# Settings tried when a replay OOMs at --capacity (each alone, PyTorch defaults otherwise).
ALTERNATIVES = (
    "expandable_segments:True",
    "max_split_size_mb:128",
    "max_split_size_mb:512",
    "roundup_power2_divisions:4",
    "roundup_power2_divisions:8",
)


def _same_settings(a: AllocatorConfig, b: AllocatorConfig) -> bool:
    keys = [k for k in a.__slots__ if k not in ("capacity_bytes", "memory_fraction")]
    return all(getattr(a, k) == getattr(b, k) for k in keys)


def _matched_prefix(recorded: list[int], simulated: list[int]) -> int:
    n = 0
    for r, s in zip(recorded, simulated):
        if r != s:
            break
        n += 1
    return n


def replay_report(
    snap: Snapshot,
    *,
    alloc_conf: str | None = None,
    capacity_bytes: int | None = None,
    memory_fraction: float | None = None,
    state: InitialState | None = None,
    alternatives: tuple[str, ...] = ALTERNATIVES,
) -> dict[str, Any]:
    """The contract fields (bytes) plus details; ``alloc_conf=None`` = as recorded.

    ``memory_fraction`` (of ``capacity_bytes``) is the per-process limit; with it the
    OOM post-mortem also tries ``garbage_collection_threshold:0.8``."""
    if capacity_bytes is not None and capacity_bytes <= 0:
        raise UserError(f"capacity must be a positive number of bytes, got {capacity_bytes}")
    t0 = time.perf_counter()
    state = state or initial_state(snap)
    recorded_conf = recorded_alloc_conf(snap.allocator_settings)
    base_cfg = allocator_config(recorded_conf)
    conf = recorded_conf if alloc_conf is None else alloc_conf
    limit = {"capacity_bytes": capacity_bytes, "memory_fraction": memory_fraction}
    cfg = allocator_config(conf, **limit)
    as_recorded = _same_settings(cfg, base_cfg)
    rec = recorded_timeline(snap, state)
    dump = dump_blocks(snap)
    t_sim = time.perf_counter()
    run = simulate_snapshot(snap, cfg, recorded_settings=as_recorded, state=state)
    sim_seconds = time.perf_counter() - t_sim
    events = len(snap.trace)
    out: dict[str, Any] = {
        "initial_reserved_bytes": state.reserved_bytes,
        "recorded_peak_reserved_bytes": rec.peak_reserved_bytes,
        "simulated_peak_reserved_bytes": run.peak_reserved_bytes,
        "recorded_peak_allocated_bytes": rec.peak_allocated_bytes,
        "simulated_peak_allocated_bytes": run.peak_allocated_bytes,
        "recorded_segment_allocs": len(rec.segment_allocs),
        "simulated_segment_allocs": len(run.segment_allocs),
        "segment_allocs_matched": _matched_prefix(rec.segment_allocs, run.segment_allocs),
        "first_divergence": run.first_divergence,
        "fragmentation_at_peak": round(run.fragmentation_at_peak, 6),
        "would_oom": None if capacity_bytes is None else run.oom is not None,
        "alloc_conf": conf,
        # details
        "as_recorded": as_recorded,
        "recorded_alloc_conf": recorded_conf,
        "capacity_bytes": capacity_bytes,
        "memory_fraction": memory_fraction,
        "initial_state": run.initial_state,
        "initial_allocated_bytes": state.allocated_bytes,
        "initial_segments": len(state.segments),
        "initial_orphan_blocks": len(state.orphans),  # pre-trace blocks in no known segment
        "recorded_fragmentation_at_peak": round(rec.fragmentation_at_peak, 6),
        "largest_free_block_at_peak_bytes": run.largest_free_at_peak_bytes,
        "free_reserved_at_peak_bytes": run.free_reserved_at_peak_bytes,
        "trace_requests": sum(1 for e in snap.trace if e["action"] == "alloc"),
        "requests": run.requests,  # replayed (up to an OOM)
        "requests_at_recorded_address": run.addresses_matched,
        "recorded_model_error": rec.model_error,
        # the state at the end against the file's dump (blocks by address, size, state)
        "dump_blocks": len(dump),
        "recorded_final_blocks_differing": blocks_differing(rec.final_blocks, dump),
        "simulated_final_blocks_differing": (
            blocks_differing(run.final_blocks, dump) if run.oom is None else None
        ),
        "recorded_oom_events": [i for i, e in enumerate(snap.trace) if e["action"] == "oom"],
        "events": events,
        "simulated_replay_seconds": round(sim_seconds, 6),
        "events_per_second": int(run.events_replayed / sim_seconds) if sim_seconds else None,
        "oom": run.oom,
    }
    if run.oom is not None:
        out["oom"] = run.oom | {"avoided_by": _alternatives(snap, state, limit, conf, alternatives)}
    if state.expandable:
        out |= _mapped(snap, state, rec, run)
    if run.recorded_ooms:  # recorded `oom` events beside the simulated state then
        out["recorded_ooms"] = run.recorded_ooms
    if snap.double_frees:  # tolerated (--tolerate-double-free); skipped by both passes
        out["double_frees_skipped"] = snap.double_frees
    out["seconds"] = round(time.perf_counter() - t0, 6)
    return out


def replay_devices(snaps: list[Snapshot], **kwargs: Any) -> dict[str, Any]:
    """:func:`replay_report` of each device's snapshot; with several, the first device's
    report at the top (the single-device contract) plus ``devices``: every report, each
    with its ``device``."""
    reports = [{"device": s.device} | replay_report(s, **kwargs) for s in snaps]
    if len(reports) == 1:
        return {k: v for k, v in reports[0].items() if k != "device"}
    return reports[0] | {"devices": reports}


def _mapped(
    snap: Snapshot, state: InitialState, rec: RecordedTimeline, run: SimulatedRun
) -> dict[str, Any]:
    """Expandable segments: the pages mapped (reserved bytes are mapped bytes)."""
    maps = [e["size"] for e in snap.trace if e["action"] == "segment_map"]
    unmaps = [e["size"] for e in snap.trace if e["action"] == "segment_unmap"]
    sim_end = run.reserved[-1] if run.reserved else state.reserved_bytes
    out = {
        "segments": "expandable",  # segment allocs above count segment_map events
        "recorded_segment_maps": len(maps),
        "recorded_segment_unmaps": len(unmaps),
        "recorded_mapped_bytes": sum(maps),
        "recorded_unmapped_bytes": sum(unmaps),
        "simulated_mapped_bytes": sum(run.segment_allocs),
        "simulated_unmapped_bytes": state.reserved_bytes + sum(run.segment_allocs) - sim_end,
        "recorded_final_mapped_bytes": rec.reserved[-1] if rec.reserved else 0,
        "simulated_final_mapped_bytes": sim_end,
        "dump_mapped_bytes": sum(s["total_size"] for s in snap.segments),
    }
    if run.initial_state == "live_blocks":
        out["initial_state_note"] = (
            f"the recording began with {state.reserved_bytes} bytes mapped in "
            f"{len(state.mapped)} ranges and {len(state.blocks)} live blocks; the simulator "
            "cannot be seeded with mapped pages at given addresses, so its pass starts from "
            "the live blocks only (its peaks are not the recording's)"
        )
    return out


def _alternatives(
    snap: Snapshot,
    state: InitialState,
    limit: dict[str, Any],
    current: str,
    alternatives: tuple[str, ...],
) -> list[dict[str, Any]]:
    """Each alternative setting that replays without an OOM, with its peaks."""
    found = []
    if limit["memory_fraction"] is not None:
        alternatives = (*alternatives, "garbage_collection_threshold:0.8")
    for conf in alternatives:
        if conf == current:
            continue
        cfg = allocator_config(conf, **limit)
        run: SimulatedRun = simulate_snapshot(snap, cfg, recorded_settings=False, state=state)
        logger.info("what-if %s: oom=%s", conf, run.oom is not None)
        if run.oom is None:
            found.append(
                {
                    "alloc_conf": conf,
                    "simulated_peak_reserved_bytes": run.peak_reserved_bytes,
                    "simulated_peak_allocated_bytes": run.peak_allocated_bytes,
                    "initial_state": run.initial_state,
                }
            )
    return found
