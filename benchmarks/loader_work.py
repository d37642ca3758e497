"""The snapshot loader's work (``dataset.snapshot.unpickle``), for ``snapshot_fidelity.py``.

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
import time
import tracemalloc
from pathlib import Path

from memgnn.dataset.snapshot.loader import loads_snapshot
from memgnn.dataset.snapshot.unpickle import (
    LoadLimits,
    SnapshotError,
    bounded_load,
    fast_path_bytes,
)

__all__ = ["bomb_row", "loader_md", "loader_rows"]

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
    return "\n".join(lines) + "\n"
