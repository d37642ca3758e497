"""Replaying snapshot traces: hand-built traces with known answers."""

import pickle

import pytest
from memgnn.predictor.sim.allocator import MiB
from memgnn.predictor.snapshot.conf import allocator_config, parse_alloc_conf, recorded_alloc_conf
from memgnn.predictor.snapshot.export import SnapshotRecorder
from memgnn.predictor.snapshot.loader import Snapshot, loads_snapshot
from memgnn.predictor.snapshot.replay import recorded_timeline, simulate_snapshot
from memgnn.predictor.snapshot.whatif import CONTRACT_FIELDS, replay_report

L = 1 << 40  # a low recorded address
H = L + 100 * MiB  # a higher one


def ev(action, addr, size):
    return {"action": action, "addr": addr, "size": size, "stream": 0}


def free(addr, size):
    return [ev("free_requested", addr, size), ev("free_completed", addr, size)]


def seg(addr, size, blocks):
    return {
        "address": addr,
        "total_size": size,
        "stream": 0,
        "segment_type": "large",
        "blocks": [{"address": a, "size": s, "state": st} for a, s, st in blocks],
    }


def tie_snapshot(with_empty_cache: bool = False) -> Snapshot:
    """Segment H (20 MiB) existed with a 12 MiB block allocated; cudaMalloc then returned a
    *lower* address L for the next segment. Once both are free, a 5 MiB request ties
    between two free 20 MiB blocks and best fit takes the lowest address: L."""
    trace = [
        ev("segment_alloc", L, 20 * MiB),
        ev("alloc", L, 9 * MiB),  # does not fit the 8 MiB left in H: a 20 MiB segment
        *free(H, 12 * MiB),  # the pre-trace block
        *free(L, 9 * MiB),
        ev("alloc", L, 5 * MiB),  # event 6
    ]
    dump = [
        seg(L, 20 * MiB, [(L, 5 * MiB, "active_allocated"), (L + 5 * MiB, 15 * MiB, "inactive")]),
        seg(H, 20 * MiB, [(H, 20 * MiB, "inactive")]),
    ]
    if with_empty_cache:
        Z = L + 300 * MiB
        trace += [
            *free(L, 5 * MiB),
            ev("segment_free", H, 20 * MiB),  # empty_cache(): both whole free segments
            ev("segment_free", L, 20 * MiB),
            ev("segment_alloc", Z, 20 * MiB),
            ev("alloc", Z, MiB + 1),
        ]
        dump = [
            seg(
                Z,
                20 * MiB,
                [(Z, MiB + 512, "active_allocated"), (Z + MiB + 512, 19 * MiB - 512, "inactive")],
            )
        ]
    return Snapshot(segments=dump, trace=trace, device=0)


def test_tie_goes_to_the_lowest_recorded_address():
    snap = tie_snapshot()
    run = simulate_snapshot(snap)
    assert run.first_divergence is None
    assert run.addresses_matched == run.requests == 2
    assert run.peak_reserved_bytes == 40 * MiB
    # With the simulator's own addresses the new segment lies above H: the tie goes to H.
    own = simulate_snapshot(snap, recorded_addresses=False)
    assert own.first_divergence["event"] == 6
    assert own.first_divergence["what"] == "placement"
    assert own.first_divergence["simulated"] == H
    assert own.peak_reserved_bytes == 40 * MiB  # the peak does not show it here


def test_recorded_timeline_block_sizes_and_peaks():
    rec = recorded_timeline(tie_snapshot())
    assert rec.model_error is None
    assert rec.segment_allocs == [20 * MiB]
    assert rec.reserved == [40 * MiB] * 7
    # initial 12 MiB; then 12 + 9; frees; then 5 MiB
    assert rec.allocated == [12 * MiB, 21 * MiB, 21 * MiB, 9 * MiB, 9 * MiB, 0, 5 * MiB]
    assert rec.peak_allocated_bytes == 21 * MiB and rec.peak_allocated_event == 1


