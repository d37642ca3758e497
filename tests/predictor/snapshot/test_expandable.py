"""Replaying expandable-segment recordings: hand-built traces with known answers."""

import pickle

from memgnn.predictor.sim.allocator import AllocatorConfig, MiB
from memgnn.predictor.snapshot.loader import load_snapshots, loads_snapshot
from memgnn.predictor.snapshot.replay import recorded_timeline, simulate_snapshot
from memgnn.predictor.snapshot.whatif import replay_devices, replay_report

A = 1 << 40  # the recorded segment's base (the simulator's own differs)
SETTINGS = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "expandable_segments": True}


def ev(action, addr, size):
    return {"action": action, "addr": addr, "size": size, "stream": 0}


def free(addr, size):
    return [ev("free_requested", addr, size), ev("free_completed", addr, size)]


def trace(base=A):
    """20 MiB pages: 5 + 10 MiB fit the first; 8 MiB extends the 5 MiB free tail into a
    second page; empty_cache() unmaps that page once free; a 30 MiB request then fails
    with 10 MiB free on the device; 2 MiB fits the free part of the first page."""
    return [
        ev("segment_map", base, 20 * MiB),
        ev("alloc", base, 5 * MiB),
        ev("alloc", base + 5 * MiB, 10 * MiB),
        ev("segment_map", base + 20 * MiB, 20 * MiB),
        ev("alloc", base + 15 * MiB, 8 * MiB),
        *free(base + 5 * MiB, 10 * MiB),
        *free(base + 15 * MiB, 8 * MiB),
        ev("segment_unmap", base + 20 * MiB, 20 * MiB),  # event 9: empty_cache()
        {"action": "oom", "size": 30 * MiB, "device_free": 10 * MiB, "stream": 0},
        ev("alloc", base + 5 * MiB, 2 * MiB),
    ]


def dump(base=A, device=0):
    blocks = [
        {"address": base, "size": 5 * MiB, "state": "active_allocated"},
        {"address": base + 5 * MiB, "size": 2 * MiB, "state": "active_allocated"},
        {"address": base + 7 * MiB, "size": 13 * MiB, "state": "inactive"},
    ]
    return {
        "device": device,
        "address": base,
        "total_size": 20 * MiB,
        "stream": 0,
        "segment_type": "large",
        "is_expandable": True,
        "blocks": blocks,
    }


def load(t, segments, device=None):
    obj = {"segments": segments, "device_traces": t, "allocator_settings": SETTINGS}
    return loads_snapshot(pickle.dumps(obj), device=device)


def test_maps_unmaps_and_an_oom_replay_exactly():
    snap = load([trace()], [dump()])
    r = replay_report(snap)
    assert r["alloc_conf"] == "expandable_segments:True" and r["as_recorded"]
    assert r["initial_state"] == "recorded" and r["initial_reserved_bytes"] == 0
    assert r["recorded_peak_reserved_bytes"] == r["simulated_peak_reserved_bytes"] == 40 * MiB
    assert r["recorded_peak_allocated_bytes"] == r["simulated_peak_allocated_bytes"] == 23 * MiB
    assert r["recorded_segment_allocs"] == r["simulated_segment_allocs"] == 2
    assert r["segment_allocs_matched"] == 2 and r["first_divergence"] is None
    assert r["requests_at_recorded_address"] == r["requests"] == 4  # through the offsets
    assert r["segments"] == "expandable"
    assert r["recorded_mapped_bytes"] == r["simulated_mapped_bytes"] == 40 * MiB
    assert r["recorded_unmapped_bytes"] == r["simulated_unmapped_bytes"] == 20 * MiB
    assert r["recorded_final_mapped_bytes"] == r["simulated_final_mapped_bytes"] == 20 * MiB
    assert r["dump_mapped_bytes"] == 20 * MiB
    assert r["recorded_final_blocks_differing"] == r["simulated_final_blocks_differing"] == 0
    (o,) = r["recorded_ooms"]
    assert o["event"] == 10 and o["device_free_bytes"] == 10 * MiB
    assert o["simulated_reserved_bytes"] == 20 * MiB  # after the replayed empty_cache
    # 30 MiB, the free 15 MiB at the tail: at least one more 20 MiB page > 10 MiB free
    assert o["new_memory_bytes"] == [20 * MiB, 40 * MiB] and o["simulator_agrees"] is True


