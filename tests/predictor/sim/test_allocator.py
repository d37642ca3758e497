"""Hand-built traces with known answers, one (or more) per allocator rule.

Expected numbers follow the rules of ``c10/cuda/CUDACachingAllocator.cpp`` (PyTorch v2.13.0).
"""

import random

import pytest
import torch
from memgnn.predictor.sim.allocator import (
    AllocatorConfig,
    CachingAllocatorSim,
    MiB,
    SimulatedOOM,
    get_allocation_size,
    replay,
    round_size,
)

KiB = 1 << 10


def check_invariants(sim: CachingAllocatorSim) -> None:
    """Segments tile exactly, no two free neighbours, totals match the counters."""
    segs = sim.snapshot()
    assert sum(s["size"] for s in segs) == sim.stats().reserved_bytes
    allocated = 0
    for seg in segs:
        addr, prev_free = seg["address"], False
        for b in seg["blocks"]:
            assert b["address"] == addr
            assert not (prev_free and not b["allocated"]), "unmerged free neighbours"
            prev_free = not b["allocated"]
            allocated += b["size"] if b["allocated"] else 0
            addr += b["size"]
    assert allocated == sim.stats().allocated_bytes


# ---- rounding and segment sizes ---------------------------------------------------------
def test_round_size_512():
    assert round_size(1) == 512
    assert round_size(0) == 512
    assert round_size(512) == 512
    assert round_size(513) == 1024
    assert round_size(600 * KiB) == 614400


def test_round_size_power2_divisions():
    # 3,000,000 lies in [2 MiB, 4 MiB); 4 divisions -> steps of 512 KiB -> 3 MiB.
    assert round_size(3_000_000, 4) == 3 * MiB
    assert round_size(5 * MiB + 1, 4) == 6 * MiB
    assert round_size(4 * MiB, 4) == 4 * MiB  # powers of two stay
    assert round_size(1200, 4) == 1536  # <= 512 * divisions: plain 512 rounding
    assert round_size(3_000_000) == 3_000_320  # off by default
    sim = CachingAllocatorSim(AllocatorConfig(roundup_power2_divisions=4))
    sim.malloc(3_000_000)
    assert sim.stats().allocated_bytes == 3 * MiB


def test_get_allocation_size():
    assert get_allocation_size(512) == 2 * MiB
    assert get_allocation_size(MiB) == 2 * MiB
    assert get_allocation_size(MiB + 512) == 20 * MiB
    assert get_allocation_size(10 * MiB - 512) == 20 * MiB
    assert get_allocation_size(10 * MiB) == 10 * MiB
    assert get_allocation_size(10 * MiB + 512) == 12 * MiB


# ---- small pool, streams, best fit ------------------------------------------------------
def test_three_600k_allocs_share_one_small_segment():
    sim = CachingAllocatorSim()
    handles = [sim.malloc(600 * KiB) for _ in range(3)]
    st = sim.stats()
    assert st.allocated_bytes == 3 * 614400
    assert st.reserved_bytes == 2 * MiB
    assert st.num_segments == 1
    assert st.inactive_split_bytes == 2 * MiB - 3 * 614400
    # the allocations take the low addresses of the segment, in order
    base = sim.snapshot()[0]["address"]
    assert handles == [base, base + 614400, base + 2 * 614400]
    sim.malloc(600 * KiB)  # 253,952 B left: does not fit -> second small segment
    assert sim.stats().reserved_bytes == 4 * MiB
    assert sim.stats().num_segments == 2
    check_invariants(sim)


def test_streams_never_share_blocks():
    sim = CachingAllocatorSim()
    sim.free(sim.malloc(600 * KiB, stream=0))
    h1 = sim.malloc(600 * KiB, stream=1)
    assert sim.stats().reserved_bytes == 4 * MiB
    h0 = sim.malloc(600 * KiB, stream=0)  # reuses the cached stream-0 segment
    assert sim.stats().reserved_bytes == 4 * MiB
    segs = {s["stream"]: s["address"] for s in sim.snapshot()}
    assert h0 == segs[0] and h1 == segs[1]


