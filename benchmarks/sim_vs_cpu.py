"""`sim` (fake tensors, device cpu) against `cpu` (a real CPU step) on a fixed config matrix.

Both report tensor-level peak live bytes (`peak_allocated_bytes` on the cpu device); the
target is agreement within 1% on every config. Also lists the real run's allocator-level
peak from torch.profiler, for reference.

    .venv/bin/python benchmarks/sim_vs_cpu.py    # writes benchmarks/results/sim_vs_cpu.{json,md}
"""

from __future__ import annotations

import itertools
import logging
import sys
import time

from memgnn.dataset.profile import ProfileConfig, profile
from memgnn.predictor.spec.train import TrainSpec
from memgnn.predictor.zoo import make_bundle
from results_io import write_results

# (zoo name, hparam overrides, sizes)
MODELS = [
    ("mlp", {}, {"B": 64}),
    ("resnet", {}, {"B": 4}),
    ("gpt2", {"dropout": 0.0}, {"B": 2, "S": 64}),
    ("llama", {}, {"B": 2, "S": 64}),
    ("bert", {"dropout": 0.0}, {"B": 2, "S": 64}),
    ("vit", {}, {"B": 4}),
    ("lstm", {}, {"B": 4, "S": 32}),
    ("unet", {}, {"B": 2}),
]
TRAINS = [
    TrainSpec.of(optimizer="adamw"),
    TrainSpec.of(optimizer="sgd", grad_accum=2),
    TrainSpec.of(optimizer="adam", precision="amp-bf16"),
    TrainSpec.of(optimizer="adafactor", checkpointing="full", steps="steady"),
]


def configs():
    for (name, hp, sizes), train in itertools.product(MODELS, TRAINS):
        yield name, hp, sizes, train


def run() -> dict:
    rows = []
    for name, hp, sizes, train in configs():
        bundle = make_bundle(name, hp)
        row = {"model": name, "sizes": sizes, "train": train.flat()}
        try:
            t0 = time.perf_counter()
            real = profile(bundle, train, sizes, ProfileConfig(backend="cpu"))
            t1 = time.perf_counter()
            sim = profile(bundle, train, sizes, ProfileConfig(backend="sim", device="cpu"))
            t2 = time.perf_counter()
        except ValueError as exc:  # e.g. a model without blocks to checkpoint
            row["skipped"] = str(exc)
            rows.append(row)
            continue
        row |= {
            "cpu_peak_allocated_bytes": real.peak_allocated_bytes,
            "sim_peak_allocated_bytes": sim.peak_allocated_bytes,
            "rel_error": (sim.peak_allocated_bytes - real.peak_allocated_bytes)
            / real.peak_allocated_bytes,
            "cpu_profiler_peak_bytes": real.stats["profiler_peak_bytes"],
            "cpu_seconds": round(t1 - t0, 2),
            "sim_seconds": round(t2 - t1, 2),
        }
        rows.append(row)
        print(
            f"{name:8s} {train.optim.name:9s} {train.numerics.precision:8s} "
            f"{train.activations.checkpointing:5s} "
            f"err {row['rel_error']:+.4%}",
            file=sys.stderr,
        )
    done = [r for r in rows if "rel_error" in r]
    errs = [abs(r["rel_error"]) for r in done]
    return {
        "metric": "peak_allocated_bytes on device cpu (peak live tensor storage bytes)",
        "configs": len(done),
        "families": sorted({r["model"] for r in done}),
        "within_1pct": sum(e <= 0.01 for e in errs),
        "max_abs_rel_error": max(errs) if errs else None,
        "rows": rows,
    }


def markdown(result: dict) -> str:
    lines = [
        f"sim vs cpu, {result['configs']} configs, {len(result['families'])} families; "
        f"within 1%: {result['within_1pct']}/{result['configs']}; "
        f"max |error| {result['max_abs_rel_error']:.4%}",
        "",
        "| model | sizes | optimizer | precision | ckpt | G | steps | cpu bytes | sim bytes "
        "| error | profiler peak |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        t = r["train"]
        head = (
            f"| {r['model']} | {r['sizes']} | {t['optimizer']} | {t['precision']} | "
            f"{t['checkpointing']} | {t['grad_accum']} | {t['steps']} |"
        )
        if "skipped" in r:
            lines.append(f"{head} skipped: {r['skipped']} | | | |")
        else:
            lines.append(
                f"{head} {r['cpu_peak_allocated_bytes']} | {r['sim_peak_allocated_bytes']} | "
                f"{r['rel_error']:+.4%} | {r['cpu_profiler_peak_bytes']} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    result = run()
    write_results("sim_vs_cpu", result, markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
