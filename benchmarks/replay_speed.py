"""Replay speed: the compiled core (numba) side by side with the Python simulator.

1. Core events/s on one core: a randomized synthetic trace and the sim traces of GPT-2
   small (B=8, S=1024) and a 7B Llama config (bf16, AdamW, B=1, S=2048), both on
   a100-80gb; the Python replay of the same trace in the same run; results must agree.
2. JIT warm-up: the first call in a fresh process with an empty numba cache (compile)
   and with the on-disk cache filled (load), each in a subprocess.
3. Exact predict end to end, in-process (capture excluded: one-time, cached on disk):
   `ReplayModel.predict` against the GNN query (`load_default_model().predict`, first call with
   the encode and repeated) and the Python simulator (`predictor.sim.simulate.simulate`), with the
   replay's bytes checked equal to the simulator's (and, for GPT-2, to
   `memgnn profile --backend sim`, a concrete capture).

    PYTHONPATH=. .venv/bin/python benchmarks/replay_speed.py [--skip-profile]
    # writes benchmarks/results/replay_speed.{json,md}
"""

from __future__ import annotations

import argparse
import gzip
import os
import pickle
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from memgnn.dataset.profile import ProfileConfig, profile
from memgnn.predictor.answer.exact import ReplayModel, estimate_events
from memgnn.predictor.capture.cache import capture_cached
from memgnn.predictor.memory.analytic import sweep
from memgnn.predictor.memory.base import Query
from memgnn.predictor.memory.onnx_model import load_default_model
from memgnn.predictor.sim.allocator import AllocatorConfig, CachingAllocatorSim, MiB, replay
from memgnn.predictor.sim.replay import encode_events, replay_fast
from memgnn.predictor.sim.replay.trace import replay_trace_fast
from memgnn.predictor.sim.simulate import build_trace, replay_trace, simulate, trace_arrays
from memgnn.predictor.spec.devices import get_profile
from memgnn.predictor.spec.train import TrainSpec
from memgnn.predictor.zoo import make_bundle
from results_io import write_results

DEVICE = get_profile("a100-80gb")
CASES = {
    "gpt2-small": (
        "gpt2",
        {"layers": 12, "hidden": 768, "heads": 12, "vocab": 50257, "max_positions": 1024},
        TrainSpec.of(optimizer="adamw"),
        {"B": 8, "S": 1024},
    ),
    "llama-7b": (
        "llama",
        {"layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 32, "ffn": 11008,
         "vocab": 32000, "max_positions": 2048},
        TrainSpec.of(precision="bf16", optimizer="adamw"),
        {"B": 1, "S": 2048},
    ),
}  # fmt: skip


def best_of(fn, n: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(n):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), out


def cpu_best_of(fn, n: int) -> float:
    """Least CPU seconds of this process over n runs (the machine is shared: wall time
    includes waiting for a core)."""
    times = []
    for _ in range(n):
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return min(times)


def median_of(fn, n: int) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def synthetic_trace(n: int, seed: int = 0) -> list[tuple]:
    rng = random.Random(seed)
    sizes = [512, 4 << 10, 600 << 10, MiB, 3 * MiB, 12 * MiB, 50 * MiB]
    live: list[int] = []
    events: list[tuple] = []
    key = 0
    while len(events) < n:
        if live and (len(live) > 400 or rng.random() < 0.45):
            events.append(("free", live.pop(rng.randrange(len(live))), 0))
        else:
            events.append(("alloc", key, rng.choice(sizes) + rng.randrange(4096), 0))
            live.append(key)
            key += 1
    return events


