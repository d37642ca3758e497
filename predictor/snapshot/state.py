"""The allocator's state when a snapshot's recording began, rebuilt from the dump.

A snapshot holds the state at dump time (``segments`` with their ``blocks``) and the
events since recording began (``device_traces``). The state at the start is:

* Segments: a segment existed at the start if the *first* segment event at its address
  is a ``segment_free`` (its size is that event's), or if it is in the dump and no
  segment event names its address. Deciding by the first event matters: an address
  freed by ``segment_free`` can come back in a later ``segment_alloc``.
* Allocated blocks: an address whose first alloc/free event is a free was allocated
  before recording (requested size from that event); a dump block that is allocated and
  that no event names was allocated all along (its recorded block size is used).
* Everything else in a start segment was free; free neighbours are always merged, so
  the allocated blocks fix the free ones. The block size of a block freed in the trace
  is ``round_size`` of its request, plus the free space after it when that space could
  not be a free block of its own: a large-pool free block is always > 1 MiB (a request
  that leaves <= 1 MiB takes the whole block), a small-pool one >= 512 B.

A recording made with expandable segments (``segment_map`` / ``segment_unmap`` events,
``is_expandable`` segments) has no native segments: the mapped ranges at the start are the
dump's (each dump segment is one contiguous mapped range) with the trace's maps undone
and its unmaps redone, last event first; the blocks allocated before recording are found
as above, each ``round_size`` of its request (expandable blocks always split).
"""

from __future__ import annotations

import bisect
import logging
from dataclasses import dataclass, field

from memgnn.predictor.sim.allocator import (
    K_MIN_BLOCK,
    K_SMALL_BUFFER,
    K_SMALL_SIZE,
    CachingAllocatorSim,
)
from memgnn.predictor.sim.allocator import round_size as _round_size
from memgnn.predictor.snapshot.loader import Snapshot, SnapshotError

logger = logging.getLogger(__name__)

__all__ = [
    "BlockState",
    "InitialState",
    "Intervals",
    "SegmentState",
    "initial_state",
    "is_expandable",
    "seed",
]

_ALLOCATED_STATES = ("active_allocated", "active_pending_free")
_FREES = ("free_requested", "free_completed")
_MAPS = ("segment_map", "segment_unmap")


@dataclass(kw_only=True, slots=True)
class SegmentState:
    address: int
    size: int
    stream: int
    small: bool


@dataclass(kw_only=True, slots=True)
class BlockState:
    address: int
    size: int  # block bytes (what allocated_bytes counts)
    requested: int
    stream: int = 0


@dataclass(kw_only=True, slots=True)
class InitialState:
    segments: list[SegmentState]
    blocks: list[BlockState]
    orphans: list[int] = field(default_factory=list)  # pre-trace blocks outside any segment
    expandable: bool = False  # recorded with expandable segments
    mapped: list[tuple[int, int]] = field(default_factory=list)  # expandable: [start, end)

    @property
    def reserved_bytes(self) -> int:
        return sum(s.size for s in self.segments) + sum(e - a for a, e in self.mapped)

    @property
    def allocated_bytes(self) -> int:
        return sum(b.size for b in self.blocks)


def _start_segments(snap: Snapshot) -> list[SegmentState]:
    first: dict[int, dict] = {}
    for ev in snap.trace:
        if ev["action"] in ("segment_alloc", "segment_free"):
            first.setdefault(ev["addr"], ev)
    segs = [
        SegmentState(
            address=ev["addr"],
            size=ev["size"],
            stream=ev.get("stream", 0),
            small=ev["size"] == K_SMALL_BUFFER,
        )
        for addr, ev in first.items()
        if ev["action"] == "segment_free"
    ]
    for seg in snap.segments:
        if seg["address"] not in first:
            segs.append(
                SegmentState(
                    address=seg["address"],
                    size=seg["total_size"],
                    stream=seg.get("stream", 0),
                    small=seg.get("segment_type") == "small",
                )
            )
    return sorted(segs, key=lambda s: s.address)


def is_expandable(snap: Snapshot) -> bool:
    """Recorded with expandable segments (its settings, segments or trace say so)."""
    if (snap.allocator_settings or {}).get("expandable_segments") is True:
        return True
    if any(seg.get("is_expandable") for seg in snap.segments):
        return True
    return any(ev["action"] in _MAPS for ev in snap.trace)


def _pre_trace_blocks(snap: Snapshot) -> dict[int, tuple[int | None, int, int]]:
    """addr -> (block size or None: from the request, requested, stream) of the blocks
    allocated before recording began (module docstring)."""
    first: dict[int, dict] = {}
    for ev in snap.trace:
        if ev["action"] in ("alloc", *_FREES):
            first.setdefault(ev["addr"], ev)
    wanted: dict[int, tuple[int | None, int, int]] = {}
    for addr, ev in first.items():
        if ev["action"] in _FREES:
            wanted[addr] = (None, ev["size"], ev.get("stream", 0))
    for seg in snap.segments:
        for b in seg.get("blocks", ()):
            if b.get("state") in _ALLOCATED_STATES and b["address"] not in first:
                req = b.get("requested_size", b["size"])
                wanted[b["address"]] = (b["size"], req, seg.get("stream", 0))
    return wanted


