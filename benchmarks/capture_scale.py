"""Capture at scale on a CPU-only machine: Llama-2-7B and a 70B config, fake tensors only.

Each model runs as its own `memgnn -v predict ... --no-cache --json` process under
`/usr/bin/time -v`, so the wall time and the peak RSS are the whole command's (Python,
torch and transformers imports included); no weight is materialised (the model is built
under a FakeTensorMode). The capture's own seconds come from the capture log line.

    nice -n 10 .venv/bin/python benchmarks/capture_scale.py            # both models
    nice -n 10 .venv/bin/python benchmarks/capture_scale.py --only 7b  # one of them

writes benchmarks/results/capture_scale.md (and .json next to it).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
MODELS = {
    "7b": "hf:meta-llama/Llama-2-7b-hf",
    "70b": "hf:meta-llama/Llama-2-70b-hf",
}
CONFIG = ["--device", "a100-80gb", "--precision", "bf16", "--batch", "1", "--seq", "2048"]
_CAPTURE = re.compile(r"captured (\S+): (\d+) path\(s\), (\d+) nodes in ([\d.]+)s")


def _memgnn() -> str:
    exe = Path(sys.executable).with_name("memgnn")
    return str(exe) if exe.is_file() else (shutil.which("memgnn") or "memgnn")


def _time_v(stderr: str, label: str) -> str:
    for line in stderr.splitlines():
        if line.strip().startswith(label):
            return line.split(": ", 1)[1].strip()
    raise RuntimeError(f"/usr/bin/time -v printed no {label!r}")


def _seconds(clock: str) -> float:
    parts = [float(p) for p in clock.split(":")]
    return sum(p * 60**i for i, p in enumerate(reversed(parts)))


def run_one(key: str, method: str, timeout_s: float) -> dict:
    cmd = [_memgnn(), "-v", "predict", "--model", MODELS[key], *CONFIG]
    cmd += ["--method", method, "--no-cache", "--json"]
    t0 = time.perf_counter()
    proc = subprocess.run(
        ["/usr/bin/time", "-v", *cmd], capture_output=True, text=True, timeout=timeout_s
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    out = json.loads(proc.stdout)
    captured = _CAPTURE.search(proc.stderr)
    return {
        "model": MODELS[key],
        "command": " ".join(["/usr/bin/time", "-v", "memgnn", *cmd[1:]]),
        "wall_seconds": round(_seconds(_time_v(proc.stderr, "Elapsed (wall clock) time")), 1),
        "peak_rss_bytes": int(_time_v(proc.stderr, "Maximum resident set size")) * 1024,
        "capture_seconds": float(captured.group(4)) if captured else None,
        "nodes": int(captured.group(3)) if captured else None,
        "parameters": out["model"]["parameters"],
        "predicted_peak_bytes": out["predicted_peak_bytes"],
        "upper_bound_bytes": out["upper_bound_bytes"],
        "metric": out["metric"],
        "method": out["method"],
        "predict_seconds": out["predict_seconds"],
        "measured_seconds": round(time.perf_counter() - t0, 1),
    }


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def write(rows: list[dict]) -> Path:
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "capture_scale.json").write_text(json.dumps(rows, indent=2) + "\n")
    lines = [
        "# Capture at scale (CPU only, fake tensors, no weights)",
        "",
        "Written by `nice -n 10 .venv/bin/python benchmarks/capture_scale.py` (one process per",
        "model, run one after the other on the same machine; wall time and peak RSS from",
        "`/usr/bin/time -v` over the whole `memgnn predict` command, imports included).",
        "",
        "| model | parameters | nodes | capture s | wall s | peak RSS | predicted peak "
        "| metric | method |",
        "|---|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['parameters']:,} | {r['nodes']:,} | {r['capture_seconds']} "
            f"| {r['wall_seconds']} | {_gib(r['peak_rss_bytes'])} | "
            f"{r['predicted_peak_bytes']:,} B ({_gib(r['predicted_peak_bytes'])}) "
            f"| {r['metric']} | {r['method']} |"
        )
    lines += ["", "Commands:", ""] + [f"    {r['command']}" for r in rows]
    path = RESULTS / "capture_scale.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=sorted(MODELS), action="append")
    ap.add_argument("--method", default="analytic", help="predict --method (default analytic)")
    ap.add_argument("--timeout", type=float, default=2400.0, help="seconds per model")
    args = ap.parse_args()
    rows = [run_one(k, args.method, args.timeout) for k in (args.only or ["7b", "70b"])]
    print(write(rows))


if __name__ == "__main__":
    main()