def core_speed(graphs: dict) -> list[dict]:
    rows = []
    cfg = AllocatorConfig(capacity_bytes=DEVICE.total_bytes - DEVICE.context_bytes)
    events = synthetic_trace(200_000)
    arr = encode_events(events)
    replay_fast(arr, cfg)  # warm
    fast_s, fast = best_of(lambda: replay_fast(arr, cfg), 5)
    py_s, py = best_of(lambda: replay(events, cfg), 1)
    assert fast.stats == py.stats, "compiled and Python replays disagree"
    cpu = (
        cpu_best_of(lambda: replay_fast(arr, cfg), 5),
        cpu_best_of(lambda: replay(events, cfg), 1),
    )
    rows.append(_row("synthetic (200k random events)", len(events), fast_s, py_s, cpu))
    for name, (graph, sizes) in graphs.items():
        resolved = sweep(graph, sizes, scenario="worst").sizes
        events = build_trace(graph, 0, resolved, DEVICE)
        arr = trace_arrays(graph, 0, resolved, DEVICE)
        fast_s, fast = best_of(lambda: replay_trace_fast(arr, cfg), 5)  # noqa: B023
        py_s, py = best_of(lambda: replay_trace(events, cfg), 1)  # noqa: B023
        assert fast == py, f"{name}: compiled and Python replays disagree"
        cpu = (cpu_best_of(lambda: replay_trace_fast(arr, cfg), 5),  # noqa: B023
               cpu_best_of(lambda: replay_trace(events, cfg), 1))  # noqa: B023  # fmt: skip
        rows.append(_row(f"{name} sim trace", len(events), fast_s, py_s, cpu))
    return rows


def _row(trace: str, n: int, fast_s: float, py_s: float, cpu: tuple[float, float]) -> dict:
    return {
        "trace": trace,
        "events": n,
        "compiled_seconds": round(fast_s, 6),
        "python_seconds": round(py_s, 4),
        "compiled_events_per_s": round(n / fast_s),
        "python_events_per_s": round(n / py_s),
        "compiled_events_per_cpu_s": round(n / max(cpu[0], 1e-9)),
        "python_events_per_cpu_s": round(n / max(cpu[1], 1e-9)),
        "speedup": round(py_s / fast_s, 1),
    }


_WARM = (
    "import time; from predictor.sim.replay import replay_fast; t = time.perf_counter(); "
    "replay_fast([('alloc', 1, 512), ('free', 1, 0)]); print(time.perf_counter() - t)"
)


def warmup() -> dict:
    """First call in a fresh process: with an empty cache (compile) and a filled one."""
    with tempfile.TemporaryDirectory() as tmp:
        env = os.environ | {"NUMBA_CACHE_DIR": tmp}
        runs = [
            float(subprocess.run([sys.executable, "-c", _WARM], env=env, check=True,
                                 capture_output=True, text=True).stdout.split()[-1])
            for _ in range(2)
        ]  # fmt: skip
    return {"compile_seconds": round(runs[0], 2), "cache_load_seconds": round(runs[1], 3)}


