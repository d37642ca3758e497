"""Seeding the allocator simulator from a recorded state, and rebuilding that state."""

import pytest
from memgnn.predictor.sim.allocator import AllocatorConfig, CachingAllocatorSim, MiB
from memgnn.predictor.snapshot.loader import Snapshot
from memgnn.predictor.snapshot.state import initial_state, seed

from tests.predictor.sim.test_allocator import check_invariants

KiB = 1 << 10
A = 1 << 40  # a recorded-looking base address


# ---- the seeding API on CachingAllocatorSim ----------------------------------------------
def test_add_segment_is_reserved_free_and_used_by_best_fit():
    sim = CachingAllocatorSim()
    sim.add_segment(A, 20 * MiB)
    sim.add_segment(A + 64 * MiB, 2 * MiB)  # 2 MiB: small pool by default
    assert sim.reserved == sim.peak_reserved == 22 * MiB
    assert sim.allocated == 0
    assert sim.malloc(4 * MiB) == A  # best fit in the seeded large segment, no new segment
    assert sim.malloc(1000) == A + 64 * MiB  # small pool
    assert sim.reserved == 22 * MiB
    check_invariants(sim)
    # A new segment goes above every seeded one (never overlapping them).
    assert sim.malloc(30 * MiB) >= A + 66 * MiB


def test_add_segment_rejects_overlap_and_bad_sizes():
    sim = CachingAllocatorSim()
    sim.add_segment(A, 20 * MiB)
    with pytest.raises(ValueError, match="overlaps"):
        sim.add_segment(A + 2 * MiB, 20 * MiB)
    with pytest.raises(ValueError, match="multiples of 512"):
        sim.add_segment(A + 100 * MiB, 1000)
    with pytest.raises(ValueError, match="expandable"):
        CachingAllocatorSim(AllocatorConfig(expandable_segments=True)).add_segment(A, 2 * MiB)


def test_seed_block_carves_and_frees_merge_back():
    sim = CachingAllocatorSim()
    sim.add_segment(A, 20 * MiB)
    h = sim.seed_block(A + 4 * MiB, 3 * MiB, requested=3 * MiB - 100)
    assert h == A + 4 * MiB
    assert sim.allocated == 3 * MiB and sim.requested == 3 * MiB - 100
    blocks = sim.snapshot()[0]["blocks"]
    assert [(b["address"] - A, b["size"], b["allocated"]) for b in blocks] == [
        (0, 4 * MiB, False),
        (4 * MiB, 3 * MiB, True),
        (7 * MiB, 13 * MiB, False),
    ]
    check_invariants(sim)
    with pytest.raises(ValueError, match="no free block"):
        sim.seed_block(A + 5 * MiB, 512)  # inside the allocated block
    sim.free(h)
    assert [b["size"] for b in sim.snapshot()[0]["blocks"]] == [20 * MiB]
    sim.empty_cache()  # a seeded whole free segment goes back like any other
    assert sim.reserved == 0


def test_malloc_at_follows_the_given_block_with_the_split_rule():
    sim = CachingAllocatorSim()
    sim.add_segment(A, 20 * MiB)
    sim.add_segment(A + 20 * MiB, 20 * MiB)
    # best fit would take A (lowest address); the recorded choice is the second segment.
    assert sim.malloc_at(A + 20 * MiB, 19 * MiB + 1) == A + 20 * MiB
    # remaining 20 MiB - 19 MiB - 512 <= 1 MiB: large pool hands out the whole block.
    assert sim.allocated == 20 * MiB
    with pytest.raises(ValueError, match="no free large-pool block"):
        sim.malloc_at(A + 1 * MiB, 2 * MiB)  # not the start of a free block
    assert sim.malloc_at(A, 2 * MiB) == A  # split: 18 MiB remain free
    assert sim.allocated == 22 * MiB
    check_invariants(sim)


def test_release_segment_only_whole_free_segments():
    sim = CachingAllocatorSim()
    events = []
    sim.segment_observer = lambda *e: events.append(e)
    sim.add_segment(A, 20 * MiB)
    h = sim.malloc(5 * MiB)
    with pytest.raises(ValueError, match="no whole free segment"):
        sim.release_segment(A)
    sim.free(h)
    sim.release_segment(A)
    assert sim.reserved == 0 and sim.peak_reserved == 20 * MiB
    assert events == [("segment_free", A, 20 * MiB, 0)]  # add_segment is not cudaMalloc


def test_segment_address_hint_places_new_segments():
    sim = CachingAllocatorSim()
    events = []
    sim.segment_observer = lambda *e: events.append(e)
    sim.segment_address_hint = lambda size, stream: A if size == 20 * MiB else None
    assert sim.malloc(5 * MiB) == A
    assert events == [("segment_alloc", A, 20 * MiB, 0)]
    other = sim.malloc(30 * MiB)  # hint answers None: the simulator's own address
    assert other >= A + 20 * MiB  # above the hinted segment, not overlapping it
    assert sim.reserved == 50 * MiB
    check_invariants(sim)


