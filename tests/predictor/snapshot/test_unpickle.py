"""The bounded data-only unpickler: limits crossed while building, refused opcodes."""

import gzip
import io
import pickle
import tracemalloc

import pytest
from memgnn.predictor.snapshot.loader import loads_snapshot
from memgnn.predictor.snapshot.unpickle import (
    LoadLimits,
    SnapshotError,
    bounded_load,
    fast_path_bytes,
)

MiB = 1 << 20


def _empty_dicts(n: int) -> bytes:
    """A list of ``n`` empty dicts, one opcode byte each (the hostile probe's upload)."""
    return b"\x80\x04](" + b"}" * n + b"e."


@pytest.mark.slow  # about 5-13 s on 2 shared cores (tracemalloc slows allocation)
def test_eight_million_empty_dicts_are_refused_while_building_with_little_memory():
    blob = gzip.compress(_empty_dicts(8_000_000), 9)
    assert len(blob) < 12_000  # a few KB upload
    tracemalloc.start()
    try:
        with pytest.raises(SnapshotError, match="max_memory_bytes=134,217,728|max_objects"):
            loads_snapshot(blob, what="upload")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # Unbounded, the C unpickler builds all 8 M dicts: 1.33 GB measured on the server.
    assert peak < 200 * MiB


def test_each_limit_names_itself():
    data = pickle.dumps({"k": [[1, 2], [3, 4]] * 1000, "s": "x" * 5000}, protocol=4)
    _, work = bounded_load(data, LoadLimits(), "x", always_count=True)
    assert work["bytes"] == len(data) and work["depth"] == 3
    assert 2000 < work["objects"] < 10_000 and work["memory_bytes"] > 5000
    for limits, name in (
        (LoadLimits(max_objects=work["objects"] - 1), "max_objects"),
        (LoadLimits(max_memory_bytes=work["memory_bytes"] - 1), "max_memory_bytes"),
        (LoadLimits(max_bytes=len(data) - 1), "max_bytes"),
    ):
        with pytest.raises(SnapshotError, match=f"{name}="):
            bounded_load(data, limits, "x", always_count=True)
    with pytest.raises(SnapshotError, match="max_depth=4"):
        bounded_load(
            pickle.dumps([[[[["deep"]]]]]), LoadLimits(max_depth=4), "x", always_count=True
        )


def test_counting_and_fast_paths_build_the_same_object():
    obj = {"segments": [{"a": (1, 2.5, None, True)}], "t": [{1, 2}, frozenset({3}), b"xy"]}
    data = pickle.dumps(obj, protocol=4)
    assert len(data) <= fast_path_bytes(LoadLimits())
    fast, fast_work = bounded_load(data, LoadLimits(), "x")
    counted, work = bounded_load(data, LoadLimits(), "x", always_count=True)
    assert fast == counted == obj
    assert fast_work["objects"] is None and work["objects"] > 0


def test_gzip_bomb_is_inflated_only_to_the_byte_limit():
    size = 256 * MiB  # a str opcode announcing 256 MiB, then the bytes: 4x the limit
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", compresslevel=1) as gz:
        gz.write(b"\x80\x04X" + size.to_bytes(4, "little"))
        chunk = b"a" * MiB
        for _ in range(size // MiB):
            gz.write(chunk)
        gz.write(b".")
    blob = buf.getvalue()
    assert len(blob) < 2 * MiB
    tracemalloc.start()
    try:
        with pytest.raises(SnapshotError, match="larger than max_bytes=67108864"):
            bounded_load(blob, LoadLimits(), "bomb")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 3 * 64 * MiB  # the limit's worth (read, then refused), never 256 MiB


def test_deep_nesting_without_marks_is_refused_while_building():
    # TUPLE1 wraps the top of the stack: 100,000 levels in 100,000 bytes, no MARK at all.
    data = b"\x80\x04N" + b"\x85" * 100_000 + b"."
    with pytest.raises(SnapshotError, match="nests deeper than max_depth=64"):
        bounded_load(data, LoadLimits(), "x")


@pytest.mark.parametrize(
    "data, message",
    [
        (b"\x80\x04}R.", "opcode REDUCE"),  # a reduce with data on the stack
        (b"\x80\x04}}b.", "opcode BUILD"),
        (b"\x80\x04\x82\x01.", "opcode EXT1"),
        (b"\x80\x04\x8c\x02os\x8c\x06system\x93.", "refusing to load os.system"),
        (b"\x80\x04\xff.", "not a readable pickle"),
    ],
)
def test_only_plain_data_opcodes_run(data, message):
    with pytest.raises(SnapshotError, match=message):
        bounded_load(data, LoadLimits(), "x", always_count=True)
