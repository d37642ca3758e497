"""A warm one-shot `memgnn predict` (its graph cached) beside a bare `import torch`.

    .venv/bin/python benchmarks/cli_warm.py [--repeats 5]

A tiny Llama config.json (2 layers, hidden 64) as an `hf:` model; one untimed run
captures its step into a fresh `MEMGNN_CACHE`; then `--repeats` rounds, each timing, in
turn, `python -c "import torch"`, `memgnn predict` (default route: auto, which replays
the cached graph exactly, loading the compiled replay from numba's on-disk cache) and
`memgnn predict --method gnn` (the learned model: no replay JIT), all in fresh processes.
Reported: min and median wall seconds of each, and where a warm run's time goes: the
cumulative import time of the big packages (`python -X importtime`;
torch.distributed.tensor is what the recorder and the FSDP emulation import) and the
slowest calls of one warm run (cProfile, by cumulative time).
Writes benchmarks/results/cli_warm.json and .md.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import pstats
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from results_io import write_results

ROOT = Path(__file__).resolve().parents[1]
CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 256,
    "max_position_embeddings": 64,
}
PACKAGES = ("torch", "torch.distributed.tensor", "transformers", "numba", "onnxruntime", "numpy")


def _predict(config: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "memgnn.cli", "predict", "--model", f"hf:{config}",
            "--batch", "2", "--seq", "16", *extra]  # fmt: skip


def _wall(cmd: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, cwd=ROOT, check=True, capture_output=True)
    return time.perf_counter() - t0


def _imports(cmd: list[str], env: dict[str, str]) -> dict[str, float]:
    """Seconds of the import of each package's root module, what it imported included
    (`-X importtime`'s cumulative figure)."""
    err = subprocess.run([cmd[0], "-X", "importtime", *cmd[1:]], env=env, cwd=ROOT,
                         check=True, capture_output=True, text=True).stderr  # fmt: skip
    out: dict[str, float] = {}
    for line in err.splitlines():
        m = re.match(r"import time:\s+\d+ \|\s+(\d+) \| *(\S+)$", line)
        if m and m.group(2) in PACKAGES:
            out[m.group(2)] = max(out.get(m.group(2), 0.0), int(m.group(1)) / 1e6)
    return {k: round(v, 3) for k, v in sorted(out.items(), key=lambda kv: -kv[1])}


def _profile(config: Path, env: dict[str, str]) -> str:
    """The slowest calls (cumulative) of one warm `memgnn predict`, in a child process."""
    with tempfile.NamedTemporaryFile(suffix=".prof") as f:
        cmd = [sys.executable, "-m", "cProfile", "-o", f.name, "-m", "memgnn.cli", "predict",
               "--model", f"hf:{config}", "--batch", "2", "--seq", "16"]  # fmt: skip
        subprocess.run(cmd, env=env, cwd=ROOT, check=True, capture_output=True)
        buf = io.StringIO()
        stats = pstats.Stats(f.name, stream=buf)
        stats.sort_stats("cumulative").print_stats(r"memgnn|wt-|predictor|transformers", 25)
    return buf.getvalue()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    load_before = [round(x, 2) for x in os.getloadavg()]
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "llama" / "config.json"
        config.parent.mkdir()
        config.write_text(json.dumps(CONFIG))
        env = os.environ | {"MEMGNN_CACHE": str(Path(tmp) / "cache")}
        t0 = time.perf_counter()
        subprocess.run(_predict(config), env=env, cwd=ROOT, check=True, capture_output=True)
        cold = time.perf_counter() - t0
        runs: dict[str, list[float]] = {"import torch": [], "memgnn predict": [],
                                        "memgnn predict --method gnn": []}  # fmt: skip
        cmds = {
            "import torch": [sys.executable, "-c", "import torch"],
            "memgnn predict": _predict(config),
            "memgnn predict --method gnn": _predict(config, "--method", "gnn"),
        }
        for _ in range(args.repeats):
            for name, cmd in cmds.items():
                runs[name].append(_wall(cmd, env))
        imports = _imports(_predict(config), env)
        profile = _profile(config, env)
    result = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_average_before": load_before,
            "load_average_after": [round(x, 2) for x in os.getloadavg()],
        },  # fmt: skip
        "cold_first_run_s": round(cold, 2),
        "wall_s": {k: [round(x, 3) for x in v] for k, v in runs.items()},
        "min_s": {k: round(min(v), 3) for k, v in runs.items()},
        "median_s": {k: round(statistics.median(v), 3) for k, v in runs.items()},
        "imports_s": imports,
        "profile": profile,
        "args": "".join(f" {a}" for a in sys.argv[1:]),
    }
    write_results("cli_warm", result, markdown(result))
    sys.stdout.write(markdown(result))


def markdown(r: dict) -> str:
    m = r["machine"]
    rows = [f"| `{k}` | {r['min_s'][k]:.2f} | {r['median_s'][k]:.2f} |" for k in r["min_s"]]
    imports = ", ".join(f"{k} {v:.2f} s" for k, v in r["imports_s"].items())
    return "\n".join(
        [
            "# warm one-shot `memgnn predict` beside a bare `import torch`",
            "",
            f"A tiny Llama config.json as `hf:`, its graph cached (the untimed first run "
            f"captured it in {r['cold_first_run_s']:.1f} s); fresh processes, "
            f"{len(next(iter(r['wall_s'].values())))} rounds; {m['cpus']} CPUs shared with "
            f"another agent's jobs (load average {m['load_average_before'][0]} before, "
            f"{m['load_average_after'][0]} after); Python {m['python']}.",
            "",
            "| command | min s | median s |",
            "|---|---|---|",
            *rows,
            "",
            f"Imports of a warm `memgnn predict` (`-X importtime`, cumulative): {imports}.",
            "",
            "The slowest calls of one warm run (cProfile, cumulative; profiling inflates them):",
            "",
            "```",
            r["profile"].strip(),
            "```",
            "",
            f"Command: `.venv/bin/python benchmarks/cli_warm.py{r.get('args', '')}`",
            "",
        ]
    )


if __name__ == "__main__":
    main()