def test_recorded_placement_the_rules_cannot_make_is_reported():
    snap = tie_snapshot()
    snap.trace[1] = ev("alloc", L + 4 * MiB, 12 * MiB)  # not the start of a free block
    rec = recorded_timeline(snap)
    assert rec.model_error["event"] == 1
    assert "no free large-pool block" in rec.model_error["reason"]


@pytest.mark.parametrize("recorded_addresses", [True, False])
def test_mid_trace_segment_free_releases_the_corresponding_segment(recorded_addresses):
    snap = tie_snapshot(with_empty_cache=True)
    run = simulate_snapshot(snap, recorded_addresses=recorded_addresses)
    assert run.segment_allocs == [20 * MiB, 20 * MiB]
    assert run.reserved[-1] == 20 * MiB  # both freed, one new
    assert run.peak_reserved_bytes == 40 * MiB
    if recorded_addresses:
        assert run.first_divergence is None


def test_replay_report_contract_fields():
    r = replay_report(tie_snapshot(with_empty_cache=True))
    assert set(CONTRACT_FIELDS) <= set(r)
    assert r["initial_reserved_bytes"] == 20 * MiB
    assert r["recorded_peak_reserved_bytes"] == r["simulated_peak_reserved_bytes"] == 40 * MiB
    assert r["recorded_peak_allocated_bytes"] == r["simulated_peak_allocated_bytes"] == 21 * MiB
    assert r["recorded_segment_allocs"] == r["simulated_segment_allocs"] == 2
    assert r["segment_allocs_matched"] == 2
    assert r["first_divergence"] is None
    assert r["would_oom"] is None and r["alloc_conf"] == "" and r["as_recorded"]
    # the end state is the dump's, block for block
    assert r["dump_blocks"] == 2
    assert r["recorded_final_blocks_differing"] == r["simulated_final_blocks_differing"] == 0
    snap = tie_snapshot(with_empty_cache=True)
    snap.segments[0]["blocks"][0]["size"] += 512  # a dump the trace does not lead to
    assert replay_report(snap)["simulated_final_blocks_differing"] == 1
    assert all(isinstance(r[k], int) for k in CONTRACT_FIELDS if k.endswith("_bytes"))


def test_oom_post_mortem_at_capacity():
    # 30 MiB: the 9 MiB request at event 1 needs a second 20 MiB segment.
    r = replay_report(tie_snapshot(), capacity_bytes=30 * MiB)
    assert r["would_oom"] is True
    o = r["oom"]
    assert (o["event"], o["request_bytes"]) == (1, 9 * MiB)
    assert (o["reserved_bytes"], o["allocated_bytes"]) == (20 * MiB, 12 * MiB)
    assert o["free_reserved_bytes"] == o["largest_free_block_bytes"] == 8 * MiB
    # Only roundup_power2_divisions:4 helps: 9 MiB rounds to 10 MiB, which gets a 10 MiB
    # segment (>= 10 MiB: rounded to 2 MiB) instead of a 20 MiB one: 30 MiB reserved.
    assert [a["alloc_conf"] for a in o["avoided_by"]] == ["roundup_power2_divisions:4"]
    assert o["avoided_by"][0]["simulated_peak_reserved_bytes"] == 30 * MiB
    for alt in o["avoided_by"]:  # each listed alternative really fits
        again = replay_report(tie_snapshot(), alloc_conf=alt["alloc_conf"], capacity_bytes=30 * MiB)
        assert again["would_oom"] is False
    assert replay_report(tie_snapshot(), capacity_bytes=40 * MiB)["would_oom"] is False


def test_what_if_expandable_starts_from_the_live_blocks():
    r = replay_report(tie_snapshot(), alloc_conf="expandable_segments:True")
    assert not r["as_recorded"] and r["initial_state"] == "live_blocks"
    # 12 MiB live, then 12 + 9 MiB: mapped in 20 MiB pages -> 40 MiB, no cached H segment.
    assert r["simulated_peak_allocated_bytes"] == 21 * MiB
    assert r["simulated_peak_reserved_bytes"] == 40 * MiB