def predict_speed(graphs: dict, skip_profile: bool) -> list[dict]:
    rows = []
    gnn = load_default_model()
    replay_model = ReplayModel()
    for name, (graph, sizes) in graphs.items():
        q = [Query(sizes=sizes, device=DEVICE.name, metric="reserved")]
        qa = [Query(sizes=sizes, device=DEVICE.name, metric="allocated")]
        replay_model.predict(graph, q)  # warm
        rep_s = median_of(lambda: replay_model.predict(graph, q), 5)  # noqa: B023
        reserved = replay_model.predict(graph, q)[0]
        allocated = replay_model.predict(graph, qa)[0]
        t0 = time.perf_counter()
        g = gnn.predict(graph, q)[0]
        gnn_first = time.perf_counter() - t0
        gnn_s = median_of(lambda: gnn.predict(graph, q), 5)  # noqa: B023
        sim_s, sim = best_of(lambda: simulate(graph, sizes, DEVICE, scenario="worst"), 1)  # noqa: B023
        assert reserved.predicted_peak_bytes == sim.peak_reserved_bytes
        assert allocated.predicted_peak_bytes == sim.peak_allocated_bytes
        resolved = sweep(graph, sizes, scenario="worst").sizes
        cfg = AllocatorConfig(capacity_bytes=DEVICE.total_bytes - DEVICE.context_bytes)
        arr = trace_arrays(graph, 0, resolved, DEVICE)
        parts = {
            "sweep": median_of(lambda: sweep(graph, sizes, scenario="worst"), 5),  # noqa: B023
            "trace_arrays": median_of(lambda: trace_arrays(graph, 0, resolved, DEVICE), 5),  # noqa: B023
            "replay": median_of(lambda: replay_trace_fast(arr, cfg), 5),  # noqa: B023
        }
        events = arr.op
        row = {
            "case": name,
            "sizes": sizes,
            "nodes": sum(p.num_nodes for p in graph.paths),
            "events": len(events),
            "estimated_events": estimate_events(graph),
            "replay_predict_ms": round(rep_s * 1e3, 2),
            "replay_parts_ms": {k: round(v * 1e3, 2) for k, v in parts.items()},
            "gnn_first_query_ms": round(gnn_first * 1e3, 2),
            "gnn_query_ms": round(gnn_s * 1e3, 2),
            "gnn_version": g.model_version,
            "python_sim_ms": round(sim_s * 1e3, 1),
            "replay_allocated_bytes": allocated.predicted_peak_bytes,
            "replay_reserved_bytes": reserved.predicted_peak_bytes,
            "python_sim_allocated_bytes": sim.peak_allocated_bytes,
            "python_sim_reserved_bytes": sim.peak_reserved_bytes,
            "gnn_reserved_bytes": g.predicted_peak_bytes,
            "would_oom": reserved.breakdown["would_oom"],
        }
        if name == "gpt2-small" and not skip_profile:
            model, hp, train, _ = CASES[name]
            rec = profile(make_bundle(model, hp), train, sizes,
                          ProfileConfig(backend="sim", device=DEVICE.name))  # fmt: skip
            row["profile_sim_allocated_bytes"] = rec.peak_allocated_bytes
            row["profile_sim_reserved_bytes"] = rec.peak_reserved_bytes
            assert rec.peak_reserved_bytes == reserved.predicted_peak_bytes
            assert rec.peak_allocated_bytes == allocated.predicted_peak_bytes
        rows.append(row)
    return rows


SNAPSHOTS = Path(__file__).resolve().parents[2] / "shared" / "reference" / "cuda-snapshots"


