"""Per-rank peak under DDP / FSDP2 / FSDP1: memgnn against its peers, side by side.

- memgnn: one symbolic capture of rank 0 over a fake process group (predictor/emulate/parallel.py),
  evaluated at the run's sizes on the `cpu` device (tensor bytes, allocated).
- FSDPMemTracker: PyTorch's `torch.distributed._tools.fsdp2_mem_tracker` on the same fake
  run (fake tensors, fake process group, the same TrainingStep), FSDP2 only; for FSDP1 its
  base, `torch.distributed._tools.mem_tracker.MemTracker`, on the same fake run.
- real gloo: a real 2-process run on CPU over gloo, plain PyTorch (`DistributedDataParallel`
  with its built-in all-reduce and bucket rebuild; `fully_shard` per block and root; FSDP1
  `FullyShardedDataParallel` with a ModuleWrapPolicy on the block class), its
  peak live bytes per rank read from torch.profiler's CPU allocator events (profile_memory)
  over the two training steps; rank 0's figure.

    .venv/bin/python benchmarks/sharding.py [--quick]   # writes benchmarks/results/sharding.md
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
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
from memgnn.predictor.capture.step import TrainingStep, build_optimizer
from memgnn.predictor.emulate.parallel import fake_world
from memgnn.predictor.ir.vocab import CATEGORIES
from memgnn.predictor.memory.analytic import AnalyticModel, live_curve
from memgnn.predictor.memory.base import Query
from memgnn.predictor.spec.bundle import default_blocks
from memgnn.predictor.spec.train import TrainSpec
from memgnn.predictor.zoo.resolve import resolve
from memgnn.serving.client import free_port

OUT = Path(__file__).parent / "results"
SMALL = ("llama", {"layers": "4", "hidden": "128", "ffn": "344", "vocab": "2048"})
SMALL_SIZES = {"B": 2, "S": 64}
CATALOG = ("hf:TinyLlama/TinyLlama-1.1B-Chat-v1.0", {})
CATALOG_SIZES = {"B": 1, "S": 256}
log = logging.getLogger("sharding")


def memgnn_peak(bundle, train: TrainSpec, sizes) -> tuple[int, int, dict, float, Any]:
    """(memgnn's answer for a CPU gloo run, its schedule's peak over the fake process group
    (no gloo staging inside collectives: what FSDPMemTracker sees), categories, seconds)."""
    t0 = time.perf_counter()
    graph = capture(bundle, train, CaptureConfig(target="cpu"))
    secs = time.perf_counter() - t0
    p = AnalyticModel().predict(graph, [Query(sizes=sizes, device="cpu")])[0]
    resolved = graph.resolve_sizes(sizes)
    scratch = graph.scratch_bytes(0, resolved).copy()
    ops = graph.paths[0].nodes["op"]
    scratch[[k for k, op in enumerate(ops) if op.startswith("c10d.")]] = 0
    initial, live = live_curve(graph, 0, graph.storage_bytes(0, resolved), scratch)
    fake = max(initial, int(live.max()))
    return p.predicted_peak_bytes, fake, p.breakdown["categories"], secs, graph


def tracker_peak(bundle, train: TrainSpec, sizes) -> int:
    """FSDPMemTracker's peak (FSDP2), MemTracker's (FSDP1) over the fake run."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import MemTracker

    with fake_world(train) as world, FakeTensorMode(allow_non_fake_inputs=True):
        step = TrainingStep(
            bundle, train, device=torch.device("cpu"), target="cpu", fake=True, world=world
        )
        if train.parallel.sharding == "fsdp1":
            tracker = MemTracker()
            tracker.track_external(step.model, step.optimizer)
        else:
            tracker = FSDPMemTracker(step.model, step.optimizer)
        with tracker:
            step.run(sizes, steps=(0,))
            tracker.reset_mod_stats()
            step.run(sizes, steps=(1,))
        peak = tracker.get_tracker_snapshot("peak")
    return max(dev["Total"] for dev in peak.values())