def test_best_fit_picks_smallest_then_lowest_address():
    sim = CachingAllocatorSim()
    big = sim.malloc(14 * MiB)  # lowest address, 14 MiB segment
    a = sim.malloc(12 * MiB)
    b = sim.malloc(12 * MiB)
    assert big < a < b
    for h in (b, a, big):
        sim.free(h)
    # 11 MiB fits all three; the smallest (12 MiB) wins, and the lower of the two
    h = sim.malloc(11 * MiB)
    assert h == a
    # remaining 1 MiB is not > 1 MiB: the whole 12 MiB block is handed out
    assert sim.stats().allocated_bytes == 12 * MiB
    assert sim.stats().requested_bytes == 11 * MiB
    assert sim.malloc(11 * MiB) == b
    assert sim.malloc(11 * MiB) == big  # 14 MiB block: remaining 3 MiB -> split
    assert sim.stats().allocated_bytes == 35 * MiB
    assert sim.stats().reserved_bytes == 38 * MiB
    check_invariants(sim)


# ---- splitting --------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("request_bytes", "allocated"),
    [
        (12 * MiB + 512, 12 * MiB + 512),  # segment 14 MiB, rest 2 MiB - 512 > 1 MiB: split
        (13 * MiB - 512, 13 * MiB - 512),  # rest 1 MiB + 512 > 1 MiB: split
        (13 * MiB, 14 * MiB),  # rest exactly 1 MiB: not split, whole block counted
    ],
)
def test_large_pool_split_threshold(request_bytes, allocated):
    sim = CachingAllocatorSim()
    sim.malloc(request_bytes)
    st = sim.stats()
    assert st.reserved_bytes == 14 * MiB
    assert st.allocated_bytes == allocated
    assert st.requested_bytes == request_bytes
    assert st.inactive_split_bytes == 14 * MiB - allocated


def test_large_request_under_10mib_splits_20mib_segment():
    sim = CachingAllocatorSim()
    h = sim.malloc(2 * MiB)
    seg = sim.snapshot()[0]
    assert seg["size"] == 20 * MiB
    assert [(b["address"], b["size"], b["allocated"]) for b in seg["blocks"]] == [
        (h, 2 * MiB, True),
        (h + 2 * MiB, 18 * MiB, False),
    ]
    sim.malloc(5 * MiB)  # best fit in the 18 MiB remainder
    assert sim.stats().reserved_bytes == 20 * MiB


def test_small_pool_splits_down_to_512():
    sim = CachingAllocatorSim()
    sim.malloc(MiB - 512)  # 2 MiB segment, rest 1 MiB + 512
    sim.malloc(MiB)  # rest 512 >= 512: split
    assert sim.stats().inactive_split_bytes == 512
    sim.malloc(1)  # takes the 512 B block exactly
    st = sim.stats()
    assert (st.allocated_bytes, st.reserved_bytes, st.num_segments) == (2 * MiB, 2 * MiB, 1)
    assert st.largest_free_block_bytes == 0


# ---- freeing, merging, empty_cache, fragmentation --------------------------------------
def test_merge_makes_segment_releasable_and_fragmentation():
    sim = CachingAllocatorSim()
    h1, h2, h3 = (sim.malloc(600 * KiB) for _ in range(3))
    assert sim.stats().fragmentation == 1.0  # the 253,952 B tail is the only free block
    sim.free(h2)
    st = sim.stats()
    assert st.inactive_split_bytes == 614400 + 253952
    assert st.largest_free_block_bytes == 614400
    assert st.free_reserved_bytes == 614400 + 253952
    assert st.fragmentation == pytest.approx(614400 / (614400 + 253952))
    sim.free(h3)  # merges with h2 and the tail
    assert sim.stats().largest_free_block_bytes == 2 * 614400 + 253952
    assert sim.stats().fragmentation == 1.0
    sim.empty_cache()  # segment still split by h1: nothing goes back
    assert sim.stats().reserved_bytes == 2 * MiB
    sim.free(h1)
    assert sim.stats().inactive_split_bytes == 0
    assert sim.snapshot()[0]["blocks"] == [
        {"address": h1, "size": 2 * MiB, "allocated": False, "requested_size": 0}
    ]
    sim.empty_cache()
    st = sim.stats()
    assert (st.reserved_bytes, st.num_segments, st.peak_reserved_bytes) == (0, 0, 2 * MiB)
    assert st.fragmentation == 1.0