# ---- PYTORCH_CUDA_ALLOC_CONF ----------------------------------------------------------
def test_parse_alloc_conf():
    assert parse_alloc_conf("") == {}
    assert parse_alloc_conf("expandable_segments:True, max_split_size_mb:128") == {
        "expandable_segments": True,
        "max_split_size": 128 * MiB,
    }
    assert parse_alloc_conf("garbage_collection_threshold:0.8,roundup_power2_divisions:4") == {
        "garbage_collection_threshold": 0.8,
        "roundup_power2_divisions": 4,
    }
    assert parse_alloc_conf("pinned_use_cuda_host_register:True") == {}
    cfg = allocator_config("max_split_size_mb:64", capacity_bytes=1 << 30)
    assert cfg.max_split_size == 64 * MiB and cfg.capacity_bytes == 1 << 30


@pytest.mark.parametrize(
    "text, message",
    [
        ("expandable:True", "unknown alloc conf key 'expandable'"),
        ("max_split_size_mb", "not key:value"),
        ("max_split_size_mb:big", "must be a number"),
        ("max_split_size_mb:4", "max_split_size must be >= 20 MiB"),
        ("expandable_segments:yes", "True or False"),
        ("backend:cudaMallocAsync", "only backend:native"),
        ("roundup_power2_divisions:[256:1,>:4]", "per size interval"),
        ("roundup_power2_divisions:3", "power of 2"),
    ],
)
def test_bad_alloc_conf_is_a_clear_error(text, message):
    with pytest.raises(ValueError, match=message):
        allocator_config(text)


def test_recorded_alloc_conf_from_settings():
    default = {
        "PYTORCH_CUDA_ALLOC_CONF": "",
        "max_split_size": -1,
        "expandable_segments": False,
        "garbage_collection_threshold": 0.0,
        "roundup_power2_divisions": {"1": 0, "2": 0},
    }
    assert recorded_alloc_conf(default) == ""
    assert recorded_alloc_conf(None) == ""
    assert recorded_alloc_conf(default | {"max_split_size": 256 * MiB}) == "max_split_size_mb:256"
    assert (
        recorded_alloc_conf(default | {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
        == "expandable_segments:True"
    )


def test_capacity_flushes_the_cache_instead_of_failing():
    """The OOM retry: at the capacity, cached whole free segments go back and the request
    is retried; the run fits, and the replay names the first release the recording lacks."""
    rec = SnapshotRecorder()
    rec.free(rec.malloc(30 * MiB))
    rec.malloc(35 * MiB)  # a 36 MiB segment; the free 30 MiB one stays cached
    snap = loads_snapshot(pickle.dumps(rec.snapshot()))
    r = replay_report(snap, capacity_bytes=40 * MiB)
    assert r["recorded_peak_reserved_bytes"] == 66 * MiB
    assert r["would_oom"] is False
    assert r["simulated_peak_reserved_bytes"] == 36 * MiB
    d = r["first_divergence"]
    assert (d["event"], d["what"]) == (5, "cache release (OOM retry or gc)")
    assert d["simulated"] == {"segments_freed": 1, "bytes_freed": 30 * MiB}
    assert replay_report(snap, capacity_bytes=35 * MiB)["would_oom"] is True


def test_memory_fraction_limits_the_replay():
    rec = SnapshotRecorder()
    rec.free(rec.malloc(40 * MiB))
    rec.malloc(45 * MiB)  # a 46 MiB segment; recorded: the 40 MiB one stays cached
    snap = loads_snapshot(pickle.dumps(rec.snapshot()))
    assert replay_report(snap, capacity_bytes=100 * MiB)["simulated_peak_reserved_bytes"] == (
        86 * MiB
    )
    # half of 100 MiB allowed: 40 + 46 > 50, so the cached 40 MiB goes back first.
    r = replay_report(snap, capacity_bytes=100 * MiB, memory_fraction=0.5)
    assert r["memory_fraction"] == 0.5 and r["would_oom"] is False
    assert r["simulated_peak_reserved_bytes"] == 46 * MiB
    with pytest.raises(ValueError, match="memory_fraction needs capacity_bytes"):
        replay_report(snap, memory_fraction=0.5)
