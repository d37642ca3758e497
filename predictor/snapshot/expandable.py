"""Replay of recordings made with expandable segments (``expandable_segments:True``).

PyTorch then reserves one virtual range per (stream, pool) and maps 2 MiB (small pool) /
20 MiB (large pool) pages into it as requests need them; the trace records each mapping
as ``segment_map`` (address, bytes) and each unmapping (``empty_cache``, the OOM retry) as
``segment_unmap``. Reserved bytes are the mapped bytes, and every block is ``round_size``
of its request (a block always splits when 512 B or more remain).

* **recorded** (:func:`recorded_expandable`): mapped bytes from the events, allocated
  bytes from the live blocks; every alloc must lie in mapped pages clear of live blocks,
  every map over unmapped addresses, every unmap over free mapped ones (``model_error``:
  the first event that does not).
* **simulated** (:func:`simulate_expandable`): ``CachingAllocatorSim`` with expandable
  segments on the same ``alloc`` / ``free_completed`` requests. Each request's page maps
  are compared with the recorded ones (sizes, in order); a matched map ties the recorded
  range to the simulated one (their address offset), through which each request's address
  is compared with the recorded one. A run of recorded ``segment_unmap`` is an
  ``empty_cache()`` whose unmapped bytes are compared with the run's.

A recording that began with nothing mapped and no live block is replayed from an empty
simulator, which is its recorded state. Otherwise the simulator starts from the live
blocks only (``initial_state: live_blocks``): it cannot be seeded with mapped pages of
given addresses, so its peaks start from a compact cache; the report says so.
"""

from __future__ import annotations

import bisect
import time
from typing import Any

from memgnn.predictor.sim.allocator import (
    AllocatorConfig,
    CachingAllocatorSim,
    SimulatedOOM,
    round_size,
)
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
from memgnn.predictor.snapshot.state import InitialState, Intervals, seed_live_blocks

__all__ = ["recorded_expandable", "simulate_expandable"]


def _free_pieces(mapped: Intervals, live: dict[int, int]) -> list[tuple[int, int]]:
    """The free blocks: each mapped range minus the live blocks in it."""
    out, addrs = [], sorted(live)
    for a, e in mapped.spans():
        k = bisect.bisect_left(addrs, a)
        at = a
        while k < len(addrs) and addrs[k] < e:
            if addrs[k] > at:
                out.append((at, addrs[k] - at))
            at = addrs[k] + live[addrs[k]]
            k += 1
        if at < e:
            out.append((at, e - at))
    return out


def recorded_expandable(snap: Snapshot, state: InitialState) -> RecordedTimeline:
    """The recorded run of an expandable-segment trace (module docstring)."""
    mapped = Intervals()
    for a, e in state.mapped:
        mapped.add(a, e)
    live = {b.address: b.size for b in state.blocks}
    alloc_now = sum(live.values())
    allocated, reserved, maps = [], [], []
    error = None
    skip = set(snap.double_frees)
    peak_a, peak_a_at, peak_r = alloc_now, -1, mapped.total
    reserved_now, frag = mapped.total, 1.0
    for i, ev in enumerate(snap.trace):
        act, bad = ev["action"], None
        if act == "alloc":
            size = round_size(ev["size"])
            if not mapped.covers(ev["addr"], ev["addr"] + size):
                bad = "not inside mapped pages"
            live[ev["addr"]] = size
            alloc_now += size
        elif act == "free_completed" and i not in skip and ev["addr"] in live:
            alloc_now -= live.pop(ev["addr"])
        elif act == "segment_map":
            maps.append(ev["size"])
            reserved_now += ev["size"]
            if not mapped.add(ev["addr"], ev["addr"] + ev["size"]):
                bad = "maps pages that are already mapped"
        elif act == "segment_unmap":
            reserved_now -= ev["size"]
            a, e = ev["addr"], ev["addr"] + ev["size"]
            if not mapped.remove(a, e):
                bad = "unmaps pages that are not mapped"
            elif any(a <= x < e for x in live):
                bad = "unmaps pages under a live block"
        if bad and error is None:
            error = {"event": i, "action": act, "addr": ev.get("addr"), "reason": bad}
        allocated.append(alloc_now)
        reserved.append(reserved_now)
        if alloc_now > peak_a:
            peak_a, peak_a_at = alloc_now, i
        if act == "alloc" and reserved_now > peak_r:
            peak_r = reserved_now
            free = reserved_now - alloc_now
            largest = max((s for _, s in _free_pieces(mapped, live)), default=0)
            frag = largest / free if free > 0 else 1.0
    final = {a: (s, True) for a, s in live.items()}
    final.update({a: (s, False) for a, s in _free_pieces(mapped, live)})
    return RecordedTimeline(
        allocated=allocated,
        reserved=reserved,
        segment_allocs=maps,
        peak_allocated_bytes=peak_a,
        peak_reserved_bytes=peak_r,
        peak_allocated_event=peak_a_at,
        fragmentation_at_peak=frag,
        model_error=error,
        final_blocks=final,
    )