def test_free_errors_and_zero_size():
    sim = CachingAllocatorSim()
    assert sim.malloc(0) == 0
    sim.free(0)  # null pointer: no-op
    assert sim.stats().reserved_bytes == 0
    h = sim.malloc(100)
    sim.free(h)
    with pytest.raises(ValueError):
        sim.free(h)
    with pytest.raises(ValueError):
        sim.free(12345)
    with pytest.raises(ValueError):
        sim.malloc(-1)


def test_reset_peak_stats():
    sim = CachingAllocatorSim()
    sim.free(sim.malloc(12 * MiB))
    sim.empty_cache()
    assert sim.stats().peak_reserved_bytes == 12 * MiB
    sim.reset_peak_stats()
    st = sim.stats()
    assert (st.peak_reserved_bytes, st.peak_allocated_bytes, st.peak_requested_bytes) == (0, 0, 0)


# ---- out of memory ----------------------------------------------------------------------
def test_oom_retry_frees_cached_segments_then_succeeds():
    sim = CachingAllocatorSim(AllocatorConfig(capacity_bytes=40 * MiB))
    sim.free(sim.malloc(30 * MiB, stream=0))
    sim.malloc(12 * MiB, stream=1)  # 30 + 12 > 40: release the cached 30 MiB, retry
    st = sim.stats()
    assert st.num_alloc_retries == 1
    assert st.num_ooms == 0
    assert st.reserved_bytes == 12 * MiB
    assert st.peak_reserved_bytes == 30 * MiB


def test_oom_raises_simulated_oom():
    sim = CachingAllocatorSim(AllocatorConfig(capacity_bytes=40 * MiB))
    sim.malloc(30 * MiB)
    with pytest.raises(SimulatedOOM) as info:
        sim.malloc(12 * MiB)
    assert isinstance(info.value, torch.OutOfMemoryError)
    assert "Tried to allocate 12.00 MiB" in str(info.value)
    assert "reserved" in str(info.value)
    st = sim.stats()
    assert (st.num_ooms, st.num_alloc_retries, st.reserved_bytes) == (1, 1, 30 * MiB)
    assert st.would_oom


def test_memory_fraction_limit():
    cfg = AllocatorConfig(capacity_bytes=100 * MiB, memory_fraction=0.5)  # 50 MiB allowed
    sim = CachingAllocatorSim(cfg)
    sim.malloc(30 * MiB)
    with pytest.raises(SimulatedOOM) as info:
        sim.malloc(30 * MiB)  # 60 > 50 although the device has room
    assert "50.00 MiB allowed" in str(info.value)
    assert (sim.stats().num_alloc_retries, sim.stats().num_ooms) == (1, 1)
    # the fraction failure also goes through release_cached_blocks + retry
    sim = CachingAllocatorSim(cfg)
    sim.free(sim.malloc(30 * MiB, stream=0))
    sim.malloc(24 * MiB, stream=1)
    st = sim.stats()
    assert (st.num_alloc_retries, st.num_ooms, st.reserved_bytes) == (1, 0, 24 * MiB)


