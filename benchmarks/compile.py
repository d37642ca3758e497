"""`--compile`: memgnn's prediction of a compiled step against a real compiled CPU step.

For each tiny zoo model, three numbers per compile mode (none | blocks | full), all bytes on
the CPU, steady-state step (`--steps steady`: the warm-up step compiles):
- predicted: the captured step's tensor-level peak (fake tensors; a compiled region runs
  inductor's partition function and its generated wrapper, `predictor.emulate.compile`
  and `predictor.emulate.inductor`);
- real: a real step (`torch.compile`, inductor's CPU backend, for compiled modes) measured
  by torch.profiler's CPU allocator events (every c10 allocation, inductor's buffers
  included) plus the state alive before the step;
- real eager recorder: the eager step's recorder peak (the reference the `cpu` backend
  reports), for the eager row only.

    .venv/bin/python benchmarks/compile.py    # writes benchmarks/results/compile.{json,md}
"""

from __future__ import annotations

import logging
import sys
import time

import torch
from memgnn.dataset.cpu_backend import compiled_afresh, profiler_peak
from memgnn.predictor.capture.capture import CaptureConfig, capture
from memgnn.predictor.capture.step import TrainingStep, step_plan
from memgnn.predictor.errors import UserError
from memgnn.predictor.memory.analytic import sweep
from memgnn.predictor.spec.train import TrainSpec
from memgnn.predictor.zoo import make_bundle
from results_io import write_results

MODELS = [
    ("gpt2", {"dropout": 0.0}, {"B": 4, "S": 128}),
    ("llama", {}, {"B": 4, "S": 128}),
    ("gpt2", {"dropout": 0.1}, {"B": 4, "S": 128}),  # random ops in the compiled regions
    ("llama", {}, {"B": 3, "S": 40}),  # short sequences: the peak inside a compiled backward
]
# (compile, checkpointing)
MODES = (
    ("none", "none"),
    ("blocks", "none"),
    ("full", "none"),
    ("none", "full"),
    ("blocks", "full"),
    ("none", "selective-op"),
    ("blocks", "selective-op"),
    ("blocks+loss", "none"),  # --compile blocks --compile-loss true
)


def real_peak(bundle, train: TrainSpec, sizes: dict[str, int]) -> int:
    """Profiler peak of the measured step, plus the storages alive before it."""
    from torch.profiler import ProfilerActivity, profile

    torch.manual_seed(0)
    step = TrainingStep(bundle, train, device=torch.device("cpu"), target="cpu")
    warmup, measured = step_plan(train)
    with compiled_afresh():
        step.run(sizes, steps=warmup)
        seen, before = set(), 0
        for tensors in step.state_tensors().values():
            for t in tensors:
                s = t.untyped_storage()
                if s.data_ptr() not in seen:
                    seen.add(s.data_ptr())
                    before += s.nbytes()
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            step.run(sizes, steps=measured)
    return before + profiler_peak(prof)


def predicted_peak(bundle, train: TrainSpec, sizes: dict[str, int]) -> int:
    graph = capture(bundle, train, CaptureConfig(sizes=sizes, target="cpu", mode="full"))
    return sweep(graph, sizes).peak_bytes


def run() -> dict:
    rows = []
    for name, hp, sizes in MODELS:
        bundle = make_bundle(name, hp)
        for mode, ckpt in MODES:
            compile_loss = mode.endswith("+loss")
            train = TrainSpec.of(
                compile=mode.removesuffix("+loss"), compile_loss=compile_loss,
                checkpointing=ckpt, steps="steady",
            )  # fmt: skip
            t0 = time.perf_counter()
            try:
                pred = predicted_peak(bundle, train, sizes)
            except UserError as exc:  # refused: measured all the same, the reason kept
                pred, refused = None, str(exc).split(":")[0]
            else:
                refused = None
            t1 = time.perf_counter()
            torch._dynamo.reset()
            real = real_peak(bundle, train, sizes)
            graphs = int(torch._dynamo.utils.counters["stats"]["unique_graphs"])
            t2 = time.perf_counter()
            row = {
                "model": name,
                "hparams": hp,
                "sizes": sizes,
                "compile": mode,
                "checkpointing": ckpt,
                "predicted_bytes": pred,
                "refused": refused,
                "real_bytes": real,
                "rel_error": None if pred is None else (pred - real) / real,
                "dynamo_graphs": graphs,
                "capture_seconds": round(t1 - t0, 1),
                "real_seconds": round(t2 - t1, 1),
            }
            rows.append(row)
            print(f"{name} {mode} ckpt {ckpt}: pred {pred} real {real}", file=sys.stderr)
    return {"torch_version": torch.__version__, "rows": rows}


