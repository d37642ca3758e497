"""Build the corpus the shipped model trains on: all 14 zoo families, sim + cpu backends.

    .venv/bin/python -m training.make_corpus --out corpus/ [--configs 8] [--workers 2]

A stand-in for `memgnn dataset build` (dataset/build.py) until it lands; it writes the same
format through `dataset.corpus.CorpusWriter`. For each family it samples model hparams and
training configs (precision, optimizer, implementation, checkpointing, accumulation), a
few input sizes per config and GPU device profiles, then records:

- `sim` rows: the same computation as `dataset.profile.profile(backend="sim")` (a concrete
  capture at the sizes, replayed through the allocator simulator per device), with the
  concrete capture shared between devices whose kernel choice agrees (sm < 80 / sm >= 80;
  `tests/training/test_make_corpus.py` checks the rows equal `profile()`'s);
- `cpu` rows: `profile(backend="cpu")`, a real CPU step, on small configs.

Each row's `graph_id` names the symbolic capture (`capture_cached`, target cuda or cpu) in
the corpus graph store: the graph the predictor sees. Job ids are deterministic, so an
interrupted build re-run with the same arguments skips what is done.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import random
import shutil
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

GPU_GROUPS = {  # devices whose captured step is the same (kernel choice depends on sm >= 80)
    80: ("a100-80gb", "h100-80gb", "a100-40gb", "l4-24gb", "h200-141gb"),
    70: ("v100-32gb", "t4-16gb", "v100-16gb"),
}
CONV_FAMILIES = ("resnet", "unet")  # the capture carries a guard B < 16
SMALL_HPARAMS = {  # cpu-backend caps: a real step must take about a second
    "layers": 2, "hidden": 192, "vocab": 4096, "ffn": 512, "image": 64, "features": 784,
    "classes": 100, "width": 32, "depth": 3, "blocks": 2, "stages": 3, "experts": 8,
}  # fmt: skip
# Known capture failures (reported upstream), skipped rather than recorded as errors:
NO_CHECKPOINTING = ("t5", "layerdrop")  # CheckpointError: different number of tensors saved
NO_HALF = ("layerdrop",)  # pure bf16/fp16 + torch.cond: "convert all Tensors to FakeTensors"
STATIC_SEQ = ("lstm",)
MAX_LAYERS = 6  # capture time grows with depth; deeper graphs are left to benchmarks


@dataclass(kw_only=True, slots=True)
class CorpusPlan:
    configs: int = 8  # (hparams, train) configs per family on the sim backend
    sizes: int = 4  # input sizes per config
    devices: int = 3  # device profiles per (config, sizes)
    cpu_configs: int = 3  # configs per family on the real cpu backend
    seed: int = 0
    sample_hparams: bool = True  # False: every config uses the family defaults (tests)
    families: list[str] = field(default_factory=list)  # empty: every zoo family

    def __post_init__(self) -> None:
        for name in ("configs", "sizes", "devices"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.cpu_configs < 0:
            raise ValueError("cpu_configs must be >= 0")


def _cap(family: str, hp: dict[str, Any], ranges: dict[str, list], small: bool) -> dict:
    out = dict(hp)
    if family == "mixtral":
        out["experts_impl"] = "batched_mm"  # eager experts read data-dependent ints
    for key, limit in SMALL_HPARAMS.items():
        if key not in out or not isinstance(out[key], int):
            continue
        if key == "layers" and not small:
            limit = 4 if family == "layerdrop" else MAX_LAYERS  # 2**layers paths, max 16
        elif not small:
            continue
        if out[key] > limit:
            allowed = [v for v in ranges.get(key, []) if v <= limit]
            out[key] = max(allowed) if allowed else min(out[key], limit)
    if "heads" in out and "hidden" in out and out["hidden"] % out["heads"]:
        out["heads"] = max(h for h in (1, 2, 4) if out["hidden"] % h == 0)
    if "kv_heads" in out and out["heads"] % out["kv_heads"]:
        out["kv_heads"] = 1
    return out


def _train(rng: random.Random, gpu_sm: int | None) -> dict[str, Any]:
    precisions = ["fp32", "fp32", "amp-fp16", "fp16"]
    if gpu_sm is None or gpu_sm >= 80:
        precisions += ["bf16", "amp-bf16", "amp-bf16"]
    optimizer = rng.choice(["adamw", "adamw", "adam", "sgd", "adafactor"])
    impls = ["auto", "auto", "foreach", "for-loop"] + (
        ["fused"] if optimizer != "adafactor" else []
    )
    return {
        "precision": rng.choice(precisions),
        "optimizer": optimizer,
        "optimizer_impl": rng.choice(impls),
        "checkpointing": rng.choice(["none", "none", "full", "blocks:1"]),
        "grad_accum": rng.choice([1, 1, 2, 4]),
        "set_to_none": rng.random() < 0.85,
    }


def _sizes(rng: random.Random, name: str, dims: dict[str, int], hp: dict, small: bool) -> dict:
    batches = [1, 2, 4, 8, 12] if name in CONV_FAMILIES else [1, 2, 4, 8, 16, 32]
    if name == "mlp":
        batches = [16, 64, 256, 1024, 4096]
    if small:
        batches = batches[:4]
    max_seq = min(hp.get("max_positions", 512), 512 if not small else 128)
    if name in STATIC_SEQ:  # nn.LSTM/GRU: the step is unrolled per time step at capture
        max_seq = 64 if not small else 32
    out = {"B": rng.choice(batches)}
    for sym in dims:
        if sym in ("S", "T"):
            out[sym] = rng.choice([s for s in (32, 64, 128, 256, 512) if s <= max_seq])
    return out


def plan_jobs(plan: CorpusPlan) -> list[dict[str, Any]]:
    """Work units: one (family, hparams, train, backend) with its sizes and devices."""
    from dataset.zoo import FAMILIES

    rng = random.Random(plan.seed)
    units = []
    for name in plan.families or list(FAMILIES):
        fam = FAMILIES[name]
        for k in range(plan.configs + plan.cpu_configs):
            backend = "sim" if k < plan.configs else "cpu"
            small = backend == "cpu"
            sampled = fam.sample(rng) if k and plan.sample_hparams else dict(fam.defaults)
            hp = _cap(name, sampled, fam.ranges, small)
            sm = rng.choice(list(GPU_GROUPS)) if backend == "sim" else None
            train = _train(rng, sm)
            if name in NO_CHECKPOINTING:
                train["checkpointing"] = "none"
            if name in NO_HALF and train["precision"] in ("bf16", "fp16"):
                train["precision"] = "fp32"
            if backend == "cpu":
                train["precision"] = rng.choice(["fp32", "fp32", "bf16", "amp-bf16"])
                if train["optimizer_impl"] == "fused":
                    train["optimizer_impl"] = "auto"
            sizes = []
            for _ in range(plan.sizes if backend == "sim" else max(2, plan.sizes - 1)):
                s = _sizes(rng, name, fam.dims, hp, small)
                if s not in sizes:
                    sizes.append(s)
            devices = ["cpu"]
            if sm is not None:
                devices = rng.sample(GPU_GROUPS[sm], min(plan.devices, len(GPU_GROUPS[sm])))
            units.append(dict(family=name, hparams=hp, train=train, backend=backend,
                              sm=sm, sizes=sizes, devices=devices))  # fmt: skip
    return units


def job_id(model: str, hp: dict, train: dict, sizes: dict, backend: str, device: str) -> str:
    blob = json.dumps([model, hp, train, sizes, backend, device], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def run_unit(unit: dict[str, Any], cache: str, skip: set[str]) -> tuple[list, list]:
    """Profile one unit; returns (rows, [(graph id, cached graph file)]); failures become
    error rows."""
    import torch

    from dataset.corpus import record_row
    from dataset.devices import get_profile
    from dataset.profile import ProfileConfig, failed_record, profile
    from dataset.record import ProfileRecord
    from dataset.sim import simulate
    from dataset.zoo import make_bundle
    from predictor.capture import CaptureConfig, capture
    from predictor.predict import capture_cached, capture_key
    from predictor.spec import TrainSpec

    rows, graphs = [], {}
    name, backend = unit["family"], unit["backend"]
    try:
        bundle = make_bundle(name, unit["hparams"])
        train = TrainSpec(**unit["train"])
    except ValueError as exc:
        log.warning("%s: bad config %s: %s", name, unit["hparams"], exc)
        return rows, []
    for sizes in unit["sizes"]:
        ids = {d: job_id(bundle.name, bundle.hparams, train.to_dict(), sizes, backend, d)
               for d in unit["devices"]}  # fmt: skip
        todo = [d for d in unit["devices"] if ids[d] not in skip]
        if not todo:
            continue
        cfg = ProfileConfig(backend=backend, device=todo[0])
        try:
            target, sm = ("cuda", unit["sm"]) if backend == "sim" else ("cpu", 80)
            sym = capture_cached(bundle, train, target=target, sm=sm, sizes=sizes,
                                 directory=Path(cache))  # fmt: skip
            trace = bundle.sizes({d: sizes[d] for d in bundle.static_dims if d in sizes})
            static = {d: trace[d] for d in bundle.static_dims}
            graphs[sym.graph_id] = str(
                Path(cache) / "graphs" / f"{capture_key(bundle, train, target, sm, static)}.json.gz"
            )
            if backend == "cpu":
                records = [profile(bundle, train, sizes, cfg)]
            else:
                t0 = time.perf_counter()
                full = bundle.sizes(sizes)
                concrete = capture(
                    bundle,
                    train,
                    CaptureConfig(
                        symbolic=False, sizes=full, target="cuda", scenario=cfg.scenario, sm=sm
                    ),
                )
                records = []
                for dev in todo:
                    device = get_profile(dev)
                    device.check_precision(train.precision)
                    res = simulate(concrete, full, device, scenario=cfg.scenario)
                    records.append(ProfileRecord(
                        backend="sim", device=dev, torch_version=torch.__version__,
                        model=bundle.name, family=bundle.family, hparams=bundle.hparams,
                        sizes=full, train=train.to_dict(),
                        peak_allocated_bytes=res.peak_allocated_bytes,
                        peak_reserved_bytes=res.peak_reserved_bytes,
                        device_total_bytes=res.device_total_bytes, breakdown=res.breakdown,
                        stats=res.stats | {"nodes": sum(p.num_nodes for p in concrete.paths)},
                        seconds=round(time.perf_counter() - t0, 3)))  # fmt: skip
            for dev, rec in zip(todo, records):
                rows.append(record_row(ids[dev], rec, sym.graph_id))
        except Exception as exc:  # one failing config must not stop the build
            log.warning("%s %s %s: %s", name, sizes, unit["train"], str(exc)[:300])
            for dev in todo:
                cfg = ProfileConfig(backend=backend, device=dev)
                rec = failed_record(bundle.name, bundle.family, sizes, train.to_dict(), cfg, exc)
                rows.append(record_row(ids[dev], rec, None))
    return rows, sorted(graphs.items())


def build(out: str | Path, plan: CorpusPlan, workers: int = 2, cache: str | None = None) -> int:
    """Build (or finish) the corpus in `out`; returns the number of new rows."""
    from dataset.corpus import CorpusWriter

    writer = CorpusWriter(out)
    done = writer.done_job_ids()
    cache = cache or str(Path(out) / ".capture-cache")
    units = plan_jobs(plan)
    log.info("corpus plan: %d units, %d rows already done", len(units), len(done))
    new = 0
    t0 = time.perf_counter()

    def handle(k: int, rows: list, graphs: list) -> int:
        for gid, path in graphs:
            _copy_graph(Path(path), Path(out) / "graphs" / f"{gid}.json.gz")
        writer.write_rows(rows)
        errors = sum(1 for r in rows if r["error"])
        log.info("[%d/%d] %s %s: %d rows (%d failed), %.0fs", k + 1, len(units),
                 units[k]["family"], units[k]["backend"], len(rows), errors,
                 time.perf_counter() - t0)  # fmt: skip
        return len(rows)

    if workers <= 0:  # in-process (tests)
        for k, unit in enumerate(units):
            new += handle(k, *run_unit(unit, cache, done))
        return new
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(run_unit, u, cache, done) for u in units]
        for k, fut in enumerate(futures):
            new += handle(k, *fut.result())
    return new


def _copy_graph(src: Path, dst: Path) -> None:
    if dst.is_file():
        return
    tmp = dst.with_name(dst.name + ".tmp")
    shutil.copyfile(src, tmp)
    tmp.replace(dst)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--configs", type=int, default=8, help="sim configs per family")
    p.add_argument("--sizes", type=int, default=4, help="input sizes per config")
    p.add_argument("--devices", type=int, default=3, help="device profiles per sim job")
    p.add_argument("--cpu-configs", type=int, default=3, help="real-cpu configs per family")
    p.add_argument("--families", default="", help="comma-separated zoo names (default all)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=2)
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    for noisy in ("torch", "transformers", "predictor", "dataset"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    plan = CorpusPlan(
        configs=a.configs,
        sizes=a.sizes,
        devices=a.devices,
        cpu_configs=a.cpu_configs,
        seed=a.seed,
        families=[f for f in a.families.split(",") if f],
    )
    n = build(a.out, plan, workers=a.workers)
    print(f"wrote {n} new rows to {a.out}")


if __name__ == "__main__":
    main()