class _Offsets:
    """Recorded mapped ranges tied to simulated ones: [start, end) -> sim - recorded."""

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.spans: dict[int, tuple[int, int]] = {}  # start -> (end, delta)

    def add(self, start: int, size: int, delta: int) -> None:
        self.remove(start, start + size)
        bisect.insort(self.starts, start)
        self.spans[start] = (start + size, delta)

    def remove(self, a: int, e: int) -> None:
        """Forget [a, e) (an unmap): trim or split the ranges it touches."""
        k = max(bisect.bisect_right(self.starts, a) - 1, 0)
        while k < len(self.starts) and self.starts[k] < e:
            s = self.starts[k]
            end, delta = self.spans[s]
            if end <= a:
                k += 1
                continue
            del self.starts[k], self.spans[s]
            for lo, hi in ((s, a), (e, end)):
                if lo < hi:
                    bisect.insort(self.starts, lo)
                    self.spans[lo] = (hi, delta)
            k = bisect.bisect_left(self.starts, e)

    def delta(self, addr: int) -> int | None:
        k = bisect.bisect_right(self.starts, addr) - 1
        if k < 0:
            return None
        end, delta = self.spans[self.starts[k]]
        return delta if addr < end else None


def simulate_expandable(
    snap: Snapshot,
    config: AllocatorConfig,
    state: InitialState,
) -> SimulatedRun:
    """The simulator's run of an expandable-segment recording (module docstring)."""
    sim = CachingAllocatorSim(config)
    t0 = time.perf_counter()
    clean = not state.mapped and not state.blocks
    handles = seed_live_blocks(sim, state)
    mode = "recorded" if clean else "live_blocks"
    sim_new: list[tuple[str, int, int]] = []
    sim.segment_observer = lambda act, addr, size, stream: sim_new.append((act, addr, size))
    offsets = _Offsets()
    rec_pending: list[tuple[int, int]] = []
    rec_unmapped = 0
    allocated, reserved, maps, ooms = [], [], [], []
    divergence, matched, requests, oom = None, 0, 0, None
    peak_r, frag = sim.reserved, fragmentation(sim)
    skip = set(snap.double_frees)
    prev_act = None
    for i, ev in enumerate(snap.trace):
        act = ev["action"]
        if prev_act == "segment_unmap" and act != "segment_unmap":
            divergence = _unmap_run(i - 1, snap.trace[i - 1], rec_unmapped, sim_new, divergence)
            rec_unmapped = 0
        if act == "alloc":
            requests += 1
            try:
                h = sim.malloc(ev["size"], ev.get("stream", 0))
            except SimulatedOOM as exc:
                oom = oom_record(sim, i, ev, exc)
                allocated.append(sim.allocated)
                reserved.append(sim.reserved)
                break
            handles[ev["addr"]] = h
            if sim_new or rec_pending:
                divergence = _maps_step(i, ev, sim_new, rec_pending, offsets, maps, divergence)
            delta = offsets.delta(ev["addr"])
            if delta is not None and ev["addr"] + delta == h:
                matched += 1
            elif divergence is None and mode == "recorded":
                expect = None if delta is None else ev["addr"] + delta
                divergence = diverged(i, ev, "placement", expect, h)
        elif act == "free_completed" and i not in skip:
            h = handles.pop(ev["addr"], None)
            if h is not None:
                sim.free(h)
        elif act == "segment_map":
            rec_pending.append((ev["addr"], ev["size"]))
        elif act == "segment_unmap":
            if prev_act != "segment_unmap":
                sim_new.clear()
                sim.empty_cache()
            rec_unmapped += ev["size"]
            offsets.remove(ev["addr"], ev["addr"] + ev["size"])
        elif act == "oom":
            ooms.append(recorded_oom(i, ev, sim))
            if rec_pending and divergence is None:
                divergence = diverged(i, ev, "pages mapped for a failed request", rec_pending, [])
            rec_pending.clear()
        prev_act = act
        allocated.append(sim.allocated)
        reserved.append(sim.reserved)
        if act == "alloc" and sim.reserved > peak_r:
            peak_r, frag = sim.reserved, fragmentation(sim)
    if prev_act == "segment_unmap" and oom is None:
        divergence = _unmap_run(len(snap.trace) - 1, snap.trace[-1], rec_unmapped, sim_new,
                                divergence)  # fmt: skip
    return SimulatedRun(
        initial_state=mode,
        allocated=allocated,
        reserved=reserved,
        segment_allocs=maps,
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
        final_blocks=_recorded_addresses(sim_blocks(sim), offsets),
        recorded_ooms=ooms,
    )


