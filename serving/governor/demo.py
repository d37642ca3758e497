"""A short governed training run for `memgnn demo`: variable-length batches, capped device.

A tiny causal LM (zoo `varlen`) trains on batches of 16 long-tail-length sequences, each
padded to its longest, on an emulated GPU (`EmulatedDevice`, every byte counted 64 times, so
the tiny model loads the device like a real one). Short batches fit whole; long ones would
not, and the governor splits them into micro-batches (gradient accumulation over the same
samples) or checkpoints blocks before they run. The result lists the decisions it made and
the OOMs it avoided: steps whose whole batch, at the user's configuration, was predicted
over the device's capacity.

The workload helpers live here too: `long_tail_samples` draws token sequences whose lengths
follow a clipped log-normal law (most short, a long tail up to `hi`), the workload where a
batch size found on the first batches OOMs hours later; `fixed_batches` is the naive loader
(consecutive samples, a fixed count per batch, padded to the longest); `TINY_VARLEN` is a
zoo `varlen` causal LM small enough to train thousands of steps on a CPU.
"""

from __future__ import annotations

import json
import logging
import math
import random
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from memgnn.predictor.spec.bundle import ModelBundle
from memgnn.predictor.spec.train import TrainSpec
from memgnn.predictor.zoo import make_bundle
from memgnn.serving.governor.batching import BatchingConfig, pad_collate, sample_length
from memgnn.serving.governor.config import GovernorConfig
from memgnn.serving.governor.core import MemoryGovernor
from memgnn.serving.governor.devices import EmulatedDevice

log = logging.getLogger(__name__)

# ---- workloads (also used by benchmarks/governor.py and the tests) ----------------------
TINY_VARLEN = {"hidden": 32, "heads": 2, "ffn": 64, "layers": 2, "vocab": 128}


def tiny_varlen_bundle(**overrides: Any) -> ModelBundle:
    return make_bundle("varlen", {**TINY_VARLEN, **overrides})


def long_tail_lengths(
    n: int, *, seed: int = 0, median: float = 56.0, sigma: float = 0.8, lo: int = 8, hi: int = 512
) -> list[int]:
    """n lengths, log-normal around `median`, clipped to [lo, hi]."""
    if n < 0 or lo < 1 or hi < lo or median <= 0 or sigma < 0:
        raise ValueError("need n >= 0, 1 <= lo <= hi, median > 0, sigma >= 0")
    rng = random.Random(seed)
    mu = math.log(median)
    return [min(hi, max(lo, int(rng.lognormvariate(mu, sigma)))) for _ in range(n)]


def long_tail_samples(
    n: int, *, vocab: int = TINY_VARLEN["vocab"], seed: int = 0, **lengths: Any
) -> Iterator[dict[str, Any]]:
    """Samples {"input_ids": 1-D LongTensor, "sample_id": int} with long-tail lengths."""
    gen = torch.Generator().manual_seed(seed)
    for i, length in enumerate(long_tail_lengths(n, seed=seed, **lengths)):
        yield {"input_ids": torch.randint(0, vocab, (length,), generator=gen), "sample_id": i}


def fixed_batches(samples: Iterable[Any], batch_size: int) -> Iterator[dict[str, torch.Tensor]]:
    """Consecutive samples, `batch_size` per batch, padded to each batch's longest."""
    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    group: list[Any] = []
    for s in samples:
        group.append(s)
        if len(group) == batch_size:
            yield pad_collate(group, max(sample_length(x) for x in group))
            group = []
    if group:
        yield pad_collate(group, max(sample_length(x) for x in group))


# ---- the demo run ---------------------------------------------------------------------

MiB = 1 << 20
DEMO_CAPACITY = 1536 * MiB
DEMO_SCALE = 64
DEMO_BATCH = 16


def demo_governed_run(out_dir: Path, steps: int = 200) -> dict[str, Any]:
    """Run `steps` governed optimizer steps; write `governor_demo.json` in `out_dir`."""
    if steps < 1:
        raise ValueError("steps must be >= 1")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny kernels: one thread beats two on a shared CPU
    try:
        return _run(out_dir, steps)
    finally:
        torch.set_num_threads(threads)


def _run(out_dir: Path, steps: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    torch.manual_seed(0)
    device = EmulatedDevice(DEMO_CAPACITY, byte_scale=DEMO_SCALE)
    gov = MemoryGovernor(
        tiny_varlen_bundle(),
        TrainSpec.of(optimizer_impl="foreach"),
        device=device,
        config=GovernorConfig(
            batching=BatchingConfig(max_length=512), cache_dir=out_dir / "graphs", prepare_all=True
        ),
    )
    setup_s = time.perf_counter() - t0
    samples = long_tail_samples(steps * DEMO_BATCH, hi=512, seed=7)
    decisions: list[dict[str, Any]] = []
    last: dict[int | None, tuple] = {}
    for batch in fixed_batches(samples, DEMO_BATCH):
        rec = gov.step(batch)
        choice = (rec.micro_batch, rec.grad_accum, rec.checkpointing, rec.precision)
        if last.get(rec.bucket) != choice:
            last[rec.bucket] = choice
            decisions.append(
                {
                    "step": rec.step,
                    "padded_length_bucket": rec.bucket,
                    "batch": rec.samples,
                    "micro_batch": rec.micro_batch,
                    "grad_accum": rec.grad_accum,
                    "checkpointing": rec.checkpointing,
                    "bound_bytes": rec.bound_bytes,
                }
            )
    summary = gov.summary()
    records = list(gov.records)
    result = {
        "device": {
            "kind": "emulated",
            "capacity_bytes": DEMO_CAPACITY,
            "byte_scale": DEMO_SCALE,
            "limit_bytes": gov.limit,
        },  # fmt: skip
        "model": "varlen " + json.dumps(gov.bundle.hparams, sort_keys=True),
        "steps": summary["steps"],
        "samples": summary["samples"],
        "tokens": summary["tokens"],
        "ooms": summary["ooms"],
        "rollbacks": summary["rollbacks"],
        "ooms_avoided": summary["ooms_avoided"],
        "split_steps": sum(r.grad_accum > 1 for r in records),
        "checkpointed_steps": sum(r.checkpointing != "none" for r in records),
        "peak_measured_allocated_bytes": max(r.measured_allocated_bytes or 0 for r in records),
        "decisions": decisions,
        "correction": summary["correction"],
        "alerts": summary["alerts"],
        "overhead_ms_per_step": round(summary["overhead_ms_per_step"], 3),
        "setup_seconds": round(setup_s, 2),
        "seconds": round(time.perf_counter() - t0, 2),
    }
    (out_dir / "governor_demo.json").write_text(json.dumps(result, indent=2))
    log.info(
        "governed run: %d steps, %d samples on a %d MiB emulated device: %d OOMs avoided "
        "(whole batch predicted over capacity), %d steps split into micro-batches, "
        "%d OOMs, %.3f ms governor overhead per step",
        result["steps"],
        result["samples"],
        DEMO_CAPACITY // MiB,
        result["ooms_avoided"],
        result["split_steps"],
        result["ooms"],
        result["overhead_ms_per_step"],
    )
    for d in decisions:
        log.info(
            "step %4d  length<=%-4s batch %2d -> %2d x %d  checkpointing=%s",
            d["step"],
            d["padded_length_bucket"],
            d["batch"],
            d["micro_batch"],
            d["grad_accum"],
            d["checkpointing"],
        )
    return result