# ---- max_split_size ---------------------------------------------------------------------
def test_max_split_small_request_skips_oversize_block():
    default = CachingAllocatorSim()
    default.free(default.malloc(40 * MiB))
    default.malloc(12 * MiB)  # splits the cached 40 MiB block
    assert default.stats().reserved_bytes == 40 * MiB
    sim = CachingAllocatorSim(AllocatorConfig(max_split_size=32 * MiB))
    sim.free(sim.malloc(40 * MiB))
    sim.malloc(12 * MiB)  # 40 MiB block is oversize: new 12 MiB segment
    assert sim.stats().reserved_bytes == 52 * MiB


def test_max_split_large_request_rounding_limit():
    cfg = AllocatorConfig(max_split_size=32 * MiB)
    sim = CachingAllocatorSim(cfg)
    sim.free(sim.malloc(60 * MiB))
    sim.malloc(40 * MiB)  # 60 >= 40 + 20: not taken
    assert sim.stats().reserved_bytes == 100 * MiB
    sim = CachingAllocatorSim(cfg)
    sim.free(sim.malloc(60 * MiB))
    sim.malloc(45 * MiB)  # 60 < 45 + 20: taken whole (never split at/above max_split)
    st = sim.stats()
    assert (st.reserved_bytes, st.allocated_bytes, st.requested_bytes) == (
        60 * MiB,
        60 * MiB,
        45 * MiB,
    )
    sim = CachingAllocatorSim(
        AllocatorConfig(max_split_size=32 * MiB, max_non_split_rounding=30 * MiB)
    )
    sim.free(sim.malloc(60 * MiB))
    sim.malloc(40 * MiB)  # 60 < 40 + 30
    assert sim.stats().reserved_bytes == 60 * MiB


def test_max_split_releases_oversize_block_before_retry():
    cfg = AllocatorConfig(capacity_bytes=70 * MiB, max_split_size=32 * MiB)
    sim = CachingAllocatorSim(cfg)
    sim.free(sim.malloc(60 * MiB))
    sim.malloc(12 * MiB)  # 60 + 12 > 70: release_available_cached_blocks frees the 60 MiB
    st = sim.stats()
    assert (st.reserved_bytes, st.num_alloc_retries) == (12 * MiB, 0)


# ---- garbage collection -----------------------------------------------------------------
def _gc_trace(threshold):
    cfg = AllocatorConfig(
        capacity_bytes=100 * MiB, memory_fraction=1.0, garbage_collection_threshold=threshold
    )
    sim = CachingAllocatorSim(cfg)
    a = sim.malloc(22 * MiB, stream=0)  # large-pool call 1
    b = sim.malloc(22 * MiB, stream=1)  # call 2
    sim.free(a)  # A cached at call 2
    sim.malloc(12 * MiB, stream=2)  # call 3: reserved 44 <= 50, no gc; -> 56
    sim.free(b)  # B cached at call 3
    sim.malloc(12 * MiB, stream=4)  # call 4: ages A=2, B=1, mean 1.5 -> A freed
    return sim, a, b


def test_garbage_collection_frees_old_blocks():
    sim, a, b = _gc_trace(0.5)
    st = sim.stats()
    assert st.reserved_bytes == 56 * MiB - 22 * MiB + 12 * MiB
    assert st.num_alloc_retries == 0
    addresses = {s["address"] for s in sim.snapshot()}
    assert a not in addresses and b in addresses
    no_gc, _, _ = _gc_trace(None)
    assert no_gc.stats().reserved_bytes == 68 * MiB


def test_garbage_collection_idle_below_threshold():
    sim, _, _ = _gc_trace(0.9)  # 90 MiB threshold: never passed
    assert sim.stats().reserved_bytes == 68 * MiB


# ---- expandable segments ----------------------------------------------------------------
def _growing_trace(cfg):
    sim = CachingAllocatorSim(cfg)
    for size in range(12, 31, 2):  # 12, 14, ..., 30 MiB, each freed before the next
        sim.free(sim.malloc(size * MiB))
        check_invariants(sim)
    return sim.stats()