# ---- rebuilding the state when recording began ------------------------------------------
def _seg(addr, size, blocks, small=False):
    return {
        "address": addr,
        "total_size": size,
        "stream": 0,
        "segment_type": "small" if small else "large",
        "blocks": blocks,
    }


def test_initial_state_first_segment_event_decides():
    # Dump: segment X (alive all along, one pre-trace block still allocated),
    # segment Y (freed at the start, then allocated again at the same address).
    X, Y = A, A + 100 * MiB
    dump = [
        _seg(
            X,
            20 * MiB,
            [
                {
                    "address": X,
                    "size": 4 * MiB,
                    "state": "active_allocated",
                    "requested_size": 4 * MiB,
                },
                {"address": X + 4 * MiB, "size": 16 * MiB, "state": "inactive"},
            ],
        ),
        _seg(Y, 40 * MiB, [{"address": Y, "size": 40 * MiB, "state": "inactive"}]),
    ]
    trace = [
        {"action": "free_completed", "addr": Y, "size": 10 * MiB - 100, "stream": 0},
        {"action": "segment_free", "addr": Y, "size": 20 * MiB, "stream": 0},
        {"action": "segment_alloc", "addr": Y, "size": 40 * MiB, "stream": 0},
        {"action": "alloc", "addr": Y, "size": 30 * MiB, "stream": 0},
        {"action": "free_completed", "addr": Y, "size": 30 * MiB, "stream": 0},
    ]
    st = initial_state(Snapshot(segments=dump, trace=trace, device=0))
    assert [(s.address, s.size) for s in st.segments] == [(X, 20 * MiB), (Y, 20 * MiB)]
    assert st.reserved_bytes == 40 * MiB
    # Y's pre-trace block: round_size(10 MiB - 100) = 10 MiB; the 10 MiB after it is
    # > 1 MiB, so it was split off and the block is 10 MiB.
    assert sorted((b.address, b.size) for b in st.blocks) == [(X, 4 * MiB), (Y, 10 * MiB)]
    sim = CachingAllocatorSim()
    handles = seed(sim, st)
    assert sim.allocated == 14 * MiB and set(handles) == {X, Y}
    check_invariants(sim)


def test_initial_state_whole_block_when_the_rest_cannot_be_split_off():
    X = A
    dump = [_seg(X, 20 * MiB, [{"address": X, "size": 20 * MiB, "state": "inactive"}])]
    trace = [{"action": "free_completed", "addr": X, "size": 19 * MiB + 512, "stream": 0}]
    st = initial_state(Snapshot(segments=dump, trace=trace, device=0))
    # remaining 20 MiB - (19 MiB + 512) <= 1 MiB: the large-pool block was the whole segment
    assert [(b.address, b.size, b.requested) for b in st.blocks] == [(X, 20 * MiB, 19 * MiB + 512)]


def test_expandable_initial_state_undoes_the_trace_on_the_dump():
    """The dump maps [A, A+60 MiB); the trace mapped [A+20, A+40) and unmapped
    [A+60, A+80): at the start [A, A+20) and [A+40, A+80) were mapped, and the block
    freed first was live (its size rounded: expandable blocks always split)."""
    ev = lambda act, addr, size: {"action": act, "addr": addr, "size": size, "stream": 0}
    trace = [
        ev("free_requested", A + 50 * MiB, 3 * MiB + 1),
        ev("free_completed", A + 50 * MiB, 3 * MiB + 1),
        ev("segment_unmap", A + 60 * MiB, 20 * MiB),
        ev("segment_map", A + 20 * MiB, 20 * MiB),
        ev("alloc", A + 20 * MiB, 5 * MiB),
    ]
    blocks = [{"address": A + 20 * MiB, "size": 5 * MiB, "state": "active_allocated"}]
    dump = [_seg(A, 60 * MiB, blocks) | {"is_expandable": True}]
    st = initial_state(Snapshot(segments=dump, trace=trace, device=0))
    assert st.expandable and st.segments == []
    assert st.mapped == [(A, A + 20 * MiB), (A + 40 * MiB, A + 80 * MiB)]
    assert st.reserved_bytes == 60 * MiB
    assert [(b.address, b.size) for b in st.blocks] == [(A + 50 * MiB, 3 * MiB + 512)]
    bad = [ev("segment_map", A + 100 * MiB, 20 * MiB)]  # mapped, yet not in the dump
    with pytest.raises(ValueError, match=r"trace event 0 \(segment_map .* does not fit"):
        initial_state(Snapshot(segments=dump, trace=bad, device=0))


def test_a_pre_trace_free_outside_every_segment_is_counted_not_seeded():
    trace = [{"action": "free_completed", "addr": A, "size": 4096, "stream": 0}]
    st = initial_state(Snapshot(segments=[], trace=trace, device=0))
    assert st.orphans == [A] and st.blocks == [] and st.segments == []
