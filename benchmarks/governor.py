"""The memory governor against a static batch and OOM back-off, on a variable-length workload.

A causal LM (zoo `varlen`) trains on a stream of sequences with long-tail lengths
(log-normal, median 56, clipped to [8, 512]) on a capped emulated device
(`serving.governor.devices.EmulatedDevice`: every storage the step creates goes through the
CUDA caching-allocator simulator, OOMs raised where the device would raise them). Two
workloads (`--workload`):

- `150m` (the default, `results/governor.{json,md}`): 154,361,856 parameters (hidden 1024,
  16 heads, ffn 4096, 4 layers, GPT-2's 50,257-token vocabulary), fp32 AdamW, a 16 GiB
  device, the step executed on fake tensors (`execute="fake"`: the real CPU step's kernel
  choices and storages, byte for byte, without running a kernel).
- `tiny` (`results/governor_tiny.{json,md}`): the 2-layer `TINY_VARLEN`, real CPU kernels,
  every byte counted 256 times on a 1 GiB device.

The same stream, four ways (the governor and the oracle over `--samples` samples, each
baseline for `--steps` optimizer steps over the same stream's prefix; rates compare, not
totals):

- static: Lightning-style power finder (B = 2, 4, 8, ... for 3 trial steps on the first 3
  batches, keep the last B that did not OOM), then fixed batches of B in stream order,
  padded to each batch's longest; a batch that OOMs is skipped (its samples are lost).
- backoff: accelerate-style `find_executable_batch_size` (start at 128, x0.9 on every OOM),
  generously retrying the failed samples at the smaller size; a sample that OOMs even alone
  is skipped (accelerate raises "no executable batch size" there) and counted lost.
- governor: `MemoryGovernor.batches` (token-budget batches per length bucket) + `step`,
  the default configuration (doubling, then bisection: any micro-batch size) and
  `--variants` more: `power-of-two` (`mode="power", power_of_two=True`, the default before).
- oracle: the same bucketed batches with, per bucket and checkpointing choice, the largest
  B whose exact peak fits a budget (the captured step replayed through the allocator
  simulator, fresh cache), choosing the faster config; not run, only timed. Two budgets:
  the governor's own (its default threshold, 85% of the device: the oracle differs from
  the governor only in knowing every exact peak; the headline ratio) and the whole device
  (which also charges the governor for the headroom its threshold keeps).

Throughput = real (unpadded) tokens per second of emulated device time, with
t(step) = sum over micro-batches of (T_MICRO + T_TOKEN x padded tokens x (1 + recompute))
+ T_OPT, recompute = 1/3 x checkpointed fraction (`predictor.plan.space.RECOMPUTE_COST`); an
attempt that OOMs costs a full step. Tokens per step are reported too (no time model).

    .venv/bin/python benchmarks/governor.py      # minutes: benchmarks/results/governor.{json,md}
    .venv/bin/python benchmarks/governor.py --workload tiny     # -> governor_tiny.{json,md}
    .venv/bin/python benchmarks/governor.py --samples 3000 --steps 300 --no-write  # a look
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import statistics
import sys
import tempfile
import time
from collections import deque
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from memgnn.predictor.capture.cache import capture_cached  # noqa: E402
from memgnn.predictor.capture.step import build_optimizer  # noqa: E402
from memgnn.predictor.plan.space import RECOMPUTE_COST  # noqa: E402
from memgnn.predictor.sim.allocator import AllocatorConfig  # noqa: E402
from memgnn.predictor.sim.simulate import build_trace, replay_trace  # noqa: E402
from memgnn.predictor.spec.devices import get_profile  # noqa: E402
from memgnn.predictor.spec.train import TrainSpec  # noqa: E402
from memgnn.serving.governor import (  # noqa: E402
    BatchingConfig,
    EmulatedDevice,
    GovernorConfig,
    MemoryGovernor,
    PolicyConfig,
)
from memgnn.serving.governor.batching import LengthBuckets, TokenBatcher, pad_collate  # noqa: E402
from memgnn.serving.governor.demo import long_tail_samples, tiny_varlen_bundle  # noqa: E402
from memgnn.serving.governor.runtime import CheckpointToggles  # noqa: E402
from results_io import write_results  # noqa: E402

CACHE = Path(tempfile.gettempdir()) / "memgnn-governor-bench"
MiB, GiB = 1 << 20, 1 << 30
MAX_LEN = 512
TRAIN = TrainSpec.of(optimizer="adamw", optimizer_impl="foreach")
T_MICRO, T_TOKEN, T_OPT = 1.0e-3, 5.0e-6, 2.0e-3  # seconds
log = logging.getLogger("benchmarks.governor")


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    hparams: dict[str, int]  # zoo `varlen`
    capacity: int  # device bytes
    scale: int  # bytes counted per tensor byte
    execute: str  # EmulatedDevice(execute=): cpu (real kernels) | fake (no kernels)
    stem: str  # results file name

    def bundle(self) -> Any:
        return tiny_varlen_bundle(**self.hparams)

    def device(self) -> EmulatedDevice:
        return EmulatedDevice(self.capacity, byte_scale=self.scale, execute=self.execute)

    @property
    def n_blocks(self) -> int:
        return self.bundle().hparams["layers"]


WORKLOADS = {
    # a GPT-2-medium-wide LM, 4 layers, GPT-2's vocabulary: 154M parameters, fp32 AdamW, on
    # a 16 GiB device, executed on fake tensors (the real step's storages, no kernels)
    "150m": Workload(
        name="150m",
        hparams={"hidden": 1024, "heads": 16, "ffn": 4096, "layers": 4, "vocab": 50257},
        capacity=16 * GiB,
        scale=1,
        execute="fake",
        stem="governor",
    ),
    # the 2-layer tiny LM (`TINY_VARLEN`), real CPU kernels, every byte counted 256 times:
    # 4 MiB of its bytes, x 256
    "tiny": Workload(
        name="tiny",
        hparams={},
        capacity=1024 * MiB,
        scale=256,
        execute="cpu",
        stem="governor_tiny",
    ),  # fmt: skip
}


def step_time(micro: list[int], seq: int, recompute: float) -> float:
    return sum(T_MICRO + T_TOKEN * b * seq * (1 + recompute) for b in micro) + T_OPT


def recompute_of(ckpt: str, n_blocks: int) -> float:
    if ckpt == "none":
        return 0.0
    blocks = n_blocks if ckpt == "full" else min(int(ckpt.split(":")[1]), n_blocks)
    return RECOMPUTE_COST * blocks / n_blocks


def stream(n: int):
    return long_tail_samples(n, seed=0, median=56.0, sigma=0.8, lo=8, hi=MAX_LEN)


class Plain:
    """A plain training loop on a fresh emulated device; `step` returns False on OOM."""

    def __init__(self, w: Workload) -> None:
        torch.manual_seed(0)
        self.bundle = w.bundle()
        self.device = w.device()
        with self.device:
            self.model = self.bundle.build()
            self.opt = build_optimizer(list(self.model.parameters()), TRAIN, "cpu")

    def step(self, batch: dict[str, torch.Tensor]) -> bool:
        try:
            micro = self.device.transfer(batch)
            with self.device:
                self.bundle.loss(self.model, micro).backward()
                self.opt.step()
                self.opt.zero_grad(set_to_none=True)
            return True
        except torch.OutOfMemoryError:
            pass
        self.opt.zero_grad(set_to_none=True)
        self.device.recover()
        return False


def _batch(group: list[Any]) -> dict[str, torch.Tensor]:
    return pad_collate(group, max(int(s["input_ids"].shape[0]) for s in group))


def _summary(name: str, steps: list[dict], n: int, lost: int, ooms: int, wall: float) -> dict:
    """`steps`: every attempt (a failed one has no samples but costs its time)."""
    done = [s for s in steps if s["samples"]]
    tokens = sum(s["tokens"] for s in done)
    padded = sum(s["padded"] for s in done)
    dev_s = sum(s["time"] for s in steps)
    return {
        "method": name,
        "optimizer_steps": len(done),
        "ooms": ooms,
        "samples": sum(s["samples"] for s in done) + lost,  # consumed from the stream
        "samples_trained": sum(s["samples"] for s in done),
        "samples_lost": lost,
        "real_tokens": tokens,
        "tokens_per_step": tokens / max(len(done), 1),
        "padded_tokens_per_step": padded / max(len(done), 1),
        "padding_fraction": 1 - tokens / padded if padded else 0.0,
        "device_seconds": dev_s,
        "throughput_tokens_per_s": tokens / dev_s if dev_s else 0.0,
        "wall_seconds": round(wall, 1),
    }


def _record(w: Workload, group_or_batch: dict, micro: list[int], ckpt: str = "none"):
    lengths = group_or_batch["lengths"]
    seq = int(group_or_batch["input_ids"].shape[1])
    return {
        "samples": int(lengths.shape[0]),
        "tokens": int(lengths.sum()),
        "padded": int(lengths.shape[0]) * seq,
        "time": step_time(micro, seq, recompute_of(ckpt, w.n_blocks)),
    }


def _failed(rec: dict) -> dict:
    return {**rec, "samples": 0, "tokens": 0, "padded": 0}


def run_static(w: Workload, n: int, max_steps: int) -> dict:
    t0 = time.perf_counter()
    head = [s for _, s in zip(range(3 * 8192), stream(n))]
    finder, b, found, trials = Plain(w), 2, 0, 0
    while b <= 8192 and 3 * b <= len(head):
        trials += 1
        if not all(finder.step(_batch(head[i * b : (i + 1) * b])) for i in range(3)):
            break
        found, b = b, b * 2
    found = max(found, 1)
    trainer, steps, lost, ooms, group = Plain(w), [], 0, 0, []
    samples = iter(stream(n))
    while sum(1 for s in steps if s["samples"]) < max_steps:
        group = [s for _, s in zip(range(found), samples)]
        if not group:
            break
        batch = _batch(group)
        rec = _record(w, batch, [len(group)])
        if trainer.step(batch):
            steps.append(rec)
        else:  # a plain loop skips the batch that OOMed: its samples are lost
            ooms, lost = ooms + 1, lost + rec["samples"]
            steps.append(_failed(rec))
    out = _summary(
        "static (Lightning-style finder)", steps, n, lost, ooms, time.perf_counter() - t0
    )
    out.update(batch_size=found, finder_trials=trials)
    return out


def run_backoff(w: Workload, n: int, max_steps: int) -> dict:
    t0 = time.perf_counter()
    trainer, b, steps, ooms, lost = Plain(w), 128, [], 0, 0
    queue = deque(stream(n))
    while queue and len(steps) - ooms < max_steps:
        group = [queue.popleft() for _ in range(min(b, len(queue)))]
        batch = _batch(group)
        rec = _record(w, batch, [len(group)])
        if trainer.step(batch):
            steps.append(rec)
            continue
        ooms = ooms + 1
        steps.append(_failed(rec))
        if len(group) == 1:  # accelerate gives up at batch size 1: the sample is skipped
            lost += 1
            continue
        queue.extendleft(reversed(group))  # the same samples again, at 0.9 x B
        b = max(1, int(b * 0.9))
    out = _summary(
        "backoff (accelerate-style x0.9)", steps, n, lost, ooms, time.perf_counter() - t0
    )
    out.update(final_batch_size=b, start_batch_size=128)
    return out


def governor_config(variant: str) -> GovernorConfig:
    fine = {"mode": "binsearch", "power_of_two": False} if variant == "binsearch" else {}
    if variant == "power-of-two":
        fine = {"mode": "power", "power_of_two": True}
    return GovernorConfig(
        policy=PolicyConfig(**fine),
        batching=BatchingConfig(max_length=MAX_LEN),
        cache_dir=CACHE,
        prepare_all=True,
    )


def run_governor(w: Workload, n: int, variant: str = "default") -> dict:
    t0 = time.perf_counter()
    torch.manual_seed(0)
    gov = MemoryGovernor(
        w.bundle(),
        TRAIN,
        device=w.device(),
        config=governor_config(variant),
    )
    setup = time.perf_counter() - t0
    seen: list[int] = []
    steps = []
    for batch in gov.batches(stream(n)):
        rec = gov.step(batch)
        seen.extend(batch["sample_id"].tolist())
        chunks = [rec.micro_batch] * (rec.grad_accum - 1)
        chunks.append(rec.samples - sum(chunks))
        r = _record(w, batch, chunks, rec.checkpointing)
        steps.extend([_failed(r)] * rec.oom_retries)  # failed attempts: a full step each
        steps.append(r)
    s = gov.summary()
    lost = n - len(set(seen))
    out = _summary(f"governor ({variant})", steps, n, lost, s["ooms"], time.perf_counter() - t0)
    overhead = sorted(r.overhead_ms for r in gov.records)
    out.update(
        duplicates=len(seen) - len(set(seen)),
        overhead_ms_per_step=statistics.mean(overhead),
        overhead_ms_p50=overhead[len(overhead) // 2],
        overhead_ms_p99=overhead[int(len(overhead) * 0.99)],
        setup_seconds=round(setup, 1),
        rollbacks=s["rollbacks"],
        alerts=s["alerts"],
        correction=s["correction"],
        checkpointed_steps=sum(r.checkpointing != "none" for r in gov.records),
        split_steps=sum(r.grad_accum > 1 for r in gov.records),
        plans={k: [v["micro_batch"], v["checkpointing"]] for k, v in s["plans"].items()},
        predictions=s["model_calls"],
    )
    return out


def oracle_batch(graph, seq: int, *, budget: int, scale: int, hi: int = 4096) -> int:
    """Largest B whose step (first + steady) replays without OOM within `budget` bytes."""
    cpu = get_profile("cpu")
    cfg = AllocatorConfig(capacity_bytes=budget)

    def fits(b: int) -> bool:
        resolved = graph.resolve_sizes({"B": b, "S": seq})
        events = [
            (e[0], e[1], e[2] * scale) if e[0] == "alloc" else e
            for e in build_trace(graph, 0, resolved, cpu)
        ]
        return not replay_trace(events, cfg)["would_oom"]

    lo, up = 0, 1
    while up <= hi and fits(up):
        lo, up = up, up * 2
    while up - lo > 1:
        mid = (lo + up) // 2
        lo, up = (mid, up) if fits(mid) else (lo, mid)
    return lo


def run_oracle(w: Workload, n: int, fraction: float = 1.0) -> dict:
    t0 = time.perf_counter()
    budget = int(w.capacity * fraction)
    bundle = w.bundle()
    graphs = {
        c: capture_cached(
            bundle, TRAIN.with_options(checkpointing=c), target="cpu", directory=CACHE
        )
        for c in ("none", "full")
    }
    buckets = LengthBuckets(max_length=MAX_LEN)
    plan: dict[int, tuple[int, str]] = {}
    for seq in buckets.bounds:
        best = None
        for ckpt, graph in graphs.items():
            b = oracle_batch(graph, seq, budget=budget, scale=w.scale)
            rate = b / step_time([b], seq, recompute_of(ckpt, w.n_blocks)) if b else 0.0
            if b and (best is None or rate > best[0]):
                best = (rate, b, ckpt)
        plan[seq] = (best[1], best[2]) if best else (1, "full")
    steps = []
    for seq, group in TokenBatcher(buckets, lambda s: plan[s][0])(stream(n)):
        steps.append(_record(w, pad_collate(group, seq), [len(group)], plan[seq][1]))
    where = "full device" if fraction == 1.0 else f"{fraction:.0%} of the device"
    out = _summary(f"oracle (exact peaks, {where})", steps, n, 0, 0, time.perf_counter() - t0)
    out["plans"] = {str(k): list(v) for k, v in plan.items()}
    return out


def validate_oracle(
    w: Workload, plans: dict[str, list], buckets: tuple[int, ...] = (64, 240, 512)
) -> list:
    """Spot check: the oracle's batch runs on a fresh emulated device; one more OOMs."""
    out = []
    for seq in buckets:
        b, ckpt = plans[str(seq)]
        row = {"S": seq, "B": b, "checkpointing": ckpt}
        for extra in (0, 1):
            trainer = Plain(w)
            CheckpointToggles(list(trainer.model.blocks)).set(ckpt)
            ids = torch.randint(0, trainer.bundle.hparams["vocab"], (b + extra, seq))
            batch = {"input_ids": ids, "lengths": torch.full((b + extra,), seq)}
            row["fits" if extra == 0 else "fits_plus_one"] = trainer.step(batch) and trainer.step(
                batch
            )
        out.append(row)
    return out


