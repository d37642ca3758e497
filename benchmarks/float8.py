"""torchao float8 training (`--float8`) next to bf16: memgnn's answers, and the public rows.

    nice -n 10 python benchmarks/float8.py [--timeout 1800]
        -> benchmarks/results/float8.{md,json}

1. A catalog model (hf:meta-llama/Llama-3.2-1B, one H100, pure bf16, AdamW, B=2 S=2048):
   the replayed reserved peak and the allocated peak per recipe, side by side.
2. torchao's torchtitan rows (aof81-aof83 of public-gpu-measurements-2.csv: Llama 3 8B, 8x
   H100, FSDP2 bf16 params, B=1 S=8192, per-op selective AC, torch.compile): memgnn has no
   per-op selective AC, so the step is predicted with full and with no checkpointing (a
   bracket), each with --float8 none / tensorwise / rowwise; what the rows measure and
   what memgnn changes between bf16 and float8 is the point of the comparison.
Each prediction is one `memgnn predict --json` subprocess (captures cached).

    python benchmarks/float8.py --cpu-check -> benchmarks/results/float8_cpu.md
3. The check behind it: a real CPU training step of a small float8 model (torchao's own
   Float8Linear on CPU tensors, memgnn's CPU recorder) against memgnn's capture of it, per
   recipe and precision (the model of tests/predictor/emulate/test_float8.py).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results"
MEMGNN = [str(Path(sys.executable).with_name("memgnn"))]
RECIPES = ("none", "tensorwise", "rowwise", "rowwise_with_gw_hp")
SMALL = ["--model", "hf:meta-llama/Llama-3.2-1B", "--batch", "2", "--seq", "2048",
         "--precision", "bf16", "--device", "h100-80gb"]  # fmt: skip
TITAN = ["--model", "hf:meta-llama/Llama-3.1-8B", "--batch", "1", "--seq", "8192",
         "--gpus", "8", "--sharding", "fsdp", "--device", "h100-80gb"]  # fmt: skip
# torchtitan's FSDP2 MixedPrecisionPolicy(param bf16, reduce fp32) over fp32 master weights
# has no memgnn option: amp-bf16 (fp32 parameters, autocast: what the torchtitan reader
# maps it to) and bf16 (bf16 parameters and AdamW state) bracket it
TITAN_PRECISIONS = ("amp-bf16", "bf16")
# aof81-aof83: torchtitan 'memory' = max_memory_reserved, GiB (torchao docs/source/workflows/
# training.md, copied into public-gpu-measurements-2.csv)
MEASURED = {"none": 47.65, "tensorwise": 47.77, "rowwise": 47.79}
MEASURED_ROW = {"none": "aof81", "tensorwise": "aof82 (+ fp8 all-gather)", "rowwise": "aof83"}


def predict(args: list[str], timeout: float) -> dict:
    t0 = time.perf_counter()
    cmd = ["nice", "-n", "10", *MEMGNN, "predict", *args, "--method", "replay", "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    out = {"command": "memgnn predict " + " ".join(args) + " --method replay"}
    if proc.returncode != 0:
        return out | {"error": (proc.stderr.strip().splitlines() or ["?"])[-1][:300]}
    answer = json.loads(proc.stdout)
    answer = answer["predictions"][0] if "predictions" in answer else answer
    breakdown = answer["breakdown"]
    return out | {
        "seconds": round(time.perf_counter() - t0, 1),
        "reserved": int(answer["predicted_peak_bytes"]),
        "allocated": breakdown.get("tensor_peak_bytes"),
        "categories": breakdown.get("categories", {}),
        "model": answer["model"]["module_class"] if answer.get("model") else None,
    }


def gib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**30:.2f}"


def _delta(titan: dict, recipe: str, precision: str, ckpt: str, key: str) -> int | None:
    """float8 `recipe` minus bf16 Linears, in `key` (reserved, allocated or a category)."""
    a, b = titan.get((recipe, precision, ckpt), {}), titan.get(("none", precision, ckpt), {})
    get = (lambda r: r.get("categories", {}).get(key)) if key == "activation" else (
        lambda r: r.get(key))  # fmt: skip
    return None if get(a) is None or get(b) is None else get(a) - get(b)


def _titan_notes(titan: dict) -> list[str]:
    """What changes between bf16 and float8 Linears, in memgnn's answers and in the rows."""
    if not titan:
        return []

    def show(n: int | None) -> str:
        return "-" if n is None else f"{n:+,} B ({n / 2**30:+.2f} GiB)"

    out = ["", "float8 minus bf16 Linears (memgnn):", ""]
    for precision in TITAN_PRECISIONS:
        for ckpt in ("full", "none"):
            cells = ", ".join(
                f"{recipe}: reserved {show(_delta(titan, recipe, precision, ckpt, 'reserved'))}"
                f", allocated {show(_delta(titan, recipe, precision, ckpt, 'allocated'))}"
                f", activation {show(_delta(titan, recipe, precision, ckpt, 'activation'))}"
                for recipe in ("tensorwise", "rowwise")
            )
            out.append(f"- {precision}, {ckpt} AC: {cells}")
    measured = {r: MEASURED[r] - MEASURED["none"] for r in ("tensorwise", "rowwise")}
    out += [
        f"- measured (rows): tensorwise {measured['tensorwise']:+.2f} GiB, rowwise "
        f"{measured['rowwise']:+.2f} GiB reserved",
        "",
        "Reading: with bf16 parameters (how torchtitan's FSDP2 MixedPrecisionPolicy hands "
        "the Linears their weights) float8 leaves the allocated peak where it is and adds "
        "reserved memory through its casts' temporaries, as the rows show (less there: "
        "torch.compile fuses the casts). Under amp-bf16 (fp32 parameters + autocast, the "
        "torchtitan reader's mapping) float8 is lower, by what autocast's nn.Linear saves "
        "and Float8Linear does not: the bf16 copy of each weight; Llama-3.1-8B's decoder "
        "Linears hold 32 x 4,096 x (2 x 4,096 + 2 x 1,024 + 3 x 14,336) = 6,979,321,856 "
        "weights, x 2 B = 13,958,643,712 B, the no-AC activation difference above to the "
        "byte; with full AC autograd does not keep them, but autocast's cast cache (leaf "
        "weights, cleared when the autocast region ends) holds them through the forward: "
        "the full-AC difference is in temporaries, 11,991,515,136 B at the peak. The rows "
        "do not run autocast, so bf16 is the closer model of them.",
    ]
    return out


