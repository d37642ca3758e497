"""The allocator simulator against real CUDA snapshots (``_dump_snapshot`` files).

For every snapshot in the reference folder (``--dir``; by default the project's shared
``reference/cuda-snapshots`` folder beside the checkout): the recorded peak reserved / allocated
bytes and segment allocations against the simulator's, seeded with the state when
recording began, in two address modes:

* ``recorded addresses``: a new segment gets the address the recorded cudaMalloc
  returned (the driver's choice; it decides best-fit ties, lowest address first);
* ``own addresses``: the simulator's addresses (each new segment above all earlier ones).

Every device of a file is a row (``code_location_dev0_dev2`` holds two); a recording made
with expandable segments is replayed under its recorded settings (its page maps count as
segment allocations). Also the replay speed (events per second of the seeded, checked
replay), measured side by side with the plain ``predictor.sim.allocator.replay`` of the same
alloc/free requests from an empty allocator (the label path), best of ``--repeat`` runs
each; what-if peaks under other ``PYTORCH_CUDA_ALLOC_CONF`` settings; the loader's work
per file (values, object bytes, depth: what :class:`LoadLimits` is sized from) and on the
hostile 8-million-empty-dicts upload; and a regression check: every number of the results
file as it was before this run, compared with this run's.

    .venv/bin/python benchmarks/snapshot_fidelity.py   # -> results/snapshot_fidelity.{md,json}
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import sys
import time
from pathlib import Path

from loader_work import bomb_row, frames_row, loader_md, loader_rows
from memgnn.predictor.sim.allocator import replay
from memgnn.predictor.snapshot.conf import allocator_config, recorded_alloc_conf
from memgnn.predictor.snapshot.loader import load_snapshots
from memgnn.predictor.snapshot.replay import (
    blocks_differing,
    dump_blocks,
    recorded_timeline,
    simulate_snapshot,
)
from memgnn.predictor.snapshot.state import initial_state
from memgnn.predictor.snapshot.whatif import ALTERNATIVES
from results_io import RESULTS, write_results

_ROOT = Path(__file__).resolve().parents[1]
_CANDIDATES = [p / "shared" / "reference" / "cuda-snapshots" for p in _ROOT.parents[:2]]
DEFAULT_DIR = next((p for p in _CANDIDATES if p.is_dir()), _CANDIDATES[0])


def _best(fn, repeat: int) -> tuple[float, object]:
    best, result = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t0)
    return best, result


def _plain_events(snap) -> list[tuple]:
    """alloc / free_completed of the trace as `allocator.replay` events (frees of blocks
    allocated before recording are dropped: a plain replay starts empty)."""
    live, out = set(), []
    for ev in snap.trace:
        if ev["action"] == "alloc":
            live.add(ev["addr"])
            out.append(("alloc", ev["addr"], ev["size"], ev.get("stream", 0)))
        elif ev["action"] == "free_completed" and ev["addr"] in live:
            live.discard(ev["addr"])
            out.append(("free", ev["addr"], 0, ev.get("stream", 0)))
    return out


def one(snap, name: str, load_s: float, repeat: int) -> dict:
    state = initial_state(snap)
    rec = recorded_timeline(snap, state)
    cfg = allocator_config(recorded_alloc_conf(snap.allocator_settings))
    n = len(snap.trace)
    row: dict = {
        "file": name,
        "alloc_conf": recorded_alloc_conf(snap.allocator_settings),
        "events": n,
        "requests": sum(1 for e in snap.trace if e["action"] == "alloc"),
        "segment_frees": sum(
            1 for e in snap.trace if e["action"] in ("segment_free", "segment_unmap")
        ),
        "initial_segments": len(state.segments) + len(state.mapped),
        "initial_reserved_bytes": state.reserved_bytes,
        "initial_allocated_bytes": state.allocated_bytes,
        "recorded_peak_reserved_bytes": rec.peak_reserved_bytes,
        "recorded_peak_allocated_bytes": rec.peak_allocated_bytes,
        "recorded_segment_allocs": len(rec.segment_allocs),
        "recorded_model_error": rec.model_error,
        "dump_blocks": len(dump_blocks(snap)),
        "recorded_final_blocks_differing": blocks_differing(rec.final_blocks, dump_blocks(snap)),
        "load_seconds": round(load_s, 4),
    }
    for mode, addresses in (("recorded_addresses", True), ("own_addresses", False)):
        secs, run = _best(
            lambda a=addresses: simulate_snapshot(snap, cfg, recorded_addresses=a, state=state),
            repeat,
        )
        matched = 0
        for r, s in zip(rec.segment_allocs, run.segment_allocs):
            if r != s:
                break
            matched += 1
        row[mode] = {
            "simulated_peak_reserved_bytes": run.peak_reserved_bytes,
            "simulated_peak_allocated_bytes": run.peak_allocated_bytes,
            "reserved_error_bytes": run.peak_reserved_bytes - rec.peak_reserved_bytes,
            "simulated_segment_allocs": len(run.segment_allocs),
            "segment_allocs_matched": matched,
            "requests_at_recorded_address": run.addresses_matched,
            "first_divergence": run.first_divergence,
            "final_blocks_differing": blocks_differing(run.final_blocks, dump_blocks(snap)),
            "replay_seconds": round(secs, 5),
            "events_per_second": int(n / secs),
        }
    plain = _plain_events(snap)
    secs, res = _best(lambda: replay(plain), repeat)
    row["plain_replay"] = {
        "events": len(plain),
        "peak_reserved_bytes": res.stats.peak_reserved_bytes,
        "replay_seconds": round(secs, 5),
        "events_per_second": int(len(plain) / secs),
    }
    row["what_if_peak_reserved_bytes"] = {
        conf: simulate_snapshot(
            snap, allocator_config(conf), recorded_settings=False, state=state
        ).peak_reserved_bytes
        for conf in ALTERNATIVES
    }
    return row


def _md(rows: list[dict], folder: Path) -> str:
    exact = sum(
        r["recorded_addresses"]["reserved_error_bytes"] == 0
        and r["recorded_addresses"]["segment_allocs_matched"] == r["recorded_segment_allocs"]
        == r["recorded_addresses"]["simulated_segment_allocs"]
        for r in rows
    )  # fmt: skip
    lines = [
        f"# Simulator vs real CUDA snapshots ({len(rows)} files)",
        "",
        f"`benchmarks/snapshot_fidelity.py` on {folder.name}/ ({platform.python_version()}, "
        f"{platform.machine()}). Exact (0 bytes off on peak reserved, every segment alloc "
        f"matched in order and size) with recorded cudaMalloc addresses: **{exact}/{len(rows)}**.",
        "",
        "## Recorded vs simulated (seeded with the state when recording began)",
        "",
        "| file | events | requests | initial segments | recorded peak reserved | simulated "
        "(recorded addresses) | seg allocs matched | requests at recorded address | end state vs "
        "dump: blocks differing | simulated (own addresses) | seg allocs matched (own) | first "
        "divergence (own) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        a, o = r["recorded_addresses"], r["own_addresses"]
        d = o["first_divergence"]
        div = "none" if d is None else f"event {d['event']}: {d['what']}"
        lines.append(
            f"| {r['file']} | {r['events']} | {r['requests']} | {r['initial_segments']} | "
            f"{r['recorded_peak_reserved_bytes']} | {a['simulated_peak_reserved_bytes']} "
            f"({a['reserved_error_bytes']:+d}) | {a['segment_allocs_matched']}/"
            f"{r['recorded_segment_allocs']} | {a['requests_at_recorded_address']}/"
            f"{r['requests']} | {a['final_blocks_differing']} of {r['dump_blocks']} | "
            f"{o['simulated_peak_reserved_bytes']} "
            f"({o['reserved_error_bytes']:+d}) | {o['segment_allocs_matched']}/"
            f"{r['recorded_segment_allocs']} | {div} |"
        )
    lines += [
        "",
        "Peak allocated (block bytes by the rounding and split rules, recorded placements): "
        + "; ".join(
            f"{r['file']}: recorded {r['recorded_peak_allocated_bytes']}, simulated "
            f"{r['recorded_addresses']['simulated_peak_allocated_bytes']}"
            for r in rows
        ),
        "",
        "## Replay speed (same run, best of the repeats)",
        "",
        "| file | events | snapshot replay s | events/s | plain `allocator.replay` events | "
        "plain s | plain events/s |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        a, p = r["recorded_addresses"], r["plain_replay"]
        lines.append(
            f"| {r['file']} | {r['events']} | {a['replay_seconds']} | {a['events_per_second']} | "
            f"{p['events']} | {p['replay_seconds']} | {p['events_per_second']} |"
        )
    ev = sum(r["events"] for r in rows)
    secs = sum(r["recorded_addresses"]["replay_seconds"] for r in rows)
    pev = sum(r["plain_replay"]["events"] for r in rows)
    psecs = sum(r["plain_replay"]["replay_seconds"] for r in rows)
    lines += [
        f"| all | {ev} | {secs:.5f} | {int(ev / secs)} | {pev} | {psecs:.5f} | "
        f"{int(pev / psecs)} |",
        "",
        f"Snapshot replay: {1e6 * secs / ev:.1f} us per trace event; plain replay: "
        f"{1e6 * psecs / pev:.1f} us per alloc/free.",
        "",
        "Snapshot replay counts every trace event (alloc, free_requested, free_completed, "
        "segment events) and includes seeding the initial state and the per-request checks; "
        "the plain replay runs only alloc/free pairs from an empty allocator.",
        "",
        "## What-if: simulated peak reserved under other settings",
        "",
        "| file | recorded | " + " | ".join(ALTERNATIVES) + " |",
        "|---|---|" + "---|" * len(ALTERNATIVES),
    ]
    for r in rows:
        w = r["what_if_peak_reserved_bytes"]
        lines.append(
            f"| {r['file']} | {r['recorded_peak_reserved_bytes']} | "
            + " | ".join(str(w[c]) for c in ALTERNATIVES)
            + " |"
        )
    lines += [
        "",
        "What-ifs seed the recorded cache (segments and blocks) except expandable_segments, "
        "which starts from the live blocks only (a recorded native cache cannot exist under "
        "it); recorded segment_free runs are replayed as empty_cache().",
    ]
    return "\n".join(lines) + "\n"


_COMPARED = (
    "initial_reserved_bytes",
    "initial_allocated_bytes",
    "recorded_peak_reserved_bytes",
    "recorded_peak_allocated_bytes",
    "recorded_segment_allocs",
    "recorded_final_blocks_differing",
)
_COMPARED_RUN = (
    "simulated_peak_reserved_bytes",
    "simulated_peak_allocated_bytes",
    "segment_allocs_matched",
    "requests_at_recorded_address",
    "final_blocks_differing",
)


def _numbers(row: dict) -> dict[str, object]:
    out: dict[str, object] = {k: row.get(k) for k in _COMPARED}
    for mode in ("recorded_addresses", "own_addresses"):
        out |= {f"{mode}.{k}": row.get(mode, {}).get(k) for k in _COMPARED_RUN}
    out |= {f"what_if.{k}": v for k, v in row.get("what_if_peak_reserved_bytes", {}).items()}
    return out


def regression(previous: list[dict], rows: list[dict]) -> list[dict]:
    """Each file of the previous results against this run: the numbers that differ."""
    now = {r["file"]: _numbers(r) for r in rows}
    out = []
    for old in previous:
        new = now.get(old["file"])
        if new is None:
            out.append({"file": old["file"], "compared": 0, "differing": "missing"})
            continue
        before = _numbers(old)
        diff = {k: [v, new.get(k)] for k, v in before.items() if v is not None and new.get(k) != v}
        out.append({"file": old["file"], "compared": len(before), "differing": diff})
    return out


def _regression_md(reg: list[dict]) -> str:
    if not reg:
        return "## Regression\n\nNo earlier results to compare with.\n"
    same = sum(1 for r in reg if r["differing"] == {})
    lines = [
        "## Regression: the numbers of the results file before this run",
        "",
        f"{same} of {len(reg)} earlier rows give every compared number again (initial state, "
        "recorded and simulated peaks, segment allocations matched, requests at the recorded "
        "address, end-state blocks, what-if peaks).",
        "",
        "| file | numbers compared | differing |",
        "|---|---|---|",
    ]
    for r in reg:
        diff = r["differing"]
        text = (
            "none"
            if diff == {}
            else diff
            if isinstance(diff, str)
            else "; ".join(f"{k}: {a} -> {b}" for k, (a, b) in diff.items())
        )
        lines.append(f"| {r['file']} | {r['compared']} | {text} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    files = sorted(p for p in args.dir.iterdir() if ".pickle" in p.name)
    if not files:
        print(f"no snapshot files in {args.dir}", file=sys.stderr)
        return 2
    before = args.out / "snapshot_fidelity.json"
    previous = json.loads(before.read_text()) if before.exists() else []
    previous = previous["rows"] if isinstance(previous, dict) else previous
    rows = []
    for path in files:
        t0 = time.perf_counter()
        snaps = load_snapshots(path)
        load_s = time.perf_counter() - t0
        for snap in snaps:
            name = path.name if len(snaps) == 1 else f"{path.name} (device {snap.device})"
            rows.append(one(snap, name, load_s, args.repeat))
        print(f"{path.name}: done", file=sys.stderr)
    reg = regression(previous, rows)
    loader = {"files": loader_rows(files, args.repeat), "bomb": bomb_row(), "frames": frames_row()}
    md = _md(rows, args.dir) + "\n" + _regression_md(reg) + "\n" + loader_md(loader)
    result = {"rows": rows, "regression": reg, "loader": loader}
    print(write_results("snapshot_fidelity", result, md, out=args.out).read_text())
    return 0 if all(r["differing"] == {} for r in reg) else 1


if __name__ == "__main__":
    sys.exit(main())