def markdown(result: dict) -> str:
    lines = [
        "# `--compile`: predicted vs a real compiled CPU step",
        "",
        "    .venv/bin/python benchmarks/compile.py",
        "",
        f"torch {result['torch_version']}, steady-state step, AdamW, fp32, CPU (inductor's "
        "C++ backend). predicted: capture's tensor-level peak; real: torch.profiler's CPU "
        "allocator peak plus the state alive before the step. `eager` rows are `--compile none`.",
        "",
        "| model | sizes | compile | checkpointing | predicted B | real B | error | "
        "vs eager, same checkpointing (real) |",
        "|---|---|---|---|---:|---:|---:|---:|",
    ]

    def who(r: dict) -> str:
        return r["model"] + "".join(f" {k}={v}" for k, v in r.get("hparams", {}).items())

    eager = {
        (who(r), str(r["sizes"]), r["checkpointing"]): r["real_bytes"]
        for r in result["rows"]
        if r["compile"] == "none"
    }
    for r in result["rows"]:
        base = eager[(who(r), str(r["sizes"]), r["checkpointing"])]
        vs = (r["real_bytes"] - base) / base
        pred, err = r["predicted_bytes"], r["rel_error"]
        lines.append(
            f"| {who(r)} | {r['sizes']} | {r['compile']} | {r['checkpointing']} | "
            + (f"refused ({r['refused']}) | " if pred is None else f"{pred:,} | ")
            + f"{r['real_bytes']:,} | "
            + ("- | " if err is None else f"{err:+.2%} | ")
            + f"{vs:+.2%} |"
        )
    lines += [
        "",
        "`blocks+loss`: `--compile blocks --compile-loss true` (the model's own loss "
        "function a compiled region too). "
        "What inductor allocates is its own generated wrapper's, run on the capture's "
        "tensors (each graph lowered, scheduled and memory-planned by inductor; "
        "predictor/emulate/inductor.py), and the saved set is its own partition "
        "function's. `blocks` with checkpointing: each block is compiled over its "
        "checkpoint (torchtitan's order), traced under PyTorch's own selective-checkpoint "
        "mode as AOTAutograd traces dynamo's `tag_activation_checkpoint` (`full`: every "
        "forward op prefers recompute; `selective-op`: torchtitan's op-level policy); "
        "dropout's draws become seeded `inductor_random` ops recomputed in backward. The "
        "compiled rows with checkpointing differ from the real step by what the eager rows "
        "with the same checkpointing differ (5,056 B per RNG state the eager checkpoint "
        "stashes on the CPU; on CUDA a host tensor). `full` on gpt2 over-predicts: dynamo "
        "breaks the graph at transformers' `logger.warning_once` about `loss_type=None` "
        "(the zoo config's), so the real loss is a graph of its own, while AOTAutograd "
        "traces through a logging call and the capture compiles model and loss as one "
        "region. Dynamo's graph breaks on Python side effects are not modelled (only "
        "untraceable, data-dependent code breaks a region, into its children). Before the "
        "capture ran inductor's wrapper (an approximation of its fusion), llama at B=3, "
        "S=40, `blocks` and `full` checkpointing was 5.7% low and gpt2 with dropout 0.1 "
        "2.4% low: the peak falls inside a compiled backward.",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    result = run()
    print(write_results("compile", result, markdown(result)))
