"""Snapshot geometry and trace checks: absurd sizes, blocks past segments, overlaps,
double frees; each error names the entry."""

import pickle

import pytest
from memgnn.predictor.snapshot.loader import loads_snapshot
from memgnn.predictor.snapshot.replay import recorded_timeline, simulate_snapshot
from memgnn.predictor.snapshot.unpickle import LoadLimits, SnapshotError

MiB = 1 << 20
A = 1 << 40


def ev(action, addr, size):
    return {"action": action, "addr": addr, "size": size, "stream": 0}


def seg(addr, size, blocks, device=0):
    return {
        "device": device,
        "address": addr,
        "total_size": size,
        "stream": 0,
        "segment_type": "large",
        "blocks": [{"address": a, "size": s, "state": st} for a, s, st in blocks],
    }


def load(segments, trace, **kw):
    return loads_snapshot(pickle.dumps({"segments": segments, "device_traces": [trace]}), **kw)


def test_a_2_to_the_70_byte_allocation_is_refused_naming_the_event():
    trace = [ev("segment_alloc", A, 20 * MiB), ev("alloc", A, 2**70)]
    with pytest.raises(SnapshotError, match=r"device 0 trace event 1 \(alloc\): size .*2\^70"):
        load([], trace)
    # the limit is a setting: a (hypothetical) 2 TiB device
    snap = load([], [ev("segment_alloc", A, 2 << 40)], limits=LoadLimits(max_size_bytes=4 << 40))
    assert snap.trace[0]["size"] == 2 << 40
    with pytest.raises(SnapshotError, match="segment 0 at .*beyond any device"):
        load([seg(A, 1 << 41, [])], [])
    with pytest.raises(SnapshotError, match="event 0 \\(oom\\)"):
        load([], [{"action": "oom", "size": 2**70, "device_free": 0, "stream": 0}])
    with pytest.raises(SnapshotError, match="64-bit address space"):
        load([], [ev("alloc", 2**64 - 512, 1024)])


def test_a_block_past_its_segment_is_refused():
    blocks = [(A, 10 * MiB, "active_allocated"), (A + 10 * MiB, 12 * MiB, "inactive")]
    with pytest.raises(SnapshotError, match=r"segment 0 block 1 .* runs past its segment"):
        load([seg(A, 20 * MiB, blocks)], [])
    with pytest.raises(SnapshotError, match=r"segment 0 block 0 .* runs past"):
        load([seg(A, 20 * MiB, [(A - 512, 1024, "inactive")])], [])


def test_overlapping_blocks_and_segments_are_refused():
    blocks = [(A, 10 * MiB, "active_allocated"), (A + 5 * MiB, 5 * MiB, "inactive")]
    with pytest.raises(SnapshotError, match="segment 0 block 1 .* overlaps the block before"):
        load([seg(A, 20 * MiB, blocks)], [])
    with pytest.raises(SnapshotError, match="segments 0 and 1 of device 0 overlap"):
        load([seg(A, 20 * MiB, []), seg(A + 10 * MiB, 20 * MiB, [])], [])
    # the same range on two devices is fine (separate address spaces)
    ok = [seg(A, 20 * MiB, []), seg(A + 10 * MiB, 20 * MiB, [], device=1)]
    assert loads_snapshot(pickle.dumps({"segments": ok, "device_traces": [[], []]})).segments


def _double_free_trace():
    return [
        ev("segment_alloc", A, 20 * MiB),
        ev("alloc", A, 5 * MiB),
        ev("free_requested", A, 5 * MiB),
        ev("free_completed", A, 5 * MiB),
        ev("free_requested", A, 5 * MiB),  # event 4: the second free
        ev("free_completed", A, 5 * MiB),
        ev("alloc", A, 6 * MiB),
    ]


def test_a_double_free_is_an_error_unless_tolerated():
    dump = [seg(A, 20 * MiB, [(A, 6 * MiB, "active_allocated"), (A + 6 * MiB, 14 * MiB, "")])]
    with pytest.raises(SnapshotError, match=r"trace event 4 \(free_requested\) .*double free"):
        load(dump, _double_free_trace())
    snap = load(dump, _double_free_trace(), tolerate_double_free=True)
    assert snap.double_frees == [4, 5]
    # tolerated, the replay skips them, as it silently did before
    rec, run = recorded_timeline(snap), simulate_snapshot(snap)
    assert rec.peak_allocated_bytes == run.peak_allocated_bytes == 6 * MiB
    assert run.first_divergence is None


def test_frees_of_blocks_from_before_the_recording_are_not_double_frees():
    trace = [
        ev("free_completed", A + 5 * MiB, MiB),  # its free_requested predates the trace
        ev("free_requested", A, 5 * MiB),  # allocated before recording began
        ev("free_completed", A, 5 * MiB),
        ev("alloc", A, 5 * MiB),
    ]
    assert load([seg(A, 20 * MiB, [])], trace).double_frees == []


def test_an_alloc_over_a_live_block_is_refused():
    trace = [ev("segment_alloc", A, 20 * MiB), ev("alloc", A, MiB), ev("alloc", A, MiB)]
    with pytest.raises(SnapshotError, match=r"trace event 2 \(alloc\) .* still allocated"):
        load([], trace, tolerate_double_free=True)
