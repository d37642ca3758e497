"""The compiled replay core against the Python simulator, event for event.

Per event: allocated and reserved bytes and the number of segments; at the end: the
stats, the whole segment/block layout (addresses included) and the OOM event."""

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from memgnn.predictor.sim.allocator import AllocatorConfig, CachingAllocatorSim, MiB, SimulatedOOM
from memgnn.predictor.sim.replay import replay_fast

KiB = 1 << 10


def python_run(events, cfg, stop_on_oom=True):
    """The oracle: CachingAllocatorSim driven event by event, as predictor.sim.allocator.replay."""
    sim = CachingAllocatorSim(cfg)
    handles, rows, oom = {}, [], None
    for i, ev in enumerate(events):
        if ev[0] == "alloc":
            try:
                handles[ev[1]] = sim.malloc(ev[2], ev[3] if len(ev) > 3 else 0)
            except SimulatedOOM:
                oom = i if oom is None else oom
                if stop_on_oom:
                    break
                handles[ev[1]] = 0
        elif ev[0] == "free":
            sim.free(handles.pop(ev[1]))
        elif ev[0] == "empty_cache":
            sim.empty_cache()
        else:
            sim.reset_peak_stats()
        rows.append((sim.allocated, sim.reserved, len(sim._segments)))
    return sim, np.array(rows, dtype=np.int64).reshape(-1, 3).T, oom


def assert_same(events, cfg=None, stop_on_oom=True):
    cfg = cfg or AllocatorConfig()
    sim, rows, oom = python_run(events, cfg, stop_on_oom)
    fast = replay_fast(events, cfg, stop_on_oom=stop_on_oom, record=True)
    got = fast.per_event[:, : rows.shape[1]]
    if not np.array_equal(got, rows):
        i = int(np.flatnonzero((got != rows).any(axis=0))[0])
        raise AssertionError(f"event {i} {events[i]}: fast {got[:, i]} != python {rows[:, i]}")
    assert fast.oom_event_index == oom
    assert fast.stats == sim.stats()
    assert fast.snapshot() == sim.snapshot()
    return fast


# ---- every rule shape of tests/dataset/test_allocator.py --------------------------------
def _a(key, size, stream=0):
    return ("alloc", key, size, stream)


def _f(key):
    return ("free", key, 0)


EC = ("empty_cache",)
RULE_SHAPES = {
    "small_pool_shared": ([_a(i, 600 * KiB) for i in range(4)], AllocatorConfig()),
    "streams": ([_a(0, 600 * KiB), _f(0), _a(1, 600 * KiB, 1), _a(2, 600 * KiB)], None),
    "best_fit": (
        [_a(0, 14 * MiB), _a(1, 12 * MiB), _a(2, 12 * MiB), _f(2), _f(1), _f(0)]
        + [_a(3, 11 * MiB), _a(4, 11 * MiB), _a(5, 11 * MiB)],
        None,
    ),
    "split_threshold": ([_a(i, s) for i, s in enumerate([12 * MiB + 512, 13 * MiB])], None),
    "under_10mib": ([_a(0, 5 * MiB), _a(1, 5 * MiB), _a(2, 12 * MiB)], None),
    "small_split_512": ([_a(0, 2 * MiB - 512 - 1000), _a(1, 600), _a(2, 1)], None),
    "merge_release": (
        [_a(0, 5 * MiB), _a(1, 5 * MiB), _a(2, 5 * MiB), _f(1), _f(0), _f(2), EC],
        None,
    ),
    "power2_divisions": (
        [_a(0, 3_000_000), _a(1, 5 * MiB + 1)],
        AllocatorConfig(roundup_power2_divisions=4),
    ),
    "oom_retry": (
        [_a(0, 30 * MiB), _f(0), _a(1, 50 * MiB), _a(2, 40 * MiB)],
        AllocatorConfig(capacity_bytes=80 * MiB),
    ),
    "fraction": (
        [_a(0, 30 * MiB), _a(1, 30 * MiB)],
        AllocatorConfig(capacity_bytes=100 * MiB, memory_fraction=0.5),
    ),
    "max_split_small_skips_oversize": (
        [_a(0, 60 * MiB), _f(0), _a(1, 12 * MiB), _a(2, 30 * MiB)],
        AllocatorConfig(max_split_size=32 * MiB),
    ),
    "max_split_rounding": (
        [_a(0, 64 * MiB), _f(0), _a(1, 40 * MiB), _a(2, 64 * MiB), _f(2), _a(3, 50 * MiB)],
        AllocatorConfig(max_split_size=32 * MiB),
    ),
    "max_split_release_before_retry": (
        [_a(0, 60 * MiB), _f(0), _a(1, 12 * MiB)],
        AllocatorConfig(capacity_bytes=70 * MiB, max_split_size=32 * MiB),
    ),
    "gc": (
        [_a(0, 22 * MiB, 0), _a(1, 22 * MiB, 1), _f(0), _a(2, 12 * MiB, 2), _f(1)]
        + [_a(3, 12 * MiB, 4)],
        AllocatorConfig(
            capacity_bytes=100 * MiB, memory_fraction=1.0, garbage_collection_threshold=0.5
        ),
    ),
    "expandable_growing": (
        [e for i, z in enumerate(range(12, 31, 2)) for e in (_a(i, z * MiB), _f(i))],
        AllocatorConfig(expandable_segments=True),
    ),
    "expandable_small_pages": (
        [_a(i, 600 * KiB) for i in range(4)],
        AllocatorConfig(expandable_segments=True),
    ),
    "expandable_split_512": (
        [_a(0, 20 * MiB - 512), _a(1, 1)],
        AllocatorConfig(expandable_segments=True),
    ),
    "expandable_empty_cache": (
        [_a(0, 30 * MiB), _a(1, 5 * MiB), _f(0), EC, _f(1), EC],
        AllocatorConfig(expandable_segments=True),
    ),
    "expandable_oom_retry": (
        [_a(0, 40 * MiB, 0), _f(0), _a(1, 30 * MiB, 1), _a(2, 30 * MiB, 1)],
        AllocatorConfig(capacity_bytes=50 * MiB, expandable_segments=True),
    ),
    "zero_and_marks": ([_a(0, 0), ("mark", "forward", 0), _a(1, 512), _f(0), _f(1)], None),
}