def _expandable_state(snap: Snapshot) -> InitialState:
    ranges = Intervals()
    for k, seg in enumerate(snap.segments):
        if not seg.get("is_expandable"):
            raise SnapshotError(f"segment {k} is native in a recording with expandable segments")
        ranges.add(seg["address"], seg["address"] + seg["total_size"])
    for i in range(len(snap.trace) - 1, -1, -1):
        ev = snap.trace[i]
        if ev["action"] in _MAPS:
            a, e = ev["addr"], ev["addr"] + ev["size"]
            ok = ranges.remove(a, e) if ev["action"] == "segment_map" else ranges.add(a, e)
            if not ok:
                raise SnapshotError(
                    f"trace event {i} ({ev['action']} [{a:#x}, {e:#x})) does not fit the "
                    "mapped ranges of the dump and the later events"
                )
    blocks, orphans = [], []
    for addr, (size, req, stream) in sorted(_pre_trace_blocks(snap).items()):
        size = _round_size(req) if size is None else size
        if not ranges.covers(addr, addr + size):
            orphans.append(addr)
            continue
        blocks.append(BlockState(address=addr, size=size, requested=req, stream=stream))
    if orphans:
        logger.warning("%d pre-trace blocks lie in no mapped range (ignored)", len(orphans))
    return InitialState(
        segments=[], blocks=blocks, orphans=orphans, expandable=True, mapped=ranges.spans()
    )


def initial_state(snap: Snapshot) -> InitialState:
    """The segments and allocated blocks when recording began (module docstring)."""
    if is_expandable(snap):
        return _expandable_state(snap)
    segs = _start_segments(snap)
    wanted = {a: (size, req) for a, (size, req, _) in _pre_trace_blocks(snap).items()}
    bases = [s.address for s in segs]
    per_seg: dict[int, list[tuple[int, int | None, int]]] = {}
    orphans = []
    for addr, (size, req) in sorted(wanted.items()):
        k = bisect.bisect_right(bases, addr) - 1
        if k < 0 or addr >= bases[k] + segs[k].size:
            orphans.append(addr)
            continue
        per_seg.setdefault(k, []).append((addr, size, req))
    if orphans:
        logger.warning("%d pre-trace blocks lie in no start segment (ignored)", len(orphans))
    blocks: list[BlockState] = []
    for k, items in per_seg.items():
        seg = segs[k]
        end = seg.address + seg.size
        for j, (addr, size, req) in enumerate(items):
            limit = items[j + 1][0] if j + 1 < len(items) else end
            if size is None:
                size = _round_size(req)
                gap = limit - addr - size
                if gap < 0:
                    raise SnapshotError(
                        f"pre-trace block at {addr:#x} ({req} B) overlaps the next block"
                    )
                if gap <= (K_MIN_BLOCK - 1 if seg.small else K_SMALL_SIZE):
                    size += gap  # the remainder could not have been split off
            blocks.append(BlockState(address=addr, size=size, requested=req, stream=seg.stream))
    return InitialState(segments=segs, blocks=blocks, orphans=orphans)


def seed(sim: CachingAllocatorSim, state: InitialState) -> dict[int, int]:
    """Put ``state`` into a fresh simulator; returns recorded address -> handle."""
    for s in state.segments:
        sim.add_segment(s.address, s.size, stream=s.stream, small=s.small)
    return {
        b.address: sim.seed_block(b.address, b.size, requested=b.requested) for b in state.blocks
    }


def seed_live_blocks(sim: CachingAllocatorSim, state: InitialState) -> dict[int, int]:
    """Start with the live blocks only (an empty cache): each one ``malloc``'d in address
    order. For settings under which the recorded cache could not have existed."""
    return {b.address: sim.malloc(b.requested, b.stream) for b in state.blocks}


class Intervals:
    """Disjoint ``[start, end)`` ranges (adjacent ones merged): the mapped pages."""

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []

    def spans(self) -> list[tuple[int, int]]:
        return list(zip(self._starts, self._ends))

    @property
    def total(self) -> int:
        return sum(e - a for a, e in zip(self._starts, self._ends))

    def _at(self, addr: int) -> int:
        """Index of the range holding ``addr`` (or the one before it), -1 if none."""
        return bisect.bisect_right(self._starts, addr) - 1

    def covers(self, a: int, e: int) -> bool:
        k = self._at(a)
        return k >= 0 and self._ends[k] >= e

    def add(self, a: int, e: int) -> bool:
        """Add ``[a, e)``; False (and nothing changed) if it overlaps a range."""
        k = self._at(a)
        if k >= 0 and self._ends[k] > a:
            return False
        if k + 1 < len(self._starts) and self._starts[k + 1] < e:
            return False
        if k + 1 < len(self._starts) and self._starts[k + 1] == e:  # merge with the next
            e = self._ends[k + 1]
            del self._starts[k + 1], self._ends[k + 1]
        if k >= 0 and self._ends[k] == a:  # merge with the previous
            self._ends[k] = e
        else:
            self._starts.insert(k + 1, a)
            self._ends.insert(k + 1, e)
        return True

    def remove(self, a: int, e: int) -> bool:
        """Remove ``[a, e)``; False (and nothing changed) unless one range covers it."""
        k = self._at(a)
        if k < 0 or self._ends[k] < e:
            return False
        start, end = self._starts[k], self._ends[k]
        del self._starts[k], self._ends[k]
        if e < end:
            self._starts.insert(k, e)
            self._ends.insert(k, end)
        if start < a:
            self._starts.insert(k, start)
            self._ends.insert(k, a)
        return True