def write_md(small: dict, titan: dict, path: Path) -> None:
    lines = [
        "# float8 training (torchao `convert_to_float8_training`) vs bf16",
        "",
        "`nice -n 10 python benchmarks/float8.py`; each figure is `memgnn predict ... "
        "--method replay` (torch 2.13, torchao 0.18 run under capture; GiB = 2^30 B).",
        "",
        "## Llama-3.2-1B, one H100 80GB, pure bf16, AdamW, B=2 S=2048",
        "",
        "| --float8 | model | reserved GiB | allocated GiB | activation GiB at peak | "
        "temporary GiB at peak |",
        "|---|---|---|---|---|---|",
    ]
    for recipe, r in small.items():
        cats = r.get("categories", {})
        lines.append(
            f"| {recipe} | {r.get('model') or r.get('error', '')} | {gib(r.get('reserved'))} | "
            f"{gib(r.get('allocated'))} | {gib(cats.get('activation'))} | "
            f"{gib(cats.get('temporary'))} |"
        )
    lines += ["", "Commands:", ""] + [f"- `{r['command']}`" for r in small.values()]
    lines += [
        "",
        "## torchao's torchtitan rows (Llama 3 8B, 8x H100, FSDP2, B=1 S=8192)",
        "",
        "Measured: torchtitan's max_memory_reserved with per-op selective AC and "
        "torch.compile. memgnn models neither (no per-op selective AC: full and none "
        "bracket it; eager: float8 casts as eager torchao makes them), so the rows are "
        "compared by what changes between bf16 and float8.",
        "",
        "| --float8 | row | measured GiB | amp-bf16 full AC | amp-bf16 no AC | bf16 full AC "
        "| bf16 no AC |",
        "|---|---|---|---|---|---|---|",
    ]
    for recipe in MEASURED:
        cells = []
        for precision in TITAN_PRECISIONS:
            for ckpt in ("full", "none"):
                r = titan.get((recipe, precision, ckpt), {})
                cells.append(gib(r["reserved"]) if "reserved" in r else r.get("error", "-"))
        lines.append(
            f"| {recipe} | {MEASURED_ROW[recipe]} | {MEASURED[recipe]:.2f} | "
            + " | ".join(cells)
            + " |"
        )
    lines += [
        "",
        "Activation GiB at the peak (what autograd keeps), per column:",
        "",
        "| --float8 | amp-bf16 full AC | amp-bf16 no AC | bf16 full AC | bf16 no AC |",
        "|---|---|---|---|---|",
    ]
    for recipe in MEASURED:
        cells = [
            gib(titan.get((recipe, p, c), {}).get("categories", {}).get("activation"))
            for p in TITAN_PRECISIONS
            for c in ("full", "none")
        ]
        lines.append(f"| {recipe} | " + " | ".join(cells) + " |")
    lines += _titan_notes(titan)
    lines += ["", "Commands:", ""] + [f"- `{r['command']}`" for r in titan.values()]
    path.write_text("\n".join(lines) + "\n")


