"""``predictor.sim.simulate.replay_trace`` on the compiled core: same input, same bytes."""

from __future__ import annotations

from typing import Any

from memgnn.predictor.memory.analytic import STEP_NAMES
from memgnn.predictor.sim.allocator import AllocatorConfig
from memgnn.predictor.sim.replay.api import replay_fast
from memgnn.predictor.sim.replay.events import OP_MARK, EventArrays, encode_events

__all__ = ["replay_trace_fast"]


def replay_trace_fast(events: list[tuple] | EventArrays, config: AllocatorConfig) -> dict[str, Any]:
    """Per-(step, phase) peaks of a ``build_trace`` trace; stops at the first OOM."""
    ev = events if isinstance(events, EventArrays) else encode_events(events)
    res = replay_fast(ev, config, stop_on_oom=True)
    phase_peaks: dict[str, dict[str, int]] = {}
    step_peaks: dict[str, dict[str, int]] = {}
    reached = len(ev.marks)
    if res.oom_event_index is not None:  # marks after the OOM were never opened
        reached = int((ev.op[: res.oom_event_index + 1] == OP_MARK).sum())
    for m in range(reached):
        phase, step = ev.marks[m]
        alloc, reserved = int(res.mark_peaks[0, m]), int(res.mark_peaks[1, m])
        for table, key in ((phase_peaks, phase), (step_peaks, STEP_NAMES[step])):
            prev = table.get(key, {"allocated": 0, "reserved": 0})
            table[key] = {
                "allocated": max(prev["allocated"], alloc),
                "reserved": max(prev["reserved"], reserved),
            }
    s = res.stats
    return {
        "peak_allocated_bytes": res.peak_allocated_bytes,
        "peak_reserved_bytes": res.peak_reserved_bytes,
        "phase_peaks": phase_peaks,
        "step_peaks": step_peaks,
        "num_alloc_retries": s.num_alloc_retries,
        "num_ooms": s.num_ooms,
        "inactive_split_bytes": s.inactive_split_bytes,
        "fragmentation_at_peak": res.fragmentation_at_peak,
        "would_oom": res.oom,
        "oom_message": res.oom_message,
    }