def test_a_different_map_is_the_first_divergence():
    t = trace()[:5]
    t[3] = ev("segment_map", A + 20 * MiB, 40 * MiB)  # the recording mapped two pages at once
    d = dump()
    d["total_size"] = 60 * MiB
    d["blocks"] = [
        {"address": A + a * MiB, "size": s * MiB, "state": st}
        for a, s, st in ((0, 5, "active_allocated"), (5, 10, "active_allocated"),
                         (15, 8, "active_allocated"), (23, 37, "inactive"))
    ]  # fmt: skip
    run = simulate_snapshot(load([t], [d]), AllocatorConfig(expandable_segments=True))
    assert run.first_divergence["event"] == 4
    assert run.first_divergence["what"] == "segment map"
    assert run.first_divergence["recorded"] == [(A + 20 * MiB, 40 * MiB)]
    assert run.first_divergence["simulated"][0][1] == 20 * MiB


def test_recorded_pass_reports_an_alloc_outside_mapped_pages():
    t = trace()
    t[2] = ev("alloc", A + 25 * MiB, 10 * MiB)  # past the one mapped page
    rec = recorded_timeline(load([t[:3]], [dump()]))
    assert rec.model_error == {
        "event": 2,
        "action": "alloc",
        "addr": A + 25 * MiB,
        "reason": "not inside mapped pages",
    }


def test_a_recording_that_began_mapped_starts_from_the_live_blocks_and_says_so():
    # Recording began after the first page was mapped and the 5 MiB block allocated.
    r = replay_report(load([trace()[2:]], [dump()]))
    assert r["initial_state"] == "live_blocks"
    assert r["initial_reserved_bytes"] == 20 * MiB  # the dump's page, not mapped in the trace
    assert r["recorded_peak_reserved_bytes"] == 40 * MiB  # the recorded pass is still exact
    assert "cannot be seeded with mapped pages" in r["initial_state_note"]


def test_several_devices_each_replayed_with_the_first_at_the_top(tmp_path):
    B = A + (1 << 36)
    d2 = dump(B, device=2)
    d2["total_size"] = 40 * MiB
    d2["blocks"] = [
        {"address": B, "size": 5 * MiB, "state": "active_allocated"},
        {"address": B + 5 * MiB, "size": 10 * MiB, "state": "active_allocated"},
        {"address": B + 15 * MiB, "size": 8 * MiB, "state": "active_allocated"},
        {"address": B + 23 * MiB, "size": 17 * MiB, "state": "inactive"},
    ]
    obj = {
        "segments": [dump(), d2],
        "device_traces": [trace(), [], trace(B)[:5]],
        "allocator_settings": SETTINGS,
    }
    path = tmp_path / "two.pickle"
    path.write_bytes(pickle.dumps(obj))
    snaps = load_snapshots(path)
    assert [s.device for s in snaps] == [0, 2] and snaps[1].segments == [d2]
    out = replay_devices(snaps)
    assert [r["device"] for r in out["devices"]] == [0, 2]
    assert out["device"] == 0 and out["simulated_peak_reserved_bytes"] == 40 * MiB
    dev2 = out["devices"][1]
    assert dev2["recorded_peak_reserved_bytes"] == dev2["simulated_peak_reserved_bytes"]
    assert dev2["simulated_peak_allocated_bytes"] == 23 * MiB
    assert dev2["simulated_final_blocks_differing"] == 0 and dev2["first_divergence"] is None
    # one device: the single-device document, unchanged (no device keys)
    one = replay_devices(snaps[:1])
    assert "devices" not in one and "device" not in one