def accum_tracker_peak(bundle, train: TrainSpec, sizes) -> int:
    """FSDPMemTracker over both steps, module stats reset before each micro-step (it takes
    one forward per module at a time; its peak survives the reset)."""
    from memgnn.predictor.capture.step import NullObserver
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

    class Reset(NullObserver):
        def on_phase(self, phase: str, step: int, micro: int) -> None:
            if phase == "input":
                tracker.reset_mod_stats()

    with fake_world(train) as world, FakeTensorMode(allow_non_fake_inputs=True):
        step = TrainingStep(
            bundle, train, device=torch.device("cpu"), target="cpu", fake=True, world=world
        )
        tracker = FSDPMemTracker(step.model, step.optimizer)
        with tracker:
            step.run(sizes, Reset())
        peak = tracker.get_tracker_snapshot("peak")
    return max(dev["Total"] for dev in peak.values())


def _real_rank(
    rank: int, world: int, port: int, spec, args, sharding: str, sizes, out: str,
    accum: int = 1, sync: str = "every",
):  # fmt: skip
    """One rank of a real gloo job: plain PyTorch wrapping, profiler memory events. With
    `accum` > 1, that many micro-steps per step; `sync="last"`: all but the last without
    gradient sync (DDP `no_sync()`, FSDP2 `set_requires_gradient_sync(False)`)."""
    from torch.profiler import ProfilerActivity, profile, record_function

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    bundle = resolve(spec, args)
    train = TrainSpec()  # the single-process pieces: optimizer, inputs, loss
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        model = bundle.build()
        model.train()
        if sharding == "ddp":
            from torch.nn.parallel import DistributedDataParallel

            model = DistributedDataParallel(model)
        elif sharding == "fsdp1":  # accelerate's TRANSFORMER_BASED_WRAP, PyTorch's defaults
            from torch.distributed.fsdp import FullyShardedDataParallel
            from torch.distributed.fsdp.wrap import ModuleWrapPolicy

            blocks = (bundle.blocks or default_blocks)(model)
            policy = ModuleWrapPolicy({type(b) for b in blocks})
            model = FullyShardedDataParallel(
                model, auto_wrap_policy=policy, device_id=torch.device("cpu")
            )
        else:
            from torch.distributed.fsdp import fully_shard

            for block in (bundle.blocks or default_blocks)(model):
                fully_shard(block)
            fully_shard(model)
        opt = build_optimizer([p for p in model.parameters() if p.requires_grad], train, "cpu")
        with record_function("steps"):
            for _ in range(2):
                for micro in range(accum):
                    synced = sync == "every" or micro == accum - 1
                    if sharding not in ("ddp", "fsdp1"):
                        model.set_requires_gradient_sync(synced)
                    unsynced = sharding in ("ddp", "fsdp1") and not synced
                    with model.no_sync() if unsynced else contextlib.nullcontext():
                        loss = bundle.loss(
                            model, bundle.make_inputs(sizes, torch.device("cpu"), torch.float32)
                        )
                        (loss / accum).backward()
                    del loss
                opt.step()
                opt.zero_grad(set_to_none=True)
    peak = profiler_peak(prof, region="steps")
    Path(out, f"rank{rank}.json").write_text(json.dumps({"peak": peak}))
    dist.destroy_process_group()


def real_peak(
    spec, args, sharding: str, sizes, world: int = 2, accum: int = 1, sync: str = "every"
) -> list[int]:
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(
            _real_rank,
            args=(world, port, spec, args, sharding, sizes, tmp, accum, sync),
            nprocs=world,
            join=True,
            start_method="spawn",
        )
        return [json.loads(Path(tmp, f"rank{r}.json").read_text())["peak"] for r in range(world)]


