"""The safe snapshot loader: plain data only, limits, clear errors."""

import gzip
import os
import pickle

import pytest
from memgnn.predictor.snapshot.loader import (
    LoadLimits,
    SnapshotError,
    load_snapshot,
    loads_snapshot,
)


def _snap(**extra):
    seg = {
        "device": 0,
        "address": 1 << 32,
        "total_size": 2 << 20,
        "stream": 0,
        "segment_type": "small",
        "blocks": [{"address": 1 << 32, "size": 2 << 20, "state": "inactive"}],
    }
    trace = [{"action": "alloc", "addr": 1 << 32, "size": 100, "stream": 0}]
    return {"segments": [seg], "device_traces": [trace], **extra}


def test_loads_plain_and_gzip(tmp_path):
    data = pickle.dumps(_snap(allocator_settings={"expandable_segments": False}))
    for name, raw in (("a.pickle", data), ("a.pickle.gz", gzip.compress(data))):
        path = tmp_path / name
        path.write_bytes(raw)
        snap = load_snapshot(path)
        assert snap.device == 0
        assert snap.trace[0]["size"] == 100
        assert snap.segments[0]["total_size"] == 2 << 20
        assert snap.allocator_settings == {"expandable_segments": False}


class _RunsCode:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


def test_code_running_pickle_is_refused_and_nothing_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    raw = pickle.dumps({"segments": [], "device_traces": [[]], "x": _RunsCode()})
    assert b"system" in raw  # the pickle really names os.system
    for blob in (raw, gzip.compress(raw)):
        with pytest.raises(SnapshotError, match="refusing to load .*system"):
            loads_snapshot(blob)
    assert not (tmp_path / "pwned").exists()


def test_any_global_is_refused():
    raw = pickle.dumps({"segments": [], "device_traces": [[]], "t": {1, 2}.__class__})
    with pytest.raises(SnapshotError, match="refusing to load builtins.set"):
        loads_snapshot(raw)


def test_old_list_format_and_non_snapshots():
    with pytest.raises(SnapshotError, match="bare list .*old _snapshot"):
        loads_snapshot(pickle.dumps([{"address": 1, "blocks": []}]))
    with pytest.raises(SnapshotError, match="not a CUDA memory snapshot"):
        loads_snapshot(pickle.dumps({"hello": 1}))
    with pytest.raises(SnapshotError, match="not a readable pickle"):
        loads_snapshot(b"not a pickle at all")
    with pytest.raises(SnapshotError, match="not a readable gzip"):
        loads_snapshot(b"\x1f\x8bgarbage")
    with pytest.raises(SnapshotError, match="trace event 0"):
        loads_snapshot(pickle.dumps({"segments": [], "device_traces": [[{"size": 1}]]}))


def test_size_limit_applies_to_decompressed_bytes():
    raw = pickle.dumps(_snap(pad="x" * 100_000))
    blob = gzip.compress(raw)
    assert len(blob) < 10_000 < len(raw)
    with pytest.raises(SnapshotError, match="larger than max_bytes=50000 bytes"):
        loads_snapshot(blob, limits=LoadLimits(max_bytes=50_000))
    assert loads_snapshot(blob, limits=LoadLimits(max_bytes=200_000)).trace


def test_depth_limit_and_shared_references():
    deep: list = []
    for _ in range(100):
        deep = [deep]
    with pytest.raises(SnapshotError, match="nests deeper than max_depth=64"):
        loads_snapshot(pickle.dumps(_snap(deep=deep)))
    # 40 levels of a list holding the same list twice: 2**40 paths, walked once each.
    shared: list = []
    for _ in range(40):
        shared = [shared, shared]
    assert loads_snapshot(pickle.dumps(_snap(shared=shared))).trace


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(SnapshotError, match="cannot read snapshot"):
        load_snapshot(tmp_path / "nope.pickle")


def test_malformed_events_and_segments_are_clear_errors():
    bad_event = {"action": "alloc", "addr": "0x10", "size": 4}
    with pytest.raises(SnapshotError, match="trace event 0 .alloc. needs non-negative int"):
        loads_snapshot(pickle.dumps({"segments": [], "device_traces": [[bad_event]]}))
    with pytest.raises(SnapshotError, match="segment 0 needs int address"):
        loads_snapshot(pickle.dumps({"segments": [{"address": -1}], "device_traces": [[]]}))
    with pytest.raises(SnapshotError, match="not a readable pickle"):
        loads_snapshot(pickle.dumps(_snap())[:-5])  # truncated
    # markers without addresses are fine
    snap = loads_snapshot(
        pickle.dumps({"segments": [], "device_traces": [[{"action": "snapshot"}]]})
    )
    assert snap.trace == [{"action": "snapshot"}]


def test_file_size_limit(tmp_path):
    path = tmp_path / "big.pickle"
    path.write_bytes(pickle.dumps(_snap(pad="x" * 10_000)))
    with pytest.raises(SnapshotError, match="larger than max_bytes=5000 bytes"):
        load_snapshot(path, limits=LoadLimits(max_bytes=5000))
