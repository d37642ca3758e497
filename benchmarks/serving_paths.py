"""The service's three answer paths side by side in one run: learned model, exact replay,
analytic, on the same cached graph, server and loopback client.

    .venv/bin/python benchmarks/serving_paths.py [--repeats 3] [--requests 400]

Per `method` (gnn | replay | analytic), `--repeats` rounds of `--requests` sequential
/predict requests (8 configs, a cached graph id, one keep-alive raw socket, 1 uvicorn
worker; `serving.py`'s client), then requests/s with 2 workers and 16 connections
(`serving.py`'s load generator). The same request repeated is what a training job polling
its config sends; the learned model and the exact replay answer a query asked again from
memory (`OnnxMemoryModel.predict_encoded`, `predictor.answer.exact.ReplayModel`), so both
are also timed on configs never asked before (``gnn, new sizes``, ``replay, new sizes``:
each request 8 configs at a sequence length not used yet).
Reported: the p50 / p99 of each round, their min and median over the rounds, and the
server's CPU per request (the figure other load on the shared CPUs inflates least).
Writes benchmarks/results/serving_paths.json and .md.
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import logging
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
from results_io import write_results

# benchmarks/serving.py by its path: a bare `import serving` would be memgnn's package name
_spec = importlib.util.spec_from_file_location(
    "serving_bench", Path(__file__).with_name("serving.py")
)
assert _spec is not None and _spec.loader is not None
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

METHODS = ("gnn", "replay", "analytic")
FRESH = ("gnn", "replay")  # timed on configs never asked before too


def _set_method(method: str) -> None:
    bench.EXTRA.clear()
    bench.EXTRA["method"] = method


def _fresh_configs(k: int) -> list[dict]:
    """8 configs at sequence length 256 + k (under GPT-2's 1,024 positions)."""
    return [{"sizes": {"B": b, "S": 256 + k}, "device": "h100-80gb"} for b in (1, 2, 4, 8)] + [
        {"sizes": {"B": b, "S": 256 + k}, "device": "a100-80gb"} for b in (1, 2, 4, 8)
    ]


def _fresh_round(url: str, gid: str, method: str, start: int, n: int) -> list[float]:
    times = []
    with httpx.Client(base_url=url, timeout=120) as c:
        for k in range(start, start + n):
            body = {"graph_id": gid, "configs": _fresh_configs(k), "method": method}
            t0 = time.perf_counter()
            r = c.post("/predict", json=body)
            times.append(time.perf_counter() - t0)
            r.raise_for_status()
            assert all(p["method"] == method for p in r.json()["predictions"]), r.text
    return times


def _summary(rounds: list[list[float]], cpu_ms: float) -> dict:
    p50 = [1e3 * statistics.median(t) for t in rounds]
    p99 = [1e3 * bench.pct(t, 0.99) for t in rounds]
    return {
        "rounds": len(rounds),
        "requests_per_round": len(rounds[0]),
        "p50_ms": p50,
        "p99_ms": p99,
        "p50_ms_min": min(p50),
        "p50_ms_median": statistics.median(p50),
        "p99_ms_median": statistics.median(p99),
        "server_cpu_ms_per_request": cpu_ms,
    }


def latencies(url: str, pid: int, gid: str, args: argparse.Namespace) -> dict:
    out: dict = {}
    for method in METHODS:
        _set_method(method)
        first = httpx.post(f"{url}/predict", json={"graph_id": gid, "configs": bench.CONFIGS,
                                                   **bench.EXTRA}, timeout=300)  # fmt: skip
        first.raise_for_status()
        ran = {p["method"] for p in first.json()["predictions"]}
        rounds, cpu0 = [], bench.cpu_seconds(pid)
        for _ in range(args.repeats):
            rounds.append(bench._raw_timings(url, gid, args.requests))
        served = args.repeats * (args.requests + 50)
        out[method] = _summary(rounds, 1e3 * (bench.cpu_seconds(pid) - cpu0) / served)
        out[method]["answered_by"] = sorted(ran)
    for method in FRESH:
        rounds, cpu0 = [], bench.cpu_seconds(pid)
        for r in range(args.repeats):
            rounds.append(_fresh_round(url, gid, method, r * args.fresh, args.fresh))
        cpu = 1e3 * (bench.cpu_seconds(pid) - cpu0) / (args.repeats * args.fresh)
        out[f"{method}, new sizes"] = _summary(rounds, cpu) | {"answered_by": [method]}
    return out


def throughputs(url: str, pid: int, gid: str, args: argparse.Namespace) -> dict:
    out = {}
    for method in METHODS:
        _set_method(method)
        runs = []
        for _ in range(args.repeats):
            cpu0 = bench.cpu_seconds(pid)
            one = bench.throughput(url, gid, args.throughput_requests)
            one["server_cpu_ms_per_request"] = (
                1e3 * (bench.cpu_seconds(pid) - cpu0) / (one["requests"] + 40)
            )
            runs.append(one)
        rps = [r["requests_per_s"] for r in runs]
        out[method] = {
            "requests_per_s": rps,
            "requests_per_s_max": max(rps),
            "requests_per_s_median": statistics.median(rps),
            "server_cpu_ms_per_request_median": statistics.median(
                r["server_cpu_ms_per_request"] for r in runs
            ),
            "connections": runs[0]["connections"],
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--fresh", type=int, default=60, help="new-size replay requests a round")
    ap.add_argument("--throughput-requests", type=int, default=3000)
    ap.add_argument("--layers", type=int, default=16)
    args = ap.parse_args()
    if args.repeats * args.fresh > 760:  # each method's rounds use their own lengths
        ap.error("--repeats x --fresh must stay under 760 (sequence lengths 256..1015)")
    logging.basicConfig(level=logging.WARNING)
    data, n_nodes = bench.graph_blob(args.layers)
    result: dict = {
        "graph": {"model": f"gpt2 {args.layers} blocks, hidden 768", "nodes": n_nodes},
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_average_before": [round(x, 2) for x in os.getloadavg()],
        },
        "args": "".join(f" {a}" for a in sys.argv[1:]),
    }
    blob = gzip.compress(json.dumps(data).encode())
    with tempfile.TemporaryDirectory() as state:
        proc, url = bench.start_server(Path(state) / "one", 1, "default")
        try:
            gid = httpx.post(f"{url}/graphs", content=blob, timeout=60).json()["graph_id"]
            health = httpx.get(f"{url}/readyz", timeout=10).json()
            result["model"] = health.get("model_version")
            result["latency"] = latencies(url, proc.pid, gid, args)
        finally:
            bench.stop(proc)
        proc, url = bench.start_server(Path(state) / "two", 2, "default")
        try:
            gid = httpx.post(f"{url}/graphs", content=blob, timeout=60).json()["graph_id"]
            result["throughput"] = throughputs(url, proc.pid, gid, args)
        finally:
            bench.stop(proc)
    result["machine"]["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    write_results("serving_paths", result, markdown(result))
    sys.stdout.write(markdown(result))


def markdown(r: dict) -> str:
    lat, thr, m = r["latency"], r["throughput"], r["machine"]
    rows = []
    for name, one in lat.items():
        t = thr.get(name)
        rate = (f"{t['requests_per_s_max']:.0f} / {t['requests_per_s_median']:.0f}"
                if t else "")  # fmt: skip
        cpu = f"{one['server_cpu_ms_per_request']:.2f}"
        if t:
            cpu += f" / {t['server_cpu_ms_per_request_median']:.2f}"
        rows.append(
            f"| {name} | {', '.join(one['answered_by'])} | {one['p50_ms_min']:.2f} / "
            f"{one['p50_ms_median']:.2f} | {one['p99_ms_median']:.2f} | {rate} | {cpu} |"
        )
    return "\n".join(
        [
            "# serving: the three answer paths side by side (loopback)",
            "",
            f"Graph: {r['graph']['model']}, {r['graph']['nodes']} nodes, a cached graph id; "
            f"8 configs a request; model {r.get('model')}; {m['cpus']} CPUs shared by client, "
            f"server and another agent's jobs (load average {m['load_average_before'][0]} "
            f"before, {m['load_average_after'][0]} after); Python {m['python']}. "
            f"{lat['gnn']['rounds']} rounds of each measure: min / median over the rounds.",
            "",
            "| method asked | answered by | p50 ms (min / median) | p99 ms (median) | "
            "req/s, 2 workers (max / median) | server CPU ms/request (1 worker / 2) |",
            "|---|---|---|---|---|---|",
            *rows,
            "",
            "`new sizes`: every request asks 8 configs at a sequence length not asked before, "
            "so each is computed (features and head; a replay). The other rows repeat one "
            "request, as a training job polling its config does: the learned model and the "
            "replay remember their answers per (graph, sizes, device, scenario, metric) "
            "(`OnnxMemoryModel.predict_encoded`, `ReplayModel`; a remembered replay's "
            "breakdown says `replay_memo`), the analytic sweep computes every time; live "
            "corrections are applied to the learned answers on every request.",
            "",
            f"Command: `.venv/bin/python benchmarks/serving_paths.py{r.get('args', '')}`",
            "",
        ]
    )


if __name__ == "__main__":
    main()
