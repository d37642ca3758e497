"""Golden answers: a fixed set of `memgnn` commands whose JSON answers must not change.

`python tests/golden/golden.py --write` records them in `tests/golden/answers.json`;
`tests/test_golden.py` runs the same commands and compares, byte for byte, every number
an answer states (timings, graph ids and the route's cost estimate are left out: they
describe the run, not the answer). A change that means to move an answer rewrites the
file in the same commit and says why.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ANSWERS = HERE / "answers.json"

_GPU = ["--device", "a100-80gb"]
_GPT = ["--model", "gpt2", "--batch", "4", "--seq", "128"]
# name -> memgnn argv (without --json); each answer is the command's JSON document
COMMANDS: dict[str, list[str]] = {
    "predict-fp32-replay": ["predict", *_GPT, *_GPU, "--method", "replay"],
    "predict-amp-ckpt-accum": [
        "predict",
        *_GPT,
        *_GPU,
        "--precision",
        "amp-bf16",
        "--checkpointing",
        "full",
        "--grad-accum",
        "2",
        "--method",
        "replay",
    ],
    "predict-bf16-lora": [
        "predict",
        *_GPT,
        *_GPU,
        "--precision",
        "bf16",
        "--peft",
        "lora",
        "--lora-r",
        "4",
        "--method",
        "replay",
    ],
    "predict-fsdp2": [
        "predict",
        *_GPT,
        *_GPU,
        "--gpus",
        "2",
        "--sharding",
        "fsdp",
        "--method",
        "replay",
    ],
    "predict-zero2-sgd": [
        "predict",
        *_GPT,
        *_GPU,
        "--gpus",
        "4",
        "--sharding",
        "zero2",
        "--optimizer",
        "sgd",
        "--method",
        "replay",
    ],
    "predict-cpu-analytic": ["predict", *_GPT, "--device", "cpu", "--method", "analytic"],
    "predict-gnn": ["predict", *_GPT, *_GPU, "--method", "gnn"],
    "predict-qlora-llama": [
        "predict",
        "--model",
        "llama",
        "--batch",
        "2",
        "--seq",
        "64",
        *_GPU,
        "--precision",
        "bf16",
        "--peft",
        "lora",
        "--quantize-base",
        "nf4",
        "--method",
        "replay",
    ],
    "predict-adamw8bit-hold": [
        "predict",
        "--model",
        "llama",
        "--batch",
        "2",
        "--seq",
        "64",
        *_GPU,
        "--optimizer",
        "adamw8bit",
        "--hold-outputs",
        "--method",
        "replay",
    ],
    "predict-threshold-verdict": [
        "predict",
        *_GPT,
        *_GPU,
        "--threshold",
        "0.85",
        "--method",
        "analytic",
    ],
    "plan-budget": [
        "plan",
        "--model",
        "gpt2",
        "--seq",
        "128",
        *_GPU,
        "--budget",
        "2GiB",
        "--max-batch",
        "256",
        "--checkpointing-choices",
        "none,full",
    ],
    "profile-sim": ["profile", "--backend", "sim", *_GPT, *_GPU],
    "snapshot-replay": ["snapshot", "replay", "{tmp}/step.pickle"],
}
# commands run first (their answers are not kept), e.g. to write a file the command reads
SETUP: dict[str, list[str]] = {
    "snapshot-replay": [
        "profile",
        "--backend",
        "sim",
        *_GPT,
        *_GPU,
        "--snapshot",
        "{tmp}/step.pickle",
    ],
}
# measured, not stated: these keys describe the run (or the cache), never the answer
VOLATILE = {
    "predict_seconds",
    "replay_seconds",
    "graph_seconds",
    "graph_id",
    "seconds",
    "route",
    "replay_skipped",
    "capture",
    "wall_seconds",
    "events_per_second",
    "simulated_replay_seconds",
}


def normalize(value: Any) -> Any:
    """The answer without the keys that describe the run; a training spec in its flat form
    (`TrainSpec.flat`: how it is spelled does not change what it says)."""
    from memgnn.predictor.spec.train import TrainSpec

    if isinstance(value, dict):
        return {
            k: TrainSpec.from_dict(v).flat() if k == "train" else normalize(v)
            for k, v in value.items()
            if k not in VOLATILE
        }
    if isinstance(value, list):
        return [normalize(v) for v in value]
    return value


def missing(stored: Any, got: Any, where: str = "") -> list[str]:
    """Where `got` does not state what `stored` did: every recorded key (recursively) with
    the same value; keys an answer gained since are allowed (a new field is not a change
    of what the answer says)."""
    if isinstance(stored, dict):
        if not isinstance(got, dict):
            return [f"{where or '.'}: {got!r} is not a mapping"]
        out = []
        for k, v in stored.items():
            if k not in got:
                out.append(f"{where}.{k}: gone")
            else:
                out += missing(v, got[k], f"{where}.{k}")
        return out
    if isinstance(stored, list):
        if not isinstance(got, list) or len(got) != len(stored):
            return [f"{where}: {got!r} != {stored!r}"]
        return [
            m for i, (a, b) in enumerate(zip(stored, got)) for m in missing(a, b, f"{where}[{i}]")
        ]
    return [] if stored == got else [f"{where}: {got!r} != {stored!r} (recorded)"]


def _memgnn(argv: list[str]) -> str:
    from memgnn.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main([*argv, "--json"])
    if code != 0:
        raise RuntimeError(f"memgnn {' '.join(argv)} exited {code}")
    return out.getvalue()


def run(name: str) -> dict[str, Any]:
    """Command `name` (after its setup) in this process: its JSON document, normalized."""
    with tempfile.TemporaryDirectory() as tmp:
        if name in SETUP:
            _memgnn([a.replace("{tmp}", tmp) for a in SETUP[name]])
        text = _memgnn([a.replace("{tmp}", tmp) for a in COMMANDS[name]])
    return normalize(json.loads(text))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="record the answers")
    parser.add_argument("names", nargs="*", help="only these commands")
    args = parser.parse_args(argv)
    names = args.names or list(COMMANDS)
    stored = json.loads(ANSWERS.read_text()) if ANSWERS.exists() else {}
    changed = 0
    for name in names:
        got = run(name)
        if name not in stored or missing(stored[name], got):
            changed += 1
            print(f"{name}: {'recorded' if args.write else 'DIFFERS'}", file=sys.stderr)
        stored[name] = got
    if args.write:
        ANSWERS.write_text(json.dumps(stored, indent=1, sort_keys=True) + "\n")
    return 0 if args.write or not changed else 1


if __name__ == "__main__":
    sys.exit(main())
