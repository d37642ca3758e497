"""What a replay pass of a snapshot measures, and the measures both kinds of pass share.

:class:`RecordedTimeline` is the recorded run and :class:`SimulatedRun` the simulator's,
for native (:mod:`predictor.snapshot.replay`) and expandable-segment recordings
(:mod:`predictor.snapshot.expandable`) alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from memgnn.predictor.sim.allocator import (
    K_LARGE_BUFFER,
    K_SMALL_BUFFER,
    K_SMALL_SIZE,
    CachingAllocatorSim,
    SimulatedOOM,
    get_allocation_size,
    round_size,
)

__all__ = [
    "RecordedTimeline",
    "SimulatedRun",
    "diverged",
    "fragmentation",
    "largest_free",
    "oom_record",
    "recorded_oom",
    "sim_blocks",
]


@dataclass(kw_only=True, slots=True)
class RecordedTimeline:
    """The recorded run, event by event (block sizes by the allocator's rules)."""

    allocated: list[int]  # allocated bytes after each event
    reserved: list[int]
    segment_allocs: list[int]  # sizes, in order
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    peak_allocated_event: int  # first event at the allocated peak (-1: the initial state)
    fragmentation_at_peak: float  # largest free block / free reserved, at the reserved peak
    model_error: dict[str, Any] | None  # first recorded step the rules cannot reproduce
    final_blocks: dict[int, tuple[int, bool]]  # address -> (size, allocated) at the end


@dataclass(kw_only=True, slots=True)
class SimulatedRun:
    initial_state: str  # "recorded" (segments, pages and blocks) or "live_blocks" (empty cache)
    allocated: list[int]
    reserved: list[int]
    segment_allocs: list[int]
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    fragmentation_at_peak: float
    largest_free_at_peak_bytes: int
    free_reserved_at_peak_bytes: int
    first_divergence: dict[str, Any] | None
    addresses_matched: int  # requests placed at the recorded address
    requests: int
    oom: dict[str, Any] | None
    seconds: float  # seeding and replay
    final_blocks: dict[int, tuple[int, bool]]  # address -> (size, allocated) at the end
    recorded_ooms: list[dict[str, Any]] = field(default_factory=list)  # `oom` events

    @property
    def events_replayed(self) -> int:  # up to and including an OOM
        return len(self.reserved)


def sim_blocks(sim: CachingAllocatorSim) -> dict[int, tuple[int, bool]]:
    return {b["address"]: (b["size"], b["allocated"]) for s in sim.snapshot() for b in s["blocks"]}


def largest_free(sim: CachingAllocatorSim) -> int:
    """Largest free block: pool keys sort by (stream, size, addr), so with one stream in a
    pool it is the last key; with several, the largest over the pool."""
    best = 0
    for pool in (sim._small, sim._large):
        keys = pool.keys
        if not keys:
            continue
        if keys[0][0] == keys[-1][0]:
            best = max(best, keys[-1][1])
        else:
            best = max(best, max(k[1] for k in keys))
    return best


def fragmentation(sim: CachingAllocatorSim) -> tuple[float, int, int]:
    free = sim.reserved - sim.allocated
    largest = largest_free(sim)
    return (largest / free if free > 0 else 1.0), largest, free


def diverged(i: int, ev: dict, what: str, recorded: Any, simulated: Any) -> dict[str, Any]:
    return {
        "event": i,
        "action": ev["action"],
        "size": ev.get("size"),
        "what": what,
        "recorded": list(recorded) if isinstance(recorded, list) else recorded,
        "simulated": list(simulated) if isinstance(simulated, list) else simulated,
    }


def oom_record(sim: CachingAllocatorSim, i: int, ev: dict, exc: SimulatedOOM) -> dict:
    free = sim.reserved - sim.allocated
    return {
        "event": i,
        "request_bytes": ev["size"],
        "reserved_bytes": sim.reserved,
        "allocated_bytes": sim.allocated,
        "free_reserved_bytes": free,  # reserved but unallocated: free-but-fragmented
        "largest_free_block_bytes": largest_free(sim),
        "message": str(exc),
    }


def recorded_oom(i: int, ev: dict, sim: CachingAllocatorSim) -> dict[str, Any]:
    """A recorded ``oom`` event beside the simulator's state at that moment.

    ``device_free`` is what CUDA reported free when the request failed (after the
    allocator had released its cache: those ``segment_free`` / ``segment_unmap`` events
    come before it and are replayed). ``simulator_agrees``: True if in the simulation no
    free block of the stream fits the request and the least memory it would add exceeds
    ``device_free``; False if a free block fits or the most it would add is within it;
    None when undecided (expandable: the free tail the new pages would extend is not
    known here) or when the event has no ``device_free``."""
    size, stream = ev["size"], ev.get("stream", 0)
    device_free = ev.get("device_free")
    rounded = round_size(size, sim.config.roundup_power2_divisions)
    pool = sim._small if rounded <= K_SMALL_SIZE else sim._large
    free_here = [k[1] for k in pool.keys if k[0] == stream]
    fits = bool(free_here) and max(free_here) >= rounded
    if sim.config.expandable_segments:
        page = K_SMALL_BUFFER if pool.small else K_LARGE_BUFFER
        most = -(-rounded // page) * page
        least = -(-max(rounded - max(free_here, default=0), 0) // page) * page
    else:
        most = least = get_allocation_size(rounded)
    agrees = None
    if device_free is not None:
        if fits or most <= device_free:
            agrees = False
        elif least > device_free:
            agrees = True
    return {
        "event": i,
        "request_bytes": size,
        "device_free_bytes": device_free,
        "simulated_reserved_bytes": sim.reserved,
        "simulated_allocated_bytes": sim.allocated,
        "largest_free_block_bytes": largest_free(sim),
        "new_memory_bytes": least if least == most else [least, most],
        "simulator_agrees": agrees,
    }