def _maps_step(
    i: int,
    ev: dict,
    sim_new: list[tuple[str, int, int]],
    rec_pending: list[tuple[int, int]],
    offsets: _Offsets,
    maps: list[int],
    divergence: dict[str, Any] | None,
) -> dict[str, Any] | None:
    """A request that mapped pages (here or in the recording): compare sizes in order, tie
    matched ranges; returns the first divergence so far."""
    if divergence is None and any(e[0] == "segment_unmap" for e in sim_new):
        freed = sum(s for act, _, s in sim_new if act == "segment_unmap")
        divergence = diverged(i, ev, "cache release (OOM retry)", None, {"bytes_unmapped": freed})
    new = [(a, s) for act, a, s in sim_new if act == "segment_map"]
    maps.extend(s for _, s in new)
    if [s for _, s in rec_pending] == [s for _, s in new]:
        for (rec, size), (got, _) in zip(rec_pending, new):
            offsets.add(rec, size, got - rec)
    elif divergence is None:
        divergence = diverged(i, ev, "segment map", rec_pending, new)
    rec_pending.clear()
    sim_new.clear()
    return divergence


def _unmap_run(
    i: int, ev: dict, recorded: int, sim_new: list, divergence: dict[str, Any] | None
) -> dict[str, Any] | None:
    """The end of a run of recorded unmaps: the simulator's empty_cache() unmapped the
    same bytes?"""
    got = sum(s for act, _, s in sim_new if act == "segment_unmap")
    sim_new.clear()
    if got != recorded and divergence is None:
        return diverged(i, ev, "bytes unmapped by empty_cache", recorded, got)
    return divergence


def _recorded_addresses(
    blocks: dict[int, tuple[int, bool]], offsets: _Offsets
) -> dict[int, tuple[int, bool]]:
    """The simulator's blocks at the recorded addresses (where a tied range says where)."""
    back = [(s + d, e + d, d) for s, (e, d) in offsets.spans.items()]
    back.sort()
    starts = [b[0] for b in back]
    out = {}
    for addr, value in blocks.items():
        k = bisect.bisect_right(starts, addr) - 1
        if k >= 0 and addr < back[k][1]:
            addr -= back[k][2]
        out[addr] = value
    return out
