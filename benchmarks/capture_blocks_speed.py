"""Capture speed at 7B and 70B with repeated blocks, side by side with a bare fake run.

In one process, per model: memgnn's capture (`CaptureConfig(mode="blocks")`: 4 blocks
captured and the middle one replicated to the full depth, then the full model described
on fake tensors), and its peer, a bare FakeTensorMode run of two training steps of the
full-depth model (no recording, concrete sizes; `capture_speed.run_bare`). CPU seconds of
this process and wall seconds. `--full` adds memgnn's full capture (every layer; ~10 min
at 70B on a loaded 2-core machine). The replicated graph's allocated peak at B=1, S=2048
is reported (analytic sweep, bytes); for the zoo 7B config it can be set against the full
capture's in benchmarks/results/capture_speed.md (same config and sizes).

    nice -n 10 python benchmarks/capture_blocks_speed.py [--only 7b|70b] [--full]

writes benchmarks/results/capture_blocks_speed.md (and .json).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
from memgnn.predictor.capture.capture import CaptureConfig, capture
from memgnn.predictor.memory.analytic import sweep
from memgnn.predictor.zoo import make_bundle
from memgnn.predictor.zoo.resolve import resolve

sys.path.insert(0, str(Path(__file__).parent))
from capture_speed import BF16, LLAMA_7B, run_bare  # noqa: E402

OUT = Path(__file__).parent / "results"
MODELS = {
    "7b": ("llama 7B bf16 (zoo, as capture_speed.md)", lambda: make_bundle("llama", LLAMA_7B)),
    "70b": ("hf:meta-llama/Llama-2-70b-hf bf16", lambda: resolve("hf:meta-llama/Llama-2-70b-hf")),
}
SIZES = {"B": 1, "S": 2048}


def timed(fn):
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    return {
        "cpu_s": round(time.process_time() - c, 3),
        "wall_s": round(time.perf_counter() - w, 3),
    }, out


def case(key: str, full: bool) -> dict:
    name, make = MODELS[key]
    bundle = make()
    row: dict = {"case": name, "layers": bundle.layers, "load_before": round(os.getloadavg()[0], 2)}
    row["blocks"], graph = timed(lambda: capture(bundle, BF16, CaptureConfig(mode="blocks")))
    row["capture_meta"] = graph.meta["capture"]
    row["nodes"] = graph.paths[0].num_nodes
    row["blocks_peak_allocated"] = int(sweep(graph, SIZES).peak_bytes)
    row["bare"], _ = timed(lambda: run_bare(bundle, BF16))
    if full:
        row["full"], g = timed(lambda: capture(bundle, BF16, CaptureConfig(mode="full")))
        row["same_graph"] = g.graph_id == graph.graph_id
    row["load_after"] = round(os.getloadavg()[0], 2)
    row["blocks_over_bare_cpu"] = round(row["blocks"]["cpu_s"] / row["bare"]["cpu_s"], 2)
    print(json.dumps(row), file=sys.stderr, flush=True)
    return row


def markdown(result: dict) -> str:
    lines = [
        "# Capture with repeated blocks at 7B and 70B, side by side with a bare fake run",
        "",
        f"Command: `{result['command']}`; torch {result['torch']}; 2 cores shared with other "
        "jobs (load average before-after). CPU seconds of the process (wall in brackets), "
        "one run each, in the same process: memgnn's capture (4 blocks captured, the middle "
        "one replicated; the full model described on fake tensors) and the bare FakeTensorMode "
        "run of two steps of the full-depth model. Peak: allocated bytes at B=1, S=2048 "
        "(analytic sweep of the replicated graph).",
        "",
        "| case | layers | nodes | load | memgnn capture (blocks) | bare fake run | ratio | "
        "full capture | same graph | peak allocated |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        full = r.get("full")
        full_s = f"{full['cpu_s']} ({full['wall_s']})" if full else "not run"
        lines.append(
            f"| {r['case']} | {r['layers']} | {r['nodes']} | {r['load_before']}-{r['load_after']} "
            f"| {r['blocks']['cpu_s']} ({r['blocks']['wall_s']}) "
            f"| {r['bare']['cpu_s']} ({r['bare']['wall_s']}) | {r['blocks_over_bare_cpu']} "
            f"| {full_s} "
            f"| {r.get('same_graph', '-')} | {r['blocks_peak_allocated']:,} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=sorted(MODELS))
    ap.add_argument("--full", action="store_true", help="also time the full capture")
    args = ap.parse_args()
    warm = make_bundle("llama", {"layers": 5})
    capture(warm, BF16)  # imports and first-call costs out of the timings
    run_bare(warm, BF16)
    keys = [args.only] if args.only else list(MODELS)
    result = {
        "command": "python benchmarks/capture_blocks_speed.py " + " ".join(sys.argv[1:]),
        "torch": torch.__version__,
        "rows": [case(k, args.full) for k in keys],
    }
    OUT.mkdir(parents=True, exist_ok=True)
    stem = "capture_blocks_speed" + (f"_{args.only}" if args.only else "")
    (OUT / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    (OUT / f"{stem}.md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