def _hand_check(spec: str, bundle, graph, gpus: int, flat: bool = False) -> str:
    """Rank 0's parameter bytes before the step against ceil(dim0 / N) rows per tensor
    (FSDP2), or ceil(numel / N) of each block's and the root's flat parameter (FSDP1)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        model = bundle.build()
        shapes = [tuple(p.shape) for p in model.parameters()]
        buffers = sum(b.numel() * b.element_size() for b in model.buffers())
        units = [sum(p.numel() for p in b.parameters()) for b in default_blocks(model)]
    total = sum(math.prod(s) for s in shapes)
    if flat:
        units.append(total - sum(units))
        shards = sum(-(-n // gpus) * 4 for n in units) + buffers
        how = "sum over flat parameters (each block, the root) of ceil(numel/N) x 4 B"
    else:
        shards = sum(-(-s[0] // gpus) * math.prod(s[1:]) * 4 for s in shapes) + buffers
        how = "sum over tensors of ceil(dim0/N) x rest x 4 B"
    p = graph.paths[0]
    nbytes = graph.storage_bytes(0, graph.resolve_sizes(graph.symbols))
    code = CATEGORIES.index("parameter")
    got = sum(
        int(nbytes[u])
        for u in range(p.num_storages)
        if p.storages["category"][u] == code and p.storages["alloc"][u] == -1
    )
    return (
        f"Hand check, {spec} at {gpus} ranks: P = {total:,} parameters, 4P/N = "
        f"{4 * total // gpus:,} B; {how} + buffers = {shards:,} B; memgnn's rank-0 "
        f"{'FSDP1' if flat else 'FSDP2'} parameter bytes before the step = {got:,} B."
    )


def _err(a: int, b: int | None) -> str:
    return "-" if not b else f"{100 * (a - b) / b:+.2f}%"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="skip the catalog model")
    ap.add_argument("--repeats", type=int, default=3, help="real gloo runs (rank 0's lowest)")
    ap.add_argument(
        "--accum",
        action="store_true",
        help="only gradient accumulation without sync -> results/sharding_accum.md",
    )
    a = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(1)
    if a.accum:
        return accum_main()
    rows = []
    spec, args = SMALL
    bundle = resolve(spec, args)
    n_params = sum(p.numel() for p in bundle.build().parameters())
    hand = []
    for sharding, gpus in (("fsdp", 2), ("fsdp1", 2), ("ddp", 2), ("fsdp", 8), ("fsdp1", 8)):
        train = TrainSpec.of(gpus=gpus, sharding=sharding)
        ours, fake, cats, secs, _ = memgnn_peak(bundle, train, SMALL_SIZES)
        tracker = tracker_peak(bundle, train, SMALL_SIZES) if sharding != "ddp" else None
        real = None
        if gpus == 2:  # gloo sometimes overlaps a staging copy: the lowest of the runs
            real = min(real_peak(spec, args, sharding, SMALL_SIZES)[0] for _ in range(a.repeats))
        rows.append((f"{spec} {args} ({n_params:,} params)", SMALL_SIZES, sharding, gpus,
                     ours, fake, tracker, real, cats, secs))  # fmt: skip
        log.info("%s", rows[-1])
    if not a.quick:
        spec, args = CATALOG
        bundle = resolve(spec, args)
        for sharding in ("fsdp", "fsdp1"):
            train = TrainSpec.of(gpus=8, sharding=sharding)
            ours, fake, cats, secs, graph = memgnn_peak(bundle, train, CATALOG_SIZES)
            tracker = tracker_peak(bundle, train, CATALOG_SIZES)
            rows.append((spec, CATALOG_SIZES, sharding, 8, ours, fake, tracker, None, cats, secs))
            log.info("%s", rows[-1])
            hand.append(_hand_check(spec, bundle, graph, 8, flat=sharding == "fsdp1"))
    lines = [
        "# Per-rank peak under DDP / FSDP2 / FSDP1 (rank 0, tensor bytes, allocated, cpu)",
        "",
        f"`python benchmarks/sharding.py --repeats {a.repeats}` (torch {torch.__version__}). "
        "Training: AdamW (for-loop), fp32, 2 steps (first + steady). memgnn: one symbolic "
        "capture, evaluated at the sizes. tracker: PyTorch's FSDPMemTracker (fsdp = FSDP2) or "
        "MemTracker (fsdp1 = FSDP1 FullyShardedDataParallel, FULL_SHARD, a unit per block) on "
        "the same fake run. real gloo: 2 processes on CPU, torch.profiler allocator events, "
        "rank 0, the lowest of the runs (gloo's worker thread sometimes frees a staging copy "
        "after the next allocations: one buffer more, at random).",
        "",
        "memgnn (fake pg) is the same schedule without gloo's staging copy inside a "
        "collective (the fake process group stages nothing); memgnn (gloo) is the answer for "
        "a CPU run (`--device cpu`), which counts it.",
        "",
        "| model | sizes | sharding | gpus | memgnn (fake pg) | tracker | err "
        "| memgnn (gloo) | real gloo | err | memgnn comm | capture s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for model, sizes, sharding, gpus, ours, fake, tracker, real, cats, secs in rows:
        lines.append(
            f"| {model} | {sizes} | {sharding} | {gpus} | {fake:,} | "
            f"{'-' if tracker is None else f'{tracker:,}'} | {_err(fake, tracker)} | "
            f"{ours:,} | {'-' if real is None else f'{real:,}'} | {_err(ours, real)} | "
            f"{cats.get('comm', 0):,} | {secs:.1f} |"
        )
    lines += ["", *hand]
    OUT.mkdir(exist_ok=True)
    (OUT / "sharding.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def accum_main() -> int:
    """--grad-sync last vs every at G=2 on 2 ranks: memgnn next to FSDPMemTracker (fsdp)
    and a real gloo run doing the same accumulation."""
    spec, args = SMALL
    bundle = resolve(spec, args)
    n_params = sum(p.numel() for p in bundle.build().parameters())
    lines = [
        "# Gradient accumulation without sync, per rank (rank 0, tensor bytes, allocated, cpu)",
        "",
        "`python benchmarks/sharding.py --accum` (torch " + torch.__version__ + "). "
        f"{spec} {args} ({n_params:,} params), sizes {SMALL_SIZES}, AdamW (for-loop), fp32, "
        "2 steps of G=2 micro-steps on 2 ranks. `last`: the first micro-step of each step "
        "without gradient sync (DDP no_sync(), FSDP2 set_requires_gradient_sync(False)); "
        "`every`: both synced. Columns as in sharding.md. By hand, FSDP `last` keeps the "
        f"whole unsharded gradient: + 4P - 4P/2 = {2 * n_params:,} B over `every`, less "
        "padding.",
        "",
        "| sharding | grad sync | memgnn (fake pg) | FSDPMemTracker | err | memgnn (gloo) "
        "| real gloo | err | memgnn gradient | capture s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for sharding in ("fsdp", "ddp"):
        for sync in ("every", "last"):
            train = TrainSpec.of(gpus=2, sharding=sharding, grad_accum=2, grad_sync=sync)
            ours, fake, cats, secs, _ = memgnn_peak(bundle, train, SMALL_SIZES)
            fsdp = sharding == "fsdp"
            tracker = accum_tracker_peak(bundle, train, SMALL_SIZES) if fsdp else None
            shown = "-" if tracker is None else f"{tracker:,}"
            real = real_peak(spec, args, sharding, SMALL_SIZES, accum=2, sync=sync)[0]
            lines.append(
                f"| {sharding} | {sync} | {fake:,} | {shown} | "
                f"{_err(fake, tracker)} | {ours:,} | {real:,} | {_err(ours, real)} | "
                f"{cats.get('gradient', 0):,} | {secs:.1f} |"
            )
            log.info("%s", lines[-1])
    OUT.mkdir(exist_ok=True)
    (OUT / "sharding_accum.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
