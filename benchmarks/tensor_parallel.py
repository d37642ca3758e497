"""Per-rank peak under tensor parallelism (`--tp`): memgnn against a real gloo run, by hand,
and a catalog model at --tp 1 / 2.

- memgnn: one symbolic capture of rank 0 over a fake process group
  (predictor/emulate/tensor_parallel.py), evaluated at the run's sizes on the `cpu` device.
- real gloo: `--tp` processes on CPU over gloo, plain PyTorch: the model built whole,
  `parallelize_module(model, mesh, plan)` with `ColwiseParallel()` / `RowwiseParallel()`
  from the model config's `base_model_tp_plan` (keys under `model.`), AdamW (for-loop), two
  steps; each rank's peak live bytes from torch.profiler's CPU allocator events; for 2-D
  (`--sharding fsdp`), `fully_shard` per block and on the root over the dp mesh dimension
  after TP, as torchtitan does.
- by hand: rank 0's parameter bytes before the step = the split linears' bytes / tp + the
  rest (embeddings, norms, lm_head: whole) + buffers; the optimizer state 2x the
  parameters (AdamW's exp_avg, exp_avg_sq) + one step counter per parameter.

    .venv/bin/python benchmarks/tensor_parallel.py [--quick]   # -> results/tensor_parallel.md
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from memgnn.dataset.cpu_backend import profiler_peak
from memgnn.predictor.capture.capture import CaptureConfig, capture
from memgnn.predictor.capture.step import build_optimizer
from memgnn.predictor.ir.vocab import CATEGORIES
from memgnn.predictor.memory.analytic import AnalyticModel
from memgnn.predictor.memory.base import Query
from memgnn.predictor.spec.bundle import default_blocks
from memgnn.predictor.spec.train import TrainSpec
from memgnn.predictor.zoo.resolve import resolve
from memgnn.serving.client import free_port

OUT = Path(__file__).parent / "results"
SMALL = ("llama", {"layers": "4", "hidden": "128", "ffn": "344", "vocab": "2048"})
SMALL_SIZES = {"B": 2, "S": 64}
log = logging.getLogger("tensor_parallel")
NOTE = (
    "diff: memgnn counts ~1 KB more than the profiler, as in the DDP/FSDP checks "
    "(sharding.md). A real rank above the others by 65,536 B (one (B, S, hidden) fp32 "
    "buffer) in some runs is gloo's worker thread freeing an all-reduced buffer after the "
    "main thread's next allocation, at random: each rank's lowest over the runs is given. "
    "memgnn's own CPU recorder on a real 2-rank gloo run of the same step (TrainingStep on "
    "real tensors in a real process group) gives the prediction to the byte on both ranks "
    "(tests/predictor/emulate/test_tensor_parallel.py::test_rank_peak_matches_a_real_gloo_run)."
)


def memgnn_answer(bundle, train: TrainSpec, sizes, device: str = "cpu") -> tuple[Any, Any, float]:
    """(memgnn's answer at `sizes` on `device`, the graph, capture seconds)."""
    t0 = time.perf_counter()
    target = "cpu" if device == "cpu" else "cuda"
    graph = capture(bundle, train, CaptureConfig(target=target))
    secs = time.perf_counter() - t0
    return AnalyticModel().predict(graph, [Query(sizes=sizes, device=device)])[0], graph, secs


def real_plan(model: torch.nn.Module) -> dict[str, Any]:
    """The config's base_model_tp_plan as PyTorch styles, keys under the base model."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    prefix = model.base_model_prefix
    return {f"{prefix}.{k}": styles[v]() for k, v in model.config.base_model_tp_plan.items()}


def _real_rank(
    rank: int, world: int, tp: int, port: int, spec, args, sizes, out: str, src: int | None = None
) -> None:
    """One rank of a real TP (or dp x tp with FSDP2) job on CPU over gloo."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module
    from torch.profiler import ProfilerActivity, profile, record_function

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    bundle = resolve(spec, args)
    dp = world // tp
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        model = bundle.build().train()
        if dp > 1:
            mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
            parallelize_module(model, mesh["tp"], real_plan(model), src_data_rank=src)
            from torch.distributed.fsdp import fully_shard

            for block in (bundle.blocks or default_blocks)(model):
                fully_shard(block, mesh=mesh["dp"])
            fully_shard(model, mesh=mesh["dp"])
        else:
            mesh = init_device_mesh("cpu", (tp,), mesh_dim_names=("tp",))
            parallelize_module(model, mesh, real_plan(model), src_data_rank=src)
        opt = build_optimizer(
            [p for p in model.parameters() if p.requires_grad], TrainSpec(), "cpu"
        )
        with record_function("steps"):
            for _ in range(2):
                inputs = bundle.make_inputs(sizes, torch.device("cpu"), torch.float32)
                loss = bundle.loss(model, inputs)
                del inputs
                loss.backward()
                del loss
                opt.step()
                opt.zero_grad(set_to_none=True)
    peak = profiler_peak(prof, region="steps")
    Path(out, f"rank{rank}.json").write_text(json.dumps({"peak": peak}))
    dist.destroy_process_group()


def real_peaks(spec, args, sizes, world: int, tp: int) -> list[int]:
    """Every rank's profiled peak of one real gloo run."""
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(
            _real_rank,
            args=(world, tp, port, spec, args, sizes, tmp),
            nprocs=world,
            join=True,
            start_method="spawn",
        )
        return [json.loads(Path(tmp, f"rank{r}.json").read_text())["peak"] for r in range(world)]


def initial_bytes(graph, category: str) -> int:
    """Rank 0's bytes of `category` alive before the measured step (registered state)."""
    p = graph.paths[0]
    nbytes = graph.storage_bytes(0, graph.resolve_sizes(graph.symbols))
    code = CATEGORIES.index(category)
    return sum(
        int(nbytes[u])
        for u in range(p.num_storages)
        if p.storages["category"][u] == code and p.storages["alloc"][u] == -1
    )


def hand_bytes(bundle, tp: int, dtype_bytes: int) -> dict[str, int]:
    """Rank 0's parameter bytes by hand: each split linear (the config plan's names) 1/tp,
    every other parameter and buffer whole."""
    import fnmatch

    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        model = bundle.build()
        patterns = [f"{model.base_model_prefix}.{k}" for k in model.config.base_model_tp_plan]
        split = whole = 0
        for name, p in model.named_parameters():
            module = name.rsplit(".", 1)[0]
            if any(fnmatch.fnmatchcase(module, pat) for pat in patterns):
                split += p.numel()
            else:
                whole += p.numel()
        buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    return {
        "split": split,
        "whole": whole,
        "parameter": (split // tp + whole) * dtype_bytes + buffers,
        "buffers": buffers,
    }


def _err(a: int, b: int | None) -> str:
    return "-" if not b else f"{100 * (a - b) / b:+.3f}%"


def small_rows(repeats: int) -> tuple[list[str], list[str]]:
    spec, args = SMALL
    bundle = resolve(spec, args)
    n_params = sum(p.numel() for p in bundle.build().parameters())
    rows, hand = [], []
    for tp, gpus, sharding in ((2, 2, "none"), (2, 4, "fsdp")):
        train = TrainSpec.of(gpus=gpus, tp=tp, sharding=sharding)
        answer, graph, secs = memgnn_answer(bundle, train, SMALL_SIZES)
        reals = [real_peaks(spec, args, SMALL_SIZES, gpus, tp) for _ in range(repeats)]
        real0 = min(r[0] for r in reals)
        cats = answer.breakdown["categories"]
        ours = answer.predicted_peak_bytes
        rows.append(
            f"| {spec} {args} ({n_params:,} params) | {SMALL_SIZES} | {tp} | {gpus} | "
            f"{sharding} | {ours:,} | {real0:,} | {ours - real0:+,} | {_err(ours, real0)} | "
            f"{[min(r[k] for r in reals) for k in range(gpus)]} | {cats.get('comm', 0):,} | "
            f"{secs:.1f} |"
        )
        log.info("%s", rows[-1])
        if sharding == "none":  # state by hand: a steady step with kept (zeroed) gradients
            steady = TrainSpec.of(gpus=gpus, tp=tp, steps="steady", set_to_none=False)
            _, graph, _ = memgnn_answer(bundle, steady, SMALL_SIZES)
            h = hand_bytes(bundle, tp, 4)
            got = {c: initial_bytes(graph, c) for c in ("parameter", "gradient", "optimizer_state")}
            n_tensors = sum(1 for _ in bundle.build().parameters())
            weights = h["parameter"] - h["buffers"]
            hand.append(
                f"Hand check, {spec} {args} at --tp {tp} (`--steps steady --zero-grad zero`: "
                f"the state alive before a steady step): split linears {h['split']:,} params, "
                f"the rest {h['whole']:,}. Parameters = 4 x ({h['split']:,} / {tp} + "
                f"{h['whole']:,}) + {h['buffers']:,} B buffers = {h['parameter']:,} B, memgnn "
                f"{got['parameter']:,} B; gradients = the weights' {weights:,} B, memgnn "
                f"{got['gradient']:,} B; AdamW state = 2 x {weights:,} + a 4-byte step per "
                f"tensor ({n_tensors}) = {2 * weights + 4 * n_tensors:,} B, memgnn "
                f"{got['optimizer_state']:,} B."
            )
    return rows, hand


def catalog_rows(model: str, sizes: dict[str, int], device: str) -> list[str]:
    bundle = resolve(model, {})
    out = []
    for tp in (1, 2):
        train = TrainSpec.of(precision="bf16", gpus=tp, tp=tp, optimizer_impl="for-loop")
        answer, graph, secs = memgnn_answer(bundle, train, sizes, device)
        cats = answer.breakdown["categories"]
        h = hand_bytes(bundle, tp, 2)
        got = initial_bytes(graph, "parameter")
        out.append(
            f"| {model} | {sizes} | {tp} | {answer.predicted_peak_bytes / 2**30:.2f} | "
            + " | ".join(
                f"{cats.get(c, 0) / 2**30:.2f}"
                for c in ("parameter", "gradient", "optimizer_state", "activation", "comm")
            )
            + f" | {got:,} | {h['parameter']:,} | {secs:.0f} |"
        )
        log.info("%s", out[-1])
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="skip the catalog model")
    ap.add_argument("--repeats", type=int, default=2, help="real gloo runs (each rank's lowest)")
    ap.add_argument("--model", default="hf:meta-llama/Llama-3.1-8B")
    ap.add_argument("--device", default="h100-80gb")
    a = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(1)
    rows, hand = small_rows(a.repeats)
    lines = [
        "# Tensor parallelism per rank (rank 0, tensor bytes, allocated)",
        "",
        f"`python benchmarks/tensor_parallel.py --repeats {a.repeats}` (torch "
        f"{torch.__version__}). Training: AdamW (for-loop), fp32, 2 steps (first + steady). "
        "memgnn: one symbolic capture of rank 0 over a fake process group, evaluated at the "
        "sizes on `--device cpu`. real gloo: the same job on CPU, one process per rank, plain "
        "PyTorch `parallelize_module` with ColwiseParallel/RowwiseParallel from the config's "
        "base_model_tp_plan (+ `fully_shard` per block and root over dp for 2-D), "
        "torch.profiler allocator events, each rank's lowest over the runs.",
        "",
        "| model | sizes | tp | gpus | sharding | memgnn rank 0 | real rank 0 | diff B | err "
        "| real, each rank | memgnn comm | capture s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        NOTE,
        "",
        *hand,
    ]
    if not a.quick:
        sizes = {"B": 1, "S": 4096}
        lines += [
            "",
            f"## {a.model}, bf16 weights and AdamW state, {a.device}, --tp 1 vs --tp 2",
            "",
            f"`memgnn predict --model {a.model} --precision bf16 --optimizer-impl for-loop "
            f"--gpus 2 --tp 2 --device {a.device} --batch 1 --seq 4096` (and --gpus 1 --tp 1), "
            "what `benchmarks/tensor_parallel.py` runs. GiB at the peak; the parameter bytes "
            "before the step next to the hand formula (split linears / tp + the rest whole). "
            "`--optimizer-impl for-loop`: under --tp alone the split linears' weights are "
            "DTensors and the rest plain tensors, which torch.optim's foreach/fused kernels "
            "(the CUDA default) refuse, in a real job as in memgnn (a UserError says so).",
            "",
            "| model | sizes | tp | peak GiB | parameter | gradient | optimizer_state | "
            "activation | comm | params before step, B | by hand, B | capture s |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
            *catalog_rows(a.model, sizes, a.device),
        ]
    OUT.mkdir(exist_ok=True)
    (OUT / "tensor_parallel.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