def cpu_check(path: Path) -> None:
    """Real CPU step vs capture for the float8 test model, per recipe and precision."""
    sys.path.insert(0, str(ROOT / "tests" / "predictor" / "emulate"))
    from memgnn.dataset.profile import ProfileConfig, profile
    from memgnn.predictor.spec.train import TrainSpec
    from test_float8 import _net

    lines = [
        "# float8: a real CPU step vs memgnn's capture",
        "",
        "`python benchmarks/float8.py --cpu-check` (torch 2.13 CPU, torchao 0.18): the model "
        "of tests/predictor/emulate/test_float8.py (Linear 64->128, 128->64, two heads), "
        "B=32, AdamW; peak of live tensor storages, bytes.",
        "",
        "| --float8 | precision | real CPU step | memgnn capture | phase peaks equal |",
        "|---|---|---|---|---|",
    ]
    for precision in ("bf16", "fp32"):
        for recipe in RECIPES:
            train = TrainSpec.of(float8=recipe, precision=precision)
            real = profile(_net(), train, {"B": 32}, ProfileConfig(backend="cpu"))
            sim = profile(_net(), train, {"B": 32}, ProfileConfig(backend="sim", device="cpu"))
            same = sim.breakdown["tensor_phase_peaks"] == real.breakdown["tensor_phase_peaks"]
            lines.append(
                f"| {recipe} | {precision} | {real.peak_allocated_bytes:,} | "
                f"{sim.peak_allocated_bytes:,} | {same} |"
            )
    path.write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--skip-titan", action="store_true")
    parser.add_argument("--cpu-check", action="store_true")
    parser.add_argument("--rewrite", action="store_true", help="rewrite the md from the json")
    args = parser.parse_args()
    if args.rewrite:
        data = json.loads((OUT / "float8.json").read_text())
        titan = {tuple(k.split("/")): v for k, v in data["titan"].items()}
        write_md(data["small"], titan, OUT / "float8.md")
        return
    if args.cpu_check:
        cpu_check(OUT / "float8_cpu.md")
        return
    small = {r: predict([*SMALL, "--float8", r], args.timeout) for r in RECIPES}
    titan: dict = {}
    if not args.skip_titan:
        for precision in TITAN_PRECISIONS:
            for ckpt in ("full", "none"):
                for recipe in MEASURED:
                    titan[(recipe, precision, ckpt)] = predict(
                        [*TITAN, "--precision", precision, "--checkpointing", ckpt,
                         "--float8", recipe], args.timeout,
                    )  # fmt: skip
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "float8.json").write_text(
        json.dumps({"small": small, "titan": {"/".join(k): v for k, v in titan.items()}}, indent=1)
        + "\n"  # fmt: skip
    )
    write_md(small, titan, OUT / "float8.md")


if __name__ == "__main__":
    main()