@pytest.mark.parametrize("name", sorted(RULE_SHAPES))
def test_rule_shapes_match_python(name):
    events, cfg = RULE_SHAPES[name]
    assert_same(events, cfg)
    assert_same(events, cfg, stop_on_oom=False)


def test_rule_shapes_are_not_trivial():
    """The shapes above do exercise OOM, retries, gc and expandable pages."""
    oom = replay_fast(*RULE_SHAPES["expandable_oom_retry"])
    assert oom.oom and oom.stats.num_alloc_retries == 2  # one that helped, one that did not
    gc = replay_fast(*RULE_SHAPES["gc"])
    assert gc.stats.reserved_bytes == 46 * MiB  # the 22 MiB block of stream 0 was collected
    exp = replay_fast(*RULE_SHAPES["expandable_growing"])
    assert exp.stats.reserved_bytes == 40 * MiB


# ---- randomized traces -------------------------------------------------------------------
CONFIGS = [
    AllocatorConfig(),
    AllocatorConfig(capacity_bytes=200 * MiB),
    AllocatorConfig(capacity_bytes=300 * MiB, max_split_size=40 * MiB),
    AllocatorConfig(max_split_size=20 * MiB, max_non_split_rounding=0),
    AllocatorConfig(
        capacity_bytes=400 * MiB, memory_fraction=0.5, garbage_collection_threshold=0.6
    ),
    AllocatorConfig(capacity_bytes=300 * MiB, memory_fraction=0.8),
    AllocatorConfig(expandable_segments=True),
    AllocatorConfig(capacity_bytes=256 * MiB, expandable_segments=True),
    AllocatorConfig(capacity_bytes=256 * MiB, roundup_power2_divisions=4),
]
SIZES = [1, 512, 4 * KiB, 600 * KiB, MiB, MiB + 512, 3 * MiB, 12 * MiB, 21 * MiB, 50 * MiB]


def random_trace(seed: int, n: int, streams: int) -> list[tuple]:
    rng = random.Random(seed)
    live, events, key = [], [], 0
    while len(events) < n:
        r = rng.random()
        if r < 0.01:
            events.append(EC)
        elif r < 0.03:
            events.append(("mark", "phase", len(events)))
        elif live and (len(live) > 60 or r < 0.45):
            events.append(_f(live.pop(rng.randrange(len(live)))))
        else:
            size = 0 if r > 0.99 else rng.choice(SIZES) + rng.randrange(0, 70_000)
            events.append(_a(key, size, rng.randrange(streams)))
            live.append(key)
            key += 1
    return events


@settings(max_examples=80, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    cfg=st.sampled_from(CONFIGS),
    n=st.integers(1, 400),
    streams=st.sampled_from([1, 2]),
    stop=st.booleans(),
)
def test_random_traces_match_python(seed, cfg, n, streams, stop):
    assert_same(random_trace(seed, n, streams), cfg, stop_on_oom=stop)


# ---- API ----------------------------------------------------------------------------------
def test_bad_events_are_rejected():
    with pytest.raises(ValueError, match="free of unknown key"):
        replay_fast([_f(1)])
    with pytest.raises(ValueError, match="already allocated"):
        replay_fast([_a(1, 512), _a(1, 512)])
    with pytest.raises(ValueError, match="unknown op"):
        replay_fast([("resize", 1, 512)])
    with pytest.raises(ValueError, match="negative"):
        replay_fast([_a(1, -5)])


def test_many_live_blocks_grow_the_state():
    """More blocks than the first guess of block slots: the core runs again, larger."""
    events = [_a(i, 600 * KiB + 512 * (i % 7)) for i in range(3000)]
    events += [_f(i) for i in range(0, 3000, 2)]
    assert_same(events)


def test_initial_state_is_seeded():
    """A state passed in behaves as the same state built by the Python simulator."""
    sim = CachingAllocatorSim()
    h = [sim.malloc(s) for s in (600 * KiB, 12 * MiB, 5 * MiB, 30 * MiB)]
    sim.free(h[2])
    initial = sim.snapshot()
    sim.reset_peak_stats()  # a snapshot carries no history: peaks start at the seeded state
    for seg in initial:
        for b in seg["blocks"]:
            if b["allocated"]:
                b["key"] = h.index(b["address"])
    tail = [_f(0), _a(10, 4 * MiB), _a(11, 600 * KiB), _f(3), _a(12, 25 * MiB)]
    fast = replay_fast(tail, initial=initial)
    for ev in tail:
        if ev[0] == "alloc":
            h.append(sim.malloc(ev[2]))
        else:
            sim.free(h[ev[1]])
    assert fast.snapshot() == sim.snapshot()
    assert fast.stats == sim.stats()