def test_expandable_segments_lower_reserved_on_growing_sizes():
    default = _growing_trace(AllocatorConfig())
    assert default.reserved_bytes == sum(range(12, 31, 2)) * MiB  # 210 MiB, no reuse
    assert default.num_segments == 10
    exp = _growing_trace(AllocatorConfig(expandable_segments=True))
    assert exp.reserved_bytes == 40 * MiB  # two 20 MiB pages
    assert exp.num_segments == 1
    assert exp.inactive_split_bytes == 0  # not tracked for expandable segments


def test_expandable_small_pages_grow_one_segment():
    sim = CachingAllocatorSim(AllocatorConfig(expandable_segments=True))
    for _ in range(4):
        sim.malloc(600 * KiB)  # 4 x 614,400 B > 2 MiB: a second 2 MiB page is mapped
    st = sim.stats()
    assert (st.reserved_bytes, st.num_segments) == (4 * MiB, 1)
    check_invariants(sim)


def test_expandable_splits_any_remainder_of_512():
    sim = CachingAllocatorSim(AllocatorConfig(expandable_segments=True))
    sim.malloc(20 * MiB - 512)
    assert sim.stats().allocated_bytes == 20 * MiB - 512
    sim.malloc(1)  # small pool: its own 2 MiB page
    assert sim.stats().reserved_bytes == 22 * MiB
    default = CachingAllocatorSim()
    default.malloc(20 * MiB - 512)
    assert default.stats().allocated_bytes == 20 * MiB


def test_expandable_empty_cache_unmaps_free_pages():
    sim = CachingAllocatorSim(AllocatorConfig(expandable_segments=True))
    a = sim.malloc(30 * MiB)  # maps pages [0, 40) MiB
    b = sim.malloc(5 * MiB)  # [30, 35)
    sim.free(a)
    sim.empty_cache()  # page [0, 20) is wholly free: unmapped; [20, 30) stays mapped
    st = sim.stats()
    assert (st.reserved_bytes, st.allocated_bytes, st.num_segments) == (20 * MiB, 5 * MiB, 1)
    check_invariants(sim)
    sim.free(b)
    sim.empty_cache()
    assert sim.stats().reserved_bytes == 0
    assert sim.snapshot() == [] and sim.exp_segments == []


def test_expandable_oom_then_retry_unmaps():
    cfg = AllocatorConfig(capacity_bytes=50 * MiB, expandable_segments=True)
    sim = CachingAllocatorSim(cfg)
    sim.free(sim.malloc(40 * MiB, stream=0))
    sim.malloc(30 * MiB, stream=1)  # 40 + 40 > 60: unmap stream 0's pages, retry
    st = sim.stats()
    assert (st.reserved_bytes, st.num_alloc_retries, st.num_ooms) == (40 * MiB, 1, 0)
    with pytest.raises(SimulatedOOM):
        sim.malloc(30 * MiB, stream=1)  # 10 MiB free + a 20 MiB page, but 40 + 20 > 50
    st = sim.stats()
    assert (st.num_ooms, st.num_alloc_retries, st.reserved_bytes) == (1, 2, 40 * MiB)


# ---- config -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs",
    [
        {"capacity_bytes": -1},
        {"memory_fraction": 0.5},  # no capacity to take a fraction of
        {"capacity_bytes": MiB, "memory_fraction": 1.5},
        {"max_split_size": MiB},
        {"max_non_split_rounding": -1},
        {"roundup_power2_divisions": 3},
        {"roundup_power2_divisions": -2},
        {"capacity_bytes": MiB, "memory_fraction": 0.5, "garbage_collection_threshold": 1.0},
        {"garbage_collection_threshold": 0.0},
    ],
)
def test_config_rejects_bad_values(kwargs):
    with pytest.raises(ValueError):
        AllocatorConfig(**kwargs)


