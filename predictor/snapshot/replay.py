"""Replay a snapshot's requests through :class:`predictor.sim.allocator.CachingAllocatorSim`.

Two passes over the trace, both from the state when recording began
(:mod:`predictor.snapshot.state`):

* **recorded**: a simulator that takes the recorded placement of every request
  (``malloc_at``) and the recorded ``segment_alloc`` / ``segment_free``: the recorded
  reserved and allocated bytes (block sizes by the rounding and split rules) per event.
* **simulated**: the simulator's own decisions for the same ``alloc`` /
  ``free_completed`` requests. With the recorded settings, a ``segment_free`` in the
  trace (``empty_cache`` or the OOM retry's release) frees the simulated segment that
  corresponds to the recorded one; under other settings (a what-if) the first
  ``segment_free`` of a run is an ``empty_cache()``.

The simulated segment allocations are compared with the recorded ones in order and size,
and every request's address with the recorded one (through the segment map):
``first_divergence`` is the first event where either differs.
"""

from __future__ import annotations

import bisect
import logging
import time
from typing import Any

from memgnn.predictor.sim.allocator import AllocatorConfig, CachingAllocatorSim, SimulatedOOM
from memgnn.predictor.snapshot.expandable import recorded_expandable, simulate_expandable
from memgnn.predictor.snapshot.loader import Snapshot
from memgnn.predictor.snapshot.runs import (
    RecordedTimeline,
    SimulatedRun,
    diverged,
    fragmentation,
    oom_record,
    recorded_oom,
    sim_blocks,
)
from memgnn.predictor.snapshot.state import InitialState, initial_state, seed, seed_live_blocks

logger = logging.getLogger(__name__)

__all__ = [
    "RecordedTimeline",  # re-exported from predictor.snapshot.runs
    "SimulatedRun",
    "blocks_differing",
    "dump_blocks",
    "recorded_timeline",
    "simulate_snapshot",
]


def dump_blocks(snap: Snapshot) -> dict[int, tuple[int, bool]]:
    """The dump's blocks (the state when the snapshot was taken): address -> (size,
    allocated); pending frees count as allocated, as they do in the allocator."""
    return {
        b["address"]: (b["size"], b.get("state", "inactive") != "inactive")
        for seg in snap.segments
        for b in seg.get("blocks", ())
    }


def blocks_differing(a: dict[int, tuple[int, bool]], b: dict[int, tuple[int, bool]]) -> int:
    return sum(1 for k in a.keys() | b.keys() if a.get(k) != b.get(k))


def recorded_timeline(snap: Snapshot, state: InitialState | None = None) -> RecordedTimeline:
    """Follow the recorded placements; stops following at the first impossible step."""
    state = state or initial_state(snap)
    if state.expandable:
        return recorded_expandable(snap, state)
    sim = CachingAllocatorSim()
    handles = seed(sim, state)
    allocated, reserved, seg_allocs = [], [], []
    error = None
    peak_a, peak_a_at, peak_r, frag = sim.allocated, -1, sim.reserved, fragmentation(sim)[0]
    skip = set(snap.double_frees)  # tolerated double frees: skipped
    for i, ev in enumerate(snap.trace):
        act = ev["action"]
        try:
            if error is not None:
                pass
            elif act == "alloc":
                handles[ev["addr"]] = sim.malloc_at(ev["addr"], ev["size"], ev.get("stream", 0))
            elif act == "free_completed" and i not in skip:
                h = handles.pop(ev["addr"], None)
                if h is not None:
                    sim.free(h)
            elif act == "segment_alloc":
                sim.add_segment(ev["addr"], ev["size"], stream=ev.get("stream", 0))
            elif act == "segment_free":
                sim.release_segment(ev["addr"])
        except ValueError as exc:
            error = {"event": i, "action": act, "addr": ev.get("addr"), "reason": str(exc)}
            logger.warning("recorded event %d cannot be reproduced: %s", i, exc)
        if act == "segment_alloc":
            seg_allocs.append(ev["size"])
        allocated.append(sim.allocated)
        reserved.append(sim.reserved)
        if sim.allocated > peak_a:
            peak_a, peak_a_at = sim.allocated, i
        if act == "alloc" and sim.reserved > peak_r:  # as the simulated pass measures it
            peak_r, frag = sim.reserved, fragmentation(sim)[0]
    return RecordedTimeline(
        allocated=allocated,
        reserved=reserved,
        segment_allocs=seg_allocs,
        peak_allocated_bytes=peak_a,
        peak_reserved_bytes=peak_r,
        peak_allocated_event=peak_a_at,
        fragmentation_at_peak=frag,
        model_error=error,
        final_blocks=sim_blocks(sim),
    )


