"""The snapshot loader's work (``predictor.snapshot.unpickle``), for ``snapshot_fidelity.py``.

Per shared file: decompressed bytes, values pushed, object bytes and nesting measured by
the counting unpickler (what :class:`LoadLimits` is sized from), and load times of the
counting path, the loader as it runs (fast path where the input is small enough), and
the unbounded C ``pickle.loads`` beside them. Then the hostile probe's upload (8 million
empty dicts, a 7.8 KB gzip): the time and the traced memory until it is refused,
beside the unbounded C unpickler's.
"""

from __future__ import annotations

import gc
import gzip
import pickle
import random
import time
import tracemalloc
from pathlib import Path

from memgnn.predictor.snapshot.loader import loads_snapshot
from memgnn.predictor.snapshot.unpickle import (
    LoadLimits,
    SnapshotError,
    bounded_load,
    fast_path_bytes,
)

__all__ = ["bomb_row", "frames_row", "loader_md", "loader_rows"]

MB = 1e6


def _best(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def loader_rows(files: list[Path], repeat: int) -> list[dict]:
    limits = LoadLimits()
    rows = []
    for path in files:
        raw = path.read_bytes()
        _, work = bounded_load(raw, limits, path.name, always_count=True)
        plain = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
        rows.append(
            {
                "file": path.name,
                **work,
                "path": "fast (C)" if work["bytes"] <= fast_path_bytes(limits) else "counting",
                "counting_seconds": round(
                    _best(lambda r=raw: bounded_load(r, limits, "x", always_count=True), repeat),
                    4,
                ),
                "loader_seconds": round(_best(lambda r=raw: loads_snapshot(r), repeat), 4),
                "c_pickle_seconds": round(_best(lambda p=plain: pickle.loads(p), repeat), 4),
            }
        )
    return rows


def _run(fn, traced: bool) -> tuple[float, int, str]:
    """Seconds (untraced), or the tracemalloc peak (traced: slower), and the outcome."""
    gc.collect()
    if traced:
        tracemalloc.start()
    t0 = time.perf_counter()
    try:
        fn()
        outcome = "loaded"
    except SnapshotError as exc:
        outcome = str(exc)
    secs = time.perf_counter() - t0
    peak = 0
    if traced:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return secs, peak, outcome


def bomb_row(n: int = 8_000_000) -> dict:
    blob = gzip.compress(b"\x80\x04](" + b"}" * n + b"e.", 9)
    load = lambda: loads_snapshot(blob, what="upload")  # noqa: E731
    unbounded = lambda: pickle.loads(gzip.decompress(blob))  # noqa: E731
    secs, _, outcome = _run(load, traced=False)
    _, peak, _ = _run(load, traced=True)
    c_secs, _, _ = _run(unbounded, traced=False)
    _, c_peak, _ = _run(unbounded, traced=True)
    return {
        "empty_dicts": n,
        "upload_bytes": len(blob),
        "refused_after_seconds": round(secs, 2),
        "traced_peak_bytes": peak,
        "error": outcome,
        "c_pickle_seconds": round(c_secs, 2),
        "c_pickle_traced_peak_bytes": c_peak,
    }


def frames_row(events: int = 100_000, depth: int = 30, distinct: int = 2000) -> dict:
    """A synthetic recording shaped like PyTorch's with stack frames: each event has its
    own list of ``depth`` frames drawn from ``distinct`` frame dicts (PyTorch shares the
    frame dicts between tracebacks, so the pickle memoizes them)."""
    rng = random.Random(0)
    frames = [
        {"filename": f"/site-packages/torch/nn/modules/m{i % 50}.py", "line": i,
         "name": f"forward_{i}"}
        for i in range(distinct)
    ]  # fmt: skip
    trace, live, addr = [], [], 1 << 40
    for i in range(events):
        stack = [frames[rng.randrange(distinct)] for _ in range(depth)]
        if live and rng.random() < 0.5:
            a, size = live.pop(rng.randrange(len(live)))
            act = "free_requested"
        else:
            addr += 1 << 25
            a, size, act = addr, rng.randrange(1, 1 << 24), "alloc"
            live.append((a, size))
        trace.append({"action": act, "addr": a, "size": size, "stream": 0,
                      "time_us": 1_757_000_000_000_000 + i, "compile_context": "N/A",
                      "frames": stack})  # fmt: skip
    raw = pickle.dumps({"segments": [], "device_traces": [trace]}, protocol=4)
    t0 = time.perf_counter()
    _, work = bounded_load(raw, LoadLimits(), "frames", always_count=True)
    return {"events": events, "frames_per_event": depth, "distinct_frames": distinct,
            **work, "counting_seconds": round(time.perf_counter() - t0, 2)}  # fmt: skip


def loader_md(loader: dict) -> str:
    lim = LoadLimits()
    rows = loader["files"]
    top = {k: max(r[k] for r in rows) for k in ("bytes", "objects", "memory_bytes", "depth")}
    lines = [
        "## Loader work (the counting unpickler on every file; best of the repeats)",
        "",
        "| file | decompressed bytes | values | object bytes | depth | loader path | "
        "counting s | loader s | C pickle.loads s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['file']} | {r['bytes']} | {r['objects']} | {r['memory_bytes']} | "
            f"{r['depth']} | {r['path']} | {r['counting_seconds']} | {r['loader_seconds']} | "
            f"{r['c_pickle_seconds']} |"
        )
    b = loader["bomb"]
    lines += [
        "",
        f"Largest: {top['bytes']} bytes, {top['objects']} values, {top['memory_bytes']} object "
        f"bytes, depth {top['depth']}. Defaults (`LoadLimits`): max_bytes {lim.max_bytes} "
        f"({lim.max_bytes / top['bytes']:.0f}x), max_objects {lim.max_objects} "
        f"({lim.max_objects / top['objects']:.0f}x), max_memory_bytes {lim.max_memory_bytes} "
        f"({lim.max_memory_bytes / top['memory_bytes']:.1f}x), max_depth {lim.max_depth}. "
        f"Inputs up to {fast_path_bytes(lim)} decompressed bytes cannot break a limit and go "
        "through the C unpickler (the loader column includes the checks).",
        "",
        f"Hostile upload: {b['empty_dicts']:,} empty dicts in a {b['upload_bytes']}-byte gzip: "
        f"refused after {b['refused_after_seconds']} s with {b['traced_peak_bytes'] / MB:.0f} MB "
        f"traced at the peak (`{b['error']}`); the unbounded C unpickler builds it in "
        f"{b['c_pickle_seconds']} s and {b['c_pickle_traced_peak_bytes'] / MB:.0f} MB traced "
        "(times without tracemalloc, peaks with it, in separate runs).",
    ]
    f = loader.get("frames")
    if f:
        lines += [
            "",
            f"A synthetic recording shaped like PyTorch's with stack frames ({f['events']:,} "
            f"events, {f['frames_per_event']} frames each from {f['distinct_frames']:,} shared "
            f"frame dicts): {f['bytes']} bytes of pickle, {f['objects']} values, "
            f"{f['memory_bytes']} object bytes, depth {f['depth']}; counted in "
            f"{f['counting_seconds']} s. It fits the defaults "
            f"({f['memory_bytes'] / lim.max_memory_bytes:.0%} of max_memory_bytes); a larger "
            "recording of one's own needs `--max-memory` / `--max-objects`.",
        ]
    return "\n".join(lines) + "\n"