# ---- replay -----------------------------------------------------------------------------
def test_replay_trace():
    events = [
        ("alloc", 1, 600 * KiB),
        ("alloc", 2, 0),  # null pointer, nothing allocated
        ("alloc", 3, 12 * MiB, 1),
        ("free", 1, 0),
        ("free", 2, 0),
        ("free", 3, 0, 1),
        ("alloc", 4, 600 * KiB),  # reuses the small segment
    ]
    res = replay(events)
    assert not res.oom and res.oom_event_index is None
    assert res.peak_event_index == 2
    assert res.stats.reserved_bytes == 14 * MiB
    assert res.stats.allocated_bytes == 614400
    assert res.stats.peak_allocated_bytes == 614400 + 12 * MiB


def test_replay_oom_stop_and_continue():
    events = [
        ("alloc", "a", 12 * MiB),
        ("alloc", "b", 12 * MiB),  # 24 > 20: OOM
        ("free", "a", 0),
        ("alloc", "c", 12 * MiB),  # reuses a's block
        ("free", "b", 0),  # b never existed: ignored
    ]
    cfg = AllocatorConfig(capacity_bytes=20 * MiB)
    res = replay(events, cfg)
    assert res.oom and res.oom_event_index == 1
    assert (res.stats.allocated_bytes, res.stats.num_ooms) == (12 * MiB, 1)
    res = replay(events, cfg, stop_on_oom=False)
    assert res.oom and res.oom_event_index == 1
    assert (res.stats.allocated_bytes, res.stats.reserved_bytes) == (12 * MiB, 12 * MiB)
    assert res.stats.num_ooms == 1


def test_replay_rejects_bad_events():
    with pytest.raises(ValueError):
        replay([("free", 1, 0)])
    with pytest.raises(ValueError):
        replay([("alloc", 1, 512), ("alloc", 1, 512)])
    with pytest.raises(ValueError):
        replay([("resize", 1, 512)])


# ---- performance sanity -----------------------------------------------------------------
def _random_trace(n_events: int, seed: int = 0) -> list[tuple]:
    rng = random.Random(seed)
    sizes = [512, 4 * KiB, 600 * KiB, MiB, 3 * MiB, 12 * MiB, 50 * MiB]
    live: list[int] = []
    events: list[tuple] = []
    key = 0
    while len(events) < n_events:
        if live and (len(live) > 400 or rng.random() < 0.45):
            events.append(("free", live.pop(rng.randrange(len(live))), 0))
        else:
            size = rng.choice(sizes) + rng.randrange(0, 4096)
            events.append(("alloc", key, size, rng.randrange(2)))
            live.append(key)
            key += 1
    return events


@pytest.mark.parametrize("expandable", [False, True])
def test_replay_20k_events_completes(expandable):
    events = _random_trace(20_000)
    res = replay(events, AllocatorConfig(expandable_segments=expandable))
    st = res.stats
    assert not res.oom
    assert 0 < st.allocated_bytes <= st.reserved_bytes <= st.peak_reserved_bytes
    assert st.requested_bytes <= st.allocated_bytes
    assert 0.0 < st.fragmentation <= 1.0


def test_random_trace_invariants_with_limit():
    events = _random_trace(3_000, seed=1)
    for cfg in (
        AllocatorConfig(capacity_bytes=2 << 30),
        AllocatorConfig(capacity_bytes=2 << 30, expandable_segments=True),
        AllocatorConfig(
            capacity_bytes=2 << 30,
            memory_fraction=0.9,
            max_split_size=64 * MiB,
            garbage_collection_threshold=0.6,
        ),
    ):
        sim = CachingAllocatorSim(cfg)
        handles = {}
        for i, (op, key, size, *rest) in enumerate(events):
            if op == "alloc":
                try:
                    handles[key] = sim.malloc(size, rest[0])
                except SimulatedOOM:
                    handles[key] = 0
            else:
                sim.free(handles.pop(key))
            if i % 500 == 0:
                check_invariants(sim)
        check_invariants(sim)
        assert sim.stats().reserved_bytes <= 2 << 30