class _SegmentMap:
    """Recorded segment base -> simulated base, and the recorded segment of an address."""

    def __init__(self, state: InitialState, identity: bool) -> None:
        self.sim_of: dict[int, int] = {s.address: s.address for s in state.segments}
        if not identity:
            self.sim_of.clear()
        self.bases = sorted(s.address for s in state.segments)
        self.size = {s.address: s.size for s in state.segments}

    def add(self, rec: int, size: int) -> None:
        bisect.insort(self.bases, rec)
        self.size[rec] = size

    def remove(self, rec: int) -> None:
        k = bisect.bisect_left(self.bases, rec)
        if k < len(self.bases) and self.bases[k] == rec:
            del self.bases[k]

    def expected(self, addr: int) -> int | None:
        k = bisect.bisect_right(self.bases, addr) - 1
        if k < 0:
            return None
        base = self.bases[k]
        sim = self.sim_of.get(base)
        if sim is None or addr >= base + self.size[base]:
            return None
        return sim + addr - base


def simulate_snapshot(
    snap: Snapshot,
    config: AllocatorConfig | None = None,
    *,
    recorded_settings: bool = True,
    recorded_addresses: bool = True,
    state: InitialState | None = None,
) -> SimulatedRun:
    """The simulator's own run of the snapshot's requests (module docstring).

    ``recorded_settings`` says ``config`` is what the recording ran with (segment frees
    follow the recorded ones); otherwise it is a what-if. With ``recorded_addresses`` (and
    native segments) a new segment gets the address the recorded ``cudaMalloc`` returned
    for the same request, when the size is the same and the range is free in the
    simulation (it decides best-fit ties: lowest address first); otherwise, and without,
    the simulator's own address above every earlier segment. Stops at a simulated OOM.
    """
    cfg = config or AllocatorConfig()
    state = state or initial_state(snap)
    if state.expandable and cfg.expandable_segments:
        return simulate_expandable(snap, cfg, state)
    sim = CachingAllocatorSim(cfg)
    t0 = time.perf_counter()
    if cfg.expandable_segments or state.expandable:  # no recorded native cache to seed
        mode, handles = "live_blocks", seed_live_blocks(sim, state)
    else:
        mode, handles = "recorded", seed(sim, state)
    segmap = _SegmentMap(state, identity=mode == "recorded")
    sim_new: list[tuple[str, int, int]] = []
    sim.segment_observer = lambda act, addr, size, stream: sim_new.append((act, addr, size))
    rec_pending: list[tuple[int, int]] = []
    if mode == "recorded" and recorded_addresses:
        sim.segment_address_hint = _RecordedAddresses(sim, rec_pending, sim_new)
    allocated, reserved, seg_allocs = [], [], []
    divergence, matched, requests, oom, ooms = None, 0, 0, None, []
    peak_r = sim.reserved
    frag = fragmentation(sim)
    prev_act = None
    malloc, free, expected = sim.malloc, sim.free, segmap.expected
    skip = set(snap.double_frees)  # tolerated double frees: skipped
    add_allocated, add_reserved = allocated.append, reserved.append
    for i, ev in enumerate(snap.trace):
        act = ev["action"]
        if act == "alloc":
            requests += 1
            before = sim.reserved
            addr = ev["addr"]
            try:
                h = malloc(ev["size"], ev.get("stream", 0))
            except SimulatedOOM as exc:
                oom = oom_record(sim, i, ev, exc)
                add_allocated(sim.allocated)
                add_reserved(sim.reserved)
                break
            handles[addr] = h
            if sim_new or rec_pending or sim.reserved != before:  # segments changed
                divergence = _segment_step(i, ev, sim_new, rec_pending, segmap, seg_allocs,
                                           divergence)  # fmt: skip
            if expected(addr) == h:
                matched += 1
            elif divergence is None and mode == "recorded":
                divergence = diverged(i, ev, "placement", addr, h)
        elif act == "free_completed" and i not in skip:
            h = handles.pop(ev["addr"], None)
            if h is not None:
                free(h)
        elif act == "segment_alloc":
            rec_pending.append((ev["addr"], ev["size"]))
            segmap.add(ev["addr"], ev["size"])
        elif act == "segment_free" and recorded_settings and mode == "recorded":
            segmap.remove(ev["addr"])
            got = segmap.sim_of.pop(ev["addr"], None)
            try:
                if got is None:
                    raise ValueError("no simulated segment corresponds")
                sim.release_segment(got)
            except ValueError as exc:
                if divergence is None:
                    divergence = diverged(i, ev, f"segment free ({exc})", ev["addr"], None)
            sim_new.clear()
        elif act in _RELEASES:  # a what-if: a run of releases is an empty_cache()
            segmap.remove(ev["addr"])
            if prev_act not in _RELEASES:
                sim.empty_cache()
            sim_new.clear()
        elif act == "oom":
            ooms.append(recorded_oom(i, ev, sim))
        prev_act = act
        add_allocated(sim.allocated)
        add_reserved(sim.reserved)
        if act == "alloc" and sim.reserved > peak_r:
            peak_r, frag = sim.reserved, fragmentation(sim)
    return SimulatedRun(
        initial_state=mode,
        allocated=allocated,
        reserved=reserved,
        segment_allocs=seg_allocs,
        peak_allocated_bytes=sim.peak_allocated,
        peak_reserved_bytes=sim.peak_reserved,
        fragmentation_at_peak=frag[0],
        largest_free_at_peak_bytes=frag[1],
        free_reserved_at_peak_bytes=frag[2],
        first_divergence=divergence,
        addresses_matched=matched,
        requests=requests,
        oom=oom,
        seconds=time.perf_counter() - t0,
        final_blocks=sim_blocks(sim),
        recorded_ooms=ooms,
    )


