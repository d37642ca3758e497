"""Hostile-input run: schemathesis over the live service's OpenAPI schema (examples,
coverage, fuzzing and stateful phases), once with the bearer token and once without,
then the responses counted from schemathesis' HAR reports: how many were 5xx, and how
many writes (non-GET routes other than the read-only /predict and /plan) were accepted.

    python benchmarks/hostile_inputs.py [--max-time 240] [--seed 12]

Writes benchmarks/results/hostile_inputs.{json,md}. The server runs on loopback with its
own state folder and capture cache, and stops at the end.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
READ_ONLY_POSTS = ("/predict", "/plan")
TOKEN = "hostile-run"


def count(har: Path) -> dict:
    entries = json.loads(har.read_text())["log"]["entries"]
    classes: collections.Counter[str] = collections.Counter()
    accepted: collections.Counter[str] = collections.Counter()
    for e in entries:
        method, status = e["request"]["method"], e["response"]["status"]
        path = "/" + e["request"]["url"].split("/", 3)[-1].split("?")[0]
        classes[f"{status // 100}xx"] += 1
        if method not in ("GET", "HEAD") and path not in READ_ONLY_POSTS and status < 300:
            accepted[f"{method} {path}"] += 1 if status >= 200 else 0
    return {
        "requests": len(entries),
        "by_class": dict(sorted(classes.items())),
        "server_errors": sum(v for k, v in classes.items() if k.startswith("5")),
        "accepted_writes": {k: v for k, v in accepted.items() if v},
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--max-time", type=int, default=240, help="seconds per schemathesis run")
    ap.add_argument("--seed", type=int, default=12)
    ap.add_argument("--port", type=int, default=18732)
    a = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="memgnn-hostile-"))
    env = os.environ | {"PYTHONPATH": str(ROOT), "MEMGNN_CACHE": str(tmp / "cache")}
    server = subprocess.Popen(
        [sys.executable, "-m", "memgnn.cli", "serve", "--port", str(a.port), "--model", "analytic",
         "--state-dir", str(tmp / "state"), "--token", TOKEN, "--log-level", "warning"],
        cwd=ROOT, env=env,
    )  # fmt: skip
    url = f"http://127.0.0.1:{a.port}"
    try:
        for _ in range(240):
            try:
                if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        runs = {}
        for mode, headers in (("token", ["-H", f"Authorization: Bearer {TOKEN}"]), ("none", [])):
            har = tmp / f"{mode}.har"
            cmd = [str(Path(sys.executable).parent / "schemathesis"), "run", f"{url}/openapi.json",
                   *headers, "--checks", "not_a_server_error", "--max-examples", "60",
                   "--seed", str(a.seed), "--max-time", str(a.max_time), "--request-timeout",
                   "120", "--report", "har", "--report-har-path", str(har)]  # fmt: skip
            rc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True).returncode
            runs[mode] = count(har) | {"schemathesis_exit": rc}
    finally:
        server.terminate()
        server.wait(30)
    report = {
        "command": f"python benchmarks/hostile_inputs.py --max-time {a.max_time} --seed {a.seed}",
        "runs": runs,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "hostile_inputs.json").write_text(json.dumps(report, indent=2) + "\n")
    lines = [
        "# Hostile-input run (schemathesis over the OpenAPI schema, live server)",
        "",
        f"Command: `{report['command']}`",
        "",
        "| token | requests | by class | 5xx | writes accepted |",
        "|---|---|---|---|---|",
    ]
    for mode, r in runs.items():
        lines.append(
            f"| {mode} | {r['requests']} | {r['by_class']} | {r['server_errors']} | "
            f"{sum(r['accepted_writes'].values())} {r['accepted_writes'] or ''} |"
        )
    (RESULTS / "hostile_inputs.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
