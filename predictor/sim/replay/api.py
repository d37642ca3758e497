"""Python side of the compiled replay: encode events, build the state, read results.

``replay_fast`` is :func:`predictor.sim.allocator.replay` on the compiled core;
``replay_trace_fast`` is :func:`predictor.sim.simulate.replay_trace`. Both give the Python
simulator's numbers byte for byte (``tests/dataset/test_allocator_fast.py``).

An initial allocator state (segments with their blocks, in ``CachingAllocatorSim.snapshot``
form) can be passed as ``initial``; an allocated block with a ``"key"`` entry is held by
that trace key, so the trace can free it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
from memgnn.predictor.sim.allocator import (
    _BASE_ADDR,
    K_ROUND_LARGE,
    AllocatorConfig,
    AllocatorStats,
    format_size,
)
from memgnn.predictor.sim.replay import core as C
from memgnn.predictor.sim.replay.core import (
    ERR_BAD_OP,
    ERR_DOUBLE_ALLOC,
    NOT_HELD,
    run_events,
)
from memgnn.predictor.sim.replay.events import OP_ALLOC, EventArrays, encode_events

__all__ = ["FastReplayResult", "replay_fast", "config_array", "snapshot"]


def config_array(config: AllocatorConfig) -> tuple[np.ndarray, float]:
    cfg = np.full(C.N_CFG, -1, dtype=np.int64)
    if config.capacity_bytes is not None:
        cfg[C.C_CAP] = config.capacity_bytes
    allowed = config.fraction_limit
    if allowed is not None:
        cfg[C.C_ALLOWED] = allowed
    if config.max_split_size is not None:
        cfg[C.C_MSS] = config.max_split_size
    cfg[C.C_MNSR] = config.max_non_split_rounding
    cfg[C.C_DIV] = config.roundup_power2_divisions
    cfg[C.C_EXP] = int(config.expandable_segments)
    gc = allowed is not None and config.garbage_collection_threshold is not None
    cfg[C.C_GC] = int(gc)
    return cfg, float(config.garbage_collection_threshold or 0.0)


def _new_state(config: AllocatorConfig, n_blocks: int, n_segs: int) -> tuple:
    blk = np.zeros((n_blocks, C.N_BLOCK_FIELDS), dtype=np.int64)
    st = np.zeros(C.N_STATS, dtype=np.int64)
    st[C.FREE_HEAD] = -1
    st[C.NEXT_ADDR] = _BASE_ADDR
    st[C.OOM_EVENT] = -1
    pool = np.zeros((2, n_blocks), dtype=np.int64)
    umap = np.zeros((2, n_blocks), dtype=np.int64)
    seg = np.zeros((max(n_segs, 1), 4), dtype=np.int64)
    cfg, gc_fraction = config_array(config)
    npool, numap = np.zeros(2, np.int64), np.zeros(2, np.int64)
    return (blk, st, pool, npool, umap, numap, seg, cfg, gc_fraction)


def _seed(s: tuple, initial: Sequence[dict], handles: np.ndarray) -> None:
    """Place the segments of ``initial`` (snapshot form) into a fresh state."""
    blk, st, pool, npool = s[0], s[1], s[2], s[3]
    end = _BASE_ADDR
    n = 0
    for seg in sorted(initial, key=lambda x: x["address"]):
        if seg.get("expandable"):
            raise ValueError("initial state: expandable segments cannot be seeded")
        small = {"small": 1, "large": 0}.get(seg.get("pool", "large"))
        if small is None:
            raise ValueError(f"initial state: unknown pool {seg.get('pool')!r}")
        addr, prev = int(seg["address"]), -1
        if addr < end:
            raise ValueError(f"initial state: segment at {addr:#x} overlaps the one before")
        for b in seg["blocks"]:
            if int(b["address"]) != addr or int(b["size"]) <= 0:
                raise ValueError(f"initial state: blocks do not tile the segment at {addr:#x}")
            row = blk[n]
            row[C.ADDR], row[C.SIZE], row[C.STREAM] = addr, int(b["size"]), seg.get("stream", 0)
            row[C.SMALL], row[C.SEG], row[C.PREV], row[C.NEXT] = small, -1, prev, -1
            row[C.ALLOC], row[C.MAPPED], row[C.LIVE] = int(bool(b["allocated"])), 1, 1
            if prev >= 0:
                blk[prev, C.NEXT] = n
            if b["allocated"]:
                row[C.REQ] = int(b.get("requested_size") or b["size"])
                st[C.ALLOCATED] += row[C.SIZE]
                st[C.REQUESTED] += row[C.REQ]
                if "key" in b:
                    if not 0 <= int(b["key"]) < len(handles):
                        raise ValueError(f"initial state: block key {b['key']} not in the trace")
                    handles[int(b["key"])] = n
            addr, prev, n = addr + int(b["size"]), n, n + 1
        if addr - int(seg["address"]) != int(seg["size"]):
            raise ValueError(f"initial state: blocks do not sum to segment {seg['address']:#x}")
        st[C.RESERVED] += seg["size"]
        st[C.NSEG] += 1
        end = addr
    st[C.NBLK] = n
    st[C.NEXT_ADDR] = max(_BASE_ADDR, -(-end // K_ROUND_LARGE) * K_ROUND_LARGE)
    for field_ in (C.PEAK_A, C.MAX_A):
        st[field_] = st[C.ALLOCATED]
    for field_ in (C.PEAK_R, C.MAX_R):
        st[field_] = st[C.RESERVED]
    st[C.PEAK_Q] = st[C.REQUESTED]
    live = blk[:n]
    for p in (0, 1):
        idx = np.flatnonzero((live[:, C.ALLOC] == 0) & (live[:, C.SMALL] == p))
        order = np.lexsort((live[idx, C.ADDR], live[idx, C.SIZE], live[idx, C.STREAM]))
        pool[p, : len(idx)] = idx[order]
        npool[p] = len(idx)


@dataclass(kw_only=True, slots=True)
class FastReplayResult:
    """Counters after the replay; ``per_event`` (allocated, reserved, segments) if recorded."""

    peak_allocated_bytes: int  # over the whole trace (marks do not reset it)
    peak_reserved_bytes: int
    stats: AllocatorStats  # like CachingAllocatorSim.stats() at the end
    oom: bool
    oom_event_index: int | None
    oom_message: str | None
    peak_event_index: int
    fragmentation_at_peak: float
    mark_peaks: np.ndarray  # (2, n_marks): allocated / reserved peak per mark interval
    per_event: np.ndarray | None
    state: tuple = field(repr=False)

    def snapshot(self) -> list[dict]:
        return snapshot(self.state)


def snapshot(s: tuple) -> list[dict]:
    """CachingAllocatorSim.snapshot() of a compiled state."""
    blk, seg = s[0], s[6]
    n = int(s[1][C.NBLK])
    live = np.flatnonzero(blk[:n, C.LIVE] == 1)
    heads = [int(i) for i in live if blk[i, C.SEG] < 0 and blk[i, C.PREV] < 0]
    for k in range(int(s[1][C.NEXPSEG])):
        if not seg[k, C.S_LIVE]:
            continue
        mine = [int(i) for i in live if blk[i, C.SEG] == k]
        b = next(i for i in mine if blk[i, C.PREV] < 0)
        while b >= 0:
            prev = blk[b, C.PREV]
            if blk[b, C.MAPPED] and (prev < 0 or not blk[prev, C.MAPPED]):
                heads.append(b)
            b = int(blk[b, C.NEXT])
    out = []
    for h in heads:
        blocks, b = [], h
        while b >= 0 and blk[b, C.MAPPED]:
            alloc = bool(blk[b, C.ALLOC])
            blocks.append(
                {
                    "address": int(blk[b, C.ADDR]),
                    "size": int(blk[b, C.SIZE]),
                    "allocated": alloc,
                    "requested_size": int(blk[b, C.REQ]) if alloc else 0,
                }
            )
            b = int(blk[b, C.NEXT])
        out.append(
            {
                "address": int(blk[h, C.ADDR]),
                "size": sum(x["size"] for x in blocks),
                "stream": int(blk[h, C.STREAM]),
                "pool": "small" if blk[h, C.SMALL] else "large",
                "expandable": bool(blk[h, C.SEG] >= 0),
                "blocks": blocks,
            }
        )
    return sorted(out, key=lambda x: x["address"])


def _num_segments(s: tuple) -> int:
    """len(snapshot(s)): whole segments plus each mapped range of an expandable one."""
    blk, st = s[0], s[1]
    live = blk[: int(st[C.NBLK])]
    live = live[live[:, C.LIVE] == 1]
    exp = live[(live[:, C.SEG] >= 0) & (live[:, C.MAPPED] == 1)]
    prev = exp[:, C.PREV]
    heads = (prev < 0) | (blk[np.maximum(prev, 0), C.MAPPED] == 0)
    return int(st[C.NSEG]) + int(np.count_nonzero(heads))


def _stats(s: tuple) -> AllocatorStats:
    blk, st, pool, npool = s[0], s[1], s[2], s[3]
    free = np.concatenate([pool[p, : npool[p]] for p in (0, 1)])
    sizes = blk[free, C.SIZE]
    largest = int(sizes.max()) if len(free) else 0
    split = (blk[free, C.PREV] >= 0) | (blk[free, C.NEXT] >= 0)
    inactive = int(sizes[(blk[free, C.SEG] < 0) & split].sum())
    free_reserved = int(st[C.RESERVED] - st[C.ALLOCATED])
    return AllocatorStats(
        allocated_bytes=int(st[C.ALLOCATED]),
        peak_allocated_bytes=int(st[C.PEAK_A]),
        reserved_bytes=int(st[C.RESERVED]),
        peak_reserved_bytes=int(st[C.PEAK_R]),
        requested_bytes=int(st[C.REQUESTED]),
        peak_requested_bytes=int(st[C.PEAK_Q]),
        num_alloc_retries=int(st[C.RETRIES]),
        num_ooms=int(st[C.OOMS]),
        inactive_split_bytes=inactive,
        largest_free_block_bytes=largest,
        free_reserved_bytes=free_reserved,
        fragmentation=largest / free_reserved if free_reserved > 0 else 1.0,
        num_segments=_num_segments(s),
    )


def _oom_message(config: AllocatorConfig, st: np.ndarray) -> str:
    """CachingAllocatorSim._oom_message at the first OOM."""
    cap, allowed = config.capacity_bytes, config.fraction_limit
    reserved, allocated = int(st[C.OOM_RESERVED]), int(st[C.OOM_ALLOCATED])
    total = "unlimited" if cap is None else format_size(cap)
    free = "unlimited" if cap is None else format_size(max(cap - reserved, 0))
    allowed_s = "" if allowed is None else f"{format_size(allowed)} allowed; "
    return (
        f"CUDA out of memory (simulated). Tried to allocate {format_size(int(st[C.OOM_SIZE]))}. "
        f"GPU 0 has a total capacity of {total} of which {free} is free. {allowed_s}"
        f"Of the allocated memory {format_size(allocated)} is allocated by PyTorch, "
        f"and {format_size(reserved - allocated)} is reserved by PyTorch but unallocated."
    )


def replay_fast(
    events: EventArrays | Iterable[Sequence],
    config: AllocatorConfig | None = None,
    *,
    stop_on_oom: bool = True,
    record: bool = False,
    initial: Sequence[dict] | None = None,
) -> FastReplayResult:
    """Replay a trace on the compiled core (``predictor.sim.allocator.replay`` semantics)."""
    if isinstance(events, EventArrays):
        ev = events  # a seeded block's "key" is then the id in ev's key space
    else:
        held = [b["key"] for seg in initial or () for b in seg["blocks"] if "key" in b]
        ev = encode_events(events, held)
        initial = [
            seg | {"blocks": [b | {"key": held.index(b["key"])} if "key" in b else b
                              for b in seg["blocks"]]}
            for seg in initial or ()
        ]  # fmt: skip
    config = config or AllocatorConfig()
    n_init = sum(len(seg["blocks"]) for seg in initial or ())
    n_alloc = int(np.count_nonzero(ev.op == OP_ALLOC))
    room = n_init + 2 * n_alloc + 64
    while True:
        s = _new_state(config, room, n_alloc + 1 if config.expandable_segments else 1)
        handles = np.full(max(ev.n_keys, 1), NOT_HELD, dtype=np.int64)
        if initial:
            _seed(s, initial, handles)
        rec = np.zeros((3, len(ev.op) if record else 0), dtype=np.int64)
        marks = np.zeros((2, len(ev.marks)), dtype=np.int64)
        frag = np.ones(1, dtype=np.float64)
        try:
            code, at = run_events(
                s, ev.op, ev.key, ev.nbytes, ev.stream, handles, stop_on_oom, record, rec,
                marks, frag,
            )  # fmt: skip
            break
        except MemoryError:  # out of block slots: rare, run again with more room
            room *= 2
    if code == ERR_DOUBLE_ALLOC:
        raise ValueError(f"event {at}: key {int(ev.key[at])} is already allocated")
    if code == ERR_BAD_OP:
        raise ValueError(f"event {at}: unknown op {int(ev.op[at])}")
    if code != 0:
        raise ValueError(f"event {at}: free of unknown key {int(ev.key[at])}")
    st = s[1]
    oom_at = int(st[C.OOM_EVENT])
    return FastReplayResult(
        peak_allocated_bytes=int(st[C.MAX_A]),
        peak_reserved_bytes=int(st[C.MAX_R]),
        stats=_stats(s),
        oom=oom_at >= 0,
        oom_event_index=oom_at if oom_at >= 0 else None,
        oom_message=_oom_message(config, st) if oom_at >= 0 else None,
        peak_event_index=int(st[C.PEAK_EVENT]),
        fragmentation_at_peak=float(frag[0]),
        mark_peaks=marks,
        per_event=rec if record else None,
        state=s,
    )