class _DataOnly(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        raise pickle.UnpicklingError(f"snapshot refers to code ({module}.{name}): refused")


def snapshot_events(path: Path) -> tuple[list[tuple], int]:
    """A real snapshot's alloc / free_completed requests as replay events (frees of blocks
    allocated before recording began dropped), and the recorded reserved peak."""
    with gzip.open(path) as f:
        data = _DataOnly(f).load()
    events, live, reserved, peak = [], set(), 0, 0
    for e in data["device_traces"][0]:
        act, addr = e["action"], e["addr"]
        if act == "alloc":
            live.add(addr)
            events.append(("alloc", addr, e["size"], e["stream"]))
        elif act == "free_completed" and addr in live:
            live.remove(addr)
            events.append(("free", addr, 0))
        elif act in ("segment_alloc", "segment_free"):
            reserved += e["size"] if act == "segment_alloc" else -e["size"]
            peak = max(peak, reserved)
    return events, peak


def snapshot_traces() -> list[dict]:
    """Plain replays (empty start) of the shared real CUDA traces, compiled vs Python."""
    rows = []
    for path in sorted(SNAPSHOTS.glob("*.pickle.gz")):
        events, recorded_peak = snapshot_events(path)
        sim = CachingAllocatorSim()
        handles, per_event = {}, []
        for ev in events:
            if ev[0] == "alloc":
                handles[ev[1]] = sim.malloc(ev[2], ev[3])
            else:
                sim.free(handles.pop(ev[1]))
            per_event.append((sim.allocated, sim.reserved, len(sim._segments)))
        fast = replay_fast(events, record=True)
        same = fast.per_event.T.tolist() == [list(r) for r in per_event]
        rows.append(
            {
                "file": path.name,
                "events": len(events),
                "per_event_equal": same and fast.snapshot() == sim.snapshot(),
                "replay_peak_reserved_bytes": fast.peak_reserved_bytes,
                "recorded_in_trace_peak_reserved_bytes": recorded_peak,
            }
        )
    return rows


def markdown(result: dict) -> str:
    lines = ["# Replay speed: compiled core (numba) vs the Python simulator", "",
             f"Command: `{result['command']}`", "", "## Core, one core", "",
             "Wall: best of 5 (Python: 1) on a shared 2-core machine; CPU: the same, counted in "
             "process CPU seconds (what one uncontended core would take).", "",
             "| trace | events | compiled s | compiled events/s (wall / CPU) | Python s | "
             "Python events/s (wall / CPU) | speedup |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in result["core"]:
        lines.append(
            f"| {r['trace']} | {r['events']:,} | {r['compiled_seconds']:.4f} | "
            f"{r['compiled_events_per_s']:,} / {r['compiled_events_per_cpu_s']:,} | "
            f"{r['python_seconds']:.3f} | {r['python_events_per_s']:,} / "
            f"{r['python_events_per_cpu_s']:,} | {r['speedup']}x |"
        )
    lines += ["", "Real CUDA traces (shared snapshots, plain replay from an empty allocator: "
              "per event allocated, reserved and segments, and the final layout):", "",
              "| file | events | compiled = Python, every event | replay peak reserved | "
              "recorded: max running sum of segment_alloc - segment_free from the trace "
              "start (meaningful where the trace starts empty) |",
              "|---|---|---|---|---|"]  # fmt: skip
    for r in result.get("snapshots", []):
        lines.append(
            f"| {r['file']} | {r['events']:,} | {r['per_event_equal']} | "
            f"{r['replay_peak_reserved_bytes']:,} | "
            f"{r['recorded_in_trace_peak_reserved_bytes']:,} |"
        )
    w = result["warmup"]
    lines += ["", "## JIT warm-up (first call in a fresh process)", "",
              f"- empty numba cache (compile): {w['compile_seconds']} s",
              f"- on-disk cache (`cache=True`): {w['cache_load_seconds']} s", "",
              "## Exact predict, in-process (capture excluded)", "",
              "| case | events | replay predict ms | parts ms | GNN first / repeat ms | "
              "Python sim ms | reserved: replay = sim | allocated: replay = sim |",
              "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in result["predict"]:
        parts = ", ".join(f"{k} {v}" for k, v in r["replay_parts_ms"].items())
        lines.append(
            f"| {r['case']} {r['sizes']} | {r['events']:,} | {r['replay_predict_ms']} | "
            f"{parts} | {r['gnn_first_query_ms']} / {r['gnn_query_ms']} | "
            f"{r['python_sim_ms']} | {r['replay_reserved_bytes']:,} = "
            f"{r['python_sim_reserved_bytes']:,} | {r['replay_allocated_bytes']:,} = "
            f"{r['python_sim_allocated_bytes']:,} |"
        )
    for r in result["predict"]:
        if "profile_sim_reserved_bytes" in r:
            lines.append(
                f"\n`memgnn profile --backend sim` ({r['case']}, concrete capture): reserved "
                f"{r['profile_sim_reserved_bytes']:,}, allocated "
                f"{r['profile_sim_allocated_bytes']:,} bytes (equal to the replay)."
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip-profile", action="store_true", help="no concrete GPT-2 capture")
    ap.add_argument("--cases", default=",".join(CASES))
    args = ap.parse_args()
    graphs = {}
    for name in args.cases.split(","):
        model, hp, train, sizes = CASES[name]
        t0 = time.perf_counter()
        graphs[name] = (capture_cached(make_bundle(model, hp), train, sizes=sizes), sizes)
        print(f"{name}: graph in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    result = {
        "command": "PYTHONPATH=. .venv/bin/python benchmarks/replay_speed.py "
        + " ".join(sys.argv[1:]),
        "core": core_speed(graphs),
        "snapshots": snapshot_traces() if SNAPSHOTS.is_dir() else [],
        "warmup": warmup(),
        "predict": predict_speed(graphs, args.skip_profile),
    }
    write_results("replay_speed", result, markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