def device_step_cost(steps: int = 3) -> dict:
    """Seconds per training step of a 3M-parameter varlen LM at B=16, S=336 on the emulated
    device, real CPU kernels vs fake execution, and the plain CPU step without the device:
    what the device adds, and what fake execution saves (median of `steps` after a warm-up)."""
    hp = {"hidden": 128, "heads": 4, "ffn": 512, "layers": 4, "vocab": 8192}
    bundle = tiny_varlen_bundle(**hp)
    out: dict[str, Any] = {"model": f"varlen {bundle.hparams}", "B": 16, "S": 336}
    for name in ("plain", "cpu", "fake"):
        torch.manual_seed(0)
        device = EmulatedDevice(8 * GiB, execute="cpu" if name == "plain" else name)
        ctx = contextlib.nullcontext() if name == "plain" else device
        with ctx:
            model = bundle.build()
            opt = build_optimizer(list(model.parameters()), TRAIN, "cpu")
        host = bundle.make_inputs({"B": 16, "S": 336}, torch.device("cpu"), torch.float32)
        times = []
        for _ in range(steps + 1):
            batch = host if name == "plain" else device.transfer(host)
            t0 = time.perf_counter()
            with contextlib.nullcontext() if name == "plain" else device:
                bundle.loss(model, batch).backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
            times.append(time.perf_counter() - t0)
        out[f"{name}_step_s"] = round(statistics.median(times[1:]), 3)
    with torch.device("meta"):
        out["parameters"] = sum(p.numel() for p in bundle.build().parameters())
    return out


