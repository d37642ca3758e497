"""What recording each node's source line costs a capture (`predictor.ir.sources`).

The same capture (`predictor.capture.capture.capture`, symbolic, blocks mode as `predict`
runs it) with `CaptureConfig(sources=False)` and `sources=True`, alternating in one
process, each repeated and the median taken: wall and this process's CPU seconds (the
machine is shared: CPU seconds are the fairer figure), nodes, and the bytes the lines add
to the graph file (gzip'd JSON, as the cache stores it).

    .venv/bin/python benchmarks/explain_capture_cost.py [--repeats 3]
    # writes benchmarks/results/explain_capture_cost.md
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import time
from pathlib import Path

from memgnn.predictor.capture.capture import CaptureConfig, capture
from memgnn.predictor.ir.sources import SourceFinder
from memgnn.predictor.spec.train import TrainSpec
from memgnn.predictor.zoo.resolve import resolve

OUT = Path(__file__).parent / "results"
CASES = [
    ("gpt2", {}, TrainSpec()),
    ("hf:HuggingFaceTB/SmolLM2-135M", {}, TrainSpec.of(precision="bf16", peft="lora")),
]


_FIND = SourceFinder.find
_SPENT = [0.0, 0]


def _timed_find(self, frame=None):
    t = time.perf_counter()
    try:
        return _FIND(self, frame)
    finally:
        _SPENT[0] += time.perf_counter() - t
        _SPENT[1] += 1


def _once(spec: str, args: dict, train: TrainSpec, sources: bool) -> dict:
    bundle = resolve(spec, args, None)
    _SPENT[:] = [0.0, 0]
    t0, c0 = time.perf_counter(), time.process_time()
    graph = capture(bundle, train, CaptureConfig(sources=sources, sizes={"B": 2, "S": 64}))
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    blob = json.dumps(graph.content() | {"meta": graph.meta}, separators=(",", ":")).encode()
    return {
        "wall": wall,
        "cpu": cpu,
        "nodes": sum(p.num_nodes for p in graph.paths),
        "file_bytes": len(gzip.compress(blob, compresslevel=6, mtime=0)),
        "graph_id": graph.graph_id,
        "find_s": _SPENT[0],
        "finds": _SPENT[1],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    rows = []
    SourceFinder.find = _timed_find  # the time inside the walk itself, beside the totals
    for spec, margs, train in CASES:
        runs: dict[bool, list[dict]] = {False: [], True: []}
        _once(spec, margs, train, False)  # warm imports and caches
        for _ in range(args.repeats):
            for sources in (False, True):
                runs[sources].append(_once(spec, margs, train, sources))
        off, on = runs[False], runs[True]
        assert off[0]["graph_id"] == on[0]["graph_id"], "the lines must not change the id"
        med = {s: {k: statistics.median(r[k] for r in runs[s]) for k in ("wall", "cpu")}
               for s in runs}  # fmt: skip
        rows.append({
            "model": spec,
            "train": {k: v for k, v in train.flat().items() if v != TrainSpec().flat()[k]},
            "nodes": on[0]["nodes"], "off": med[False], "on": med[True],
            "file_off": off[0]["file_bytes"], "file_on": on[0]["file_bytes"],
            "find_s": statistics.median(r["find_s"] for r in on), "finds": on[0]["finds"],
        })  # fmt: skip
    load = os.getloadavg()[0]
    lines = [
        "# Capture cost of recording source lines (`memgnn explain`)",
        "",
        f"`.venv/bin/python benchmarks/explain_capture_cost.py --repeats {args.repeats}`; "
        f"sizes B=2 S=64, blocks mode, median of {args.repeats} alternating runs per "
        f"setting; load average {load:.2f} on a shared 2-core machine (CPU seconds are "
        "this process's).",
        "",
        "| model | train | nodes | cpu s off | cpu s on | cpu +% | wall s off | wall s on "
        "| line walks | s in the walks | us per walk | file B off | file B on |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        pct = 100 * (r["on"]["cpu"] / r["off"]["cpu"] - 1)
        lines.append(
            f"| {r['model']} | {r['train'] or 'defaults'} | {r['nodes']} | "
            f"{r['off']['cpu']:.2f} | {r['on']['cpu']:.2f} | {pct:+.1f} | "
            f"{r['off']['wall']:.2f} | {r['on']['wall']:.2f} | {r['finds']} | "
            f"{r['find_s']:.4f} | {1e6 * r['find_s'] / max(r['finds'], 1):.1f} | "
            f"{r['file_off']} | {r['file_on']} |"
        )
    lines += [
        "",
        "The graph id is the same with and without the lines (asserted). `s in the walks`: "
        "the time inside `SourceFinder.find` (timed around each call), the walk's own cost "
        "beside the capture's; the walks are the recorded ops (the replicated blocks are "
        "copies, not walked). The file grows by the lines' table and one index per node "
        "and per storage (shapes).",
    ]
    OUT.mkdir(exist_ok=True)
    (OUT / "explain_capture_cost.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