_RELEASES = ("segment_free", "segment_unmap")


def _segment_step(
    i: int,
    ev: dict,
    sim_new: list[tuple[str, int, int]],
    rec_pending: list[tuple[int, int]],
    segmap: _SegmentMap,
    seg_allocs: list[int],
    divergence: dict[str, Any] | None,
) -> dict[str, Any] | None:
    """A request that allocated or released segments (here or in the recording): compare,
    extend the segment map; returns the first divergence so far."""
    if divergence is None and any(e[0] in _RELEASES for e in sim_new):
        freed = [s for act, _, s in sim_new if act in _RELEASES]
        summary = {"segments_freed": len(freed), "bytes_freed": sum(freed)}
        divergence = diverged(i, ev, "cache release (OOM retry or gc)", None, summary)
    new = [(a, s) for act, a, s in sim_new if act in ("segment_alloc", "segment_map")]
    seg_allocs.extend(s for _, s in new)
    if [s for _, s in rec_pending] == [s for _, s in new]:
        for (rec, _), (got, _) in zip(rec_pending, new):
            segmap.sim_of[rec] = got
    elif divergence is None:
        divergence = diverged(i, ev, "segment allocation", rec_pending, new)
    rec_pending.clear()
    sim_new.clear()
    return divergence


class _RecordedAddresses:
    """Segment address hint: the recorded ``segment_alloc`` address for this request,
    when its size matches and it overlaps no simulated segment."""

    def __init__(
        self, sim: CachingAllocatorSim, pending: list[tuple[int, int]], new: list[tuple]
    ) -> None:
        self.sim, self.pending, self.new = sim, pending, new

    def __call__(self, size: int, stream: int) -> int | None:
        k = sum(1 for e in self.new if e[0] == "segment_alloc")  # given out this request
        if k >= len(self.pending) or self.pending[k][1] != size:
            return None
        addr = self.pending[k][0]
        return None if self.sim.overlapping_segment(addr, size) is not None else addr