def _job(args: tuple[Workload, str, int, int]) -> dict:
    torch.set_num_threads(1)
    w, name, n, max_steps = args
    if name == "static":
        return run_static(w, n, max_steps)
    if name == "backoff":
        return run_backoff(w, n, max_steps)
    return run_governor(w, n, name.split(":", 1)[1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", choices=sorted(WORKLOADS), default="150m")
    p.add_argument("--samples", type=int, default=16_000, help="the governor's stream")
    p.add_argument("--steps", type=int, default=2000, help="optimizer steps of each baseline")
    p.add_argument(
        "--variants",
        default="default,power-of-two",
        help="governor configurations: default, power-of-two (mode=power), binsearch",
    )
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--no-write", action="store_true")
    p.add_argument(
        "--step-cost", action="store_true", help="also time one step: plain, emulated, fake"
    )
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(name)s %(levelname)s %(message)s")
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    w = WORKLOADS[args.workload]
    oracle_full = run_oracle(w, args.samples)  # also captures the graphs every worker loads
    oracle = run_oracle(w, args.samples, PolicyConfig().threshold)  # the governor's budget
    MemoryGovernor(w.bundle(), TRAIN, device=w.device(), config=governor_config("default"))
    n, k = args.samples, args.steps
    jobs = [(w, f"governor:{v}", n, 0) for v in args.variants.split(",")]
    jobs += [(w, "static", n, k), (w, "backoff", n, k)]
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        results = list(pool.map(_job, jobs))
    for r in results:
        r["fraction_of_oracle_throughput"] = (
            r["throughput_tokens_per_s"] / oracle["throughput_tokens_per_s"]
        )
        r["fraction_of_oracle_tokens_per_step"] = r["tokens_per_step"] / oracle["tokens_per_step"]
        r["fraction_of_full_device_oracle_throughput"] = (
            r["throughput_tokens_per_s"] / oracle_full["throughput_tokens_per_s"]
        )
    oracle_full["fraction_of_oracle_throughput"] = (
        oracle_full["throughput_tokens_per_s"] / oracle["throughput_tokens_per_s"]
    )
    oracle_full["fraction_of_oracle_tokens_per_step"] = (
        oracle_full["tokens_per_step"] / oracle["tokens_per_step"]
    )
    with torch.device("meta"):
        parameters = sum(p.numel() for p in w.bundle().build().parameters())
    report = {
        "workload": {
            "name": w.name,
            "samples": args.samples,
            "lengths": "log-normal median 56, sigma 0.8, clipped to [8, 512]",
            "model": f"varlen {w.bundle().hparams}",
            "parameters": parameters,
            "train": TRAIN.flat(),
        },  # fmt: skip
        "device": {
            "capacity_bytes": w.capacity,
            "byte_scale": w.scale,
            "execute": w.execute,
            "allocator": "CUDA caching allocator simulator (predictor.sim.allocator), defaults",
        },  # fmt: skip
        "time_model": {
            "T_MICRO_s": T_MICRO,
            "T_TOKEN_s": T_TOKEN,
            "T_OPT_s": T_OPT,
            "recompute_full": RECOMPUTE_COST,
        },  # fmt: skip
        "oracle": oracle,
        "oracle_full_device": oracle_full,
        "oracle_validation": validate_oracle(w, oracle_full["plans"]),
        "device_step_cost": device_step_cost() if args.step_cost else None,
        "methods": results,
        "wall_seconds": round(time.perf_counter() - t0, 1),
        "torch": torch.__version__,
    }
    print(markdown(report))
    if not args.no_write:
        write_results(w.stem, report, markdown(report), default=str)
    return 0


def markdown(report: dict) -> str:
    w = report["workload"]
    lines = [
        "# Memory governor benchmark",
        "",
        f"{w['samples']} samples, lengths {w['lengths']}; model {w['model']}, "
        f"{w['parameters']:,} parameters; emulated device "
        f"{report['device']['capacity_bytes'] // MiB} MiB (byte scale "
        f"{report['device']['byte_scale']}, kernels: {report['device']['execute']}). "
        "Throughput: real tokens per emulated device second "
        f"(t = per micro-batch {T_MICRO * 1e3:g} ms + {T_TOKEN * 1e6:g} us per padded token x "
        f"(1 + recompute), + {T_OPT * 1e3:g} ms per optimizer step).",
        "",
        "Oracle: per length bucket, the largest batch whose exact peak fits the budget. "
        "Headline ratios are against the oracle with the governor's own budget (its 85% "
        "threshold); the last ratio column is against an oracle that may fill the whole device.",
        "",
        "| method | steps | OOMs | samples lost | tokens/step | padding | throughput vs oracle "
        "| tokens/step vs oracle | throughput vs full-device oracle "
        "| overhead ms/step (mean, p50) | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    full = report["oracle_full_device"]
    for r in [*report["methods"], report["oracle"], full]:
        ovh = (f"{r['overhead_ms_per_step']:.3f}, {r['overhead_ms_p50']:.3f}"
               if "overhead_ms_per_step" in r else "")  # fmt: skip
        frac = r.get("fraction_of_oracle_throughput", 1.0)
        tfrac = r.get("fraction_of_oracle_tokens_per_step", 1.0)
        ffrac = r.get(
            "fraction_of_full_device_oracle_throughput",
            r["throughput_tokens_per_s"] / full["throughput_tokens_per_s"],
        )
        lines.append(
            f"| {r['method']} | {r['optimizer_steps']} | {r['ooms']} | {r['samples_lost']} | "
            f"{r['tokens_per_step']:.0f} | {r['padding_fraction']:.0%} | {frac:.1%} | "
            f"{tfrac:.1%} | {ffrac:.1%} | {ovh} | {r['wall_seconds']} |"
        )
    lines += ["", f"Oracle spot check on fresh devices: {report['oracle_validation']}", ""]
    if report.get("device_step_cost"):
        c = report["device_step_cost"]
        lines += [
            f"One training step of {c['model']} ({c['parameters']:,} parameters) at B={c['B']}, "
            f"S={c['S']}: plain CPU {c['plain_step_s']} s, on the emulated device with real "
            f"kernels {c['cpu_step_s']} s, fake-executed {c['fake_step_s']} s (median of 3).",
            "",
        ]
    lines.append(f"Total wall time {report['wall_seconds']} s, torch {report['torch']}.")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
