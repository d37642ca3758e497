"""What `auto` believes a replay costs against what it costs, in one process.

    PYTHONPATH=. .venv/bin/python benchmarks/replay_cost.py [--repeats 10]

For each case: the JIT's state and the warm-up's seconds, the prior estimate
(`predictor.answer.exact.estimated_seconds`: 2 ms + 3 us x events), the replays' measured
wall seconds (`ReplayModel`, median), the factor the running estimate learned from them
(`predictor.sim.replay.cost.ReplayCost`) and the route `auto` then takes at the default budget,
with the machine's load average beside it. Writes benchmarks/results/replay_cost.json and
.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from memgnn.predictor.answer.exact import (
    ExactConfig,
    ReplayModel,
    decide,
    estimate_events,
    estimated_seconds,
)
from memgnn.predictor.capture.cache import capture_cached
from memgnn.predictor.memory.base import Query
from memgnn.predictor.sim.replay.cost import ReplayCost, jit_state
from memgnn.predictor.spec.train import TrainSpec
from memgnn.predictor.zoo import make_bundle
from memgnn.serving.routing import warm_replay
from results_io import write_results

CASES = {  # name: (zoo model, hparams, sizes)
    "mlp": ("mlp", {}, {"B": 8}),
    "gpt2": ("gpt2", {}, {"B": 8, "S": 1024}),
    "llama-4l": ("llama", {"layers": 4}, {"B": 4, "S": 2048}),
}


def run(repeats: int) -> dict:
    before = jit_state()
    t0 = time.perf_counter()
    warm_replay()
    out = {"jit_before": before, "warmup_seconds": round(time.perf_counter() - t0, 3),
           "cases": []}  # fmt: skip
    config = ExactConfig()
    for name, (model, hp, sizes) in CASES.items():
        graph = capture_cached(make_bundle(model, hp), TrainSpec(), sizes=sizes)
        cost = ReplayCost()
        replay = ReplayModel(cost=cost)
        q = [Query(sizes=sizes, device="a100-80gb")]
        seconds = []
        for _ in range(repeats):
            t = time.perf_counter()
            replay.predict(graph, q)
            seconds.append(time.perf_counter() - t)
        choice = decide("auto", graph, config, cost=cost)
        out["cases"].append({
            "case": name, "sizes": sizes, "events": estimate_events(graph),
            "prior_ms": round(estimated_seconds(graph, config) * 1e3, 3),
            "measured_median_ms": round(statistics.median(seconds) * 1e3, 3),
            "factor": round(cost.factor, 3), "samples": cost.samples,
            "route": choice.method, "reason": choice.reason,
            "load_average": round(os.getloadavg()[0], 2),
        })  # fmt: skip
    return out


def markdown(r: dict) -> str:
    lines = [
        "# Replay cost: the estimate `auto` routes by vs measured replays",
        "",
        f"Command: `{r['command']}`. JIT before the warm-up: {r['jit_before']}; warm-up "
        f"{r['warmup_seconds']} s. {r['cpus']} cores shared with other jobs (load per row).",
        "",
        "| case | sizes | events | prior ms | measured median ms | factor (replays) | load | "
        "auto at 250 ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in r["cases"]:
        lines.append(
            f"| {c['case']} | {c['sizes']} | {c['events']:,} | {c['prior_ms']} | "
            f"{c['measured_median_ms']} | x{c['factor']} ({c['samples']}) | "
            f"{c['load_average']} | {c['route']}: {c['reason']} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args()
    result = run(args.repeats)
    result["command"] = "PYTHONPATH=. .venv/bin/python benchmarks/replay_cost.py " + " ".join(
        sys.argv[1:]
    )
    result["cpus"] = os.cpu_count()
    write_results("replay_cost", result, markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
