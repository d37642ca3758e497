"""`memgnn profile`: one record per (model, sizes, training config) from sim, cpu or cuda.

`profile()` validates the config, runs the backend and returns a `ProfileRecord`;
`profile_many()` runs a batch and keeps going past a config that fails (its record carries
the error and the config), so one bad model never loses the rest of a batch.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from memgnn.dataset.record import ProfileRecord
from memgnn.predictor.ir.graph import StepGraph
from memgnn.predictor.sim.allocator import AllocatorConfig
from memgnn.predictor.spec.bundle import ModelBundle
from memgnn.predictor.spec.devices import DeviceProfile, get_profile
from memgnn.predictor.spec.train import TrainSpec

log = logging.getLogger(__name__)

BACKENDS = ("sim", "cpu", "cuda")
REPLAYS = ("compiled", "python")


@dataclass(kw_only=True, slots=True)
class ProfileConfig:
    backend: str = "sim"
    device: str | None = None  # default: h100-80gb for sim, cpu for cpu, the GPU for cuda
    scenario: str = "balanced"  # data-dependent sizes for sim: min | balanced | worst
    allocator: AllocatorConfig | None = None
    warmup_steps: int = 1  # cuda: steps run before the measured ones
    snapshot_path: str | None = None  # write a memory snapshot (pickle) here (sim: simulated)
    # sim labels: "compiled" replays the trace on the numba core (predictor.sim.replay, checked
    # equal to the Python simulator), "python" on predictor.sim.allocator (the reference)
    replay: str = "compiled"

    def __post_init__(self) -> None:
        if self.replay not in REPLAYS:
            raise ValueError(f"unknown replay {self.replay!r}; expected one of {REPLAYS}")
        if self.backend not in BACKENDS:
            raise ValueError(f"unknown backend {self.backend!r}; expected one of {BACKENDS}")
        if self.warmup_steps < 0:
            raise ValueError("warmup_steps must be >= 0")
        if self.backend == "cpu" and self.device not in (None, "cpu"):
            raise ValueError("the cpu backend measures the CPU: use --device cpu")

    def device_profile(self) -> DeviceProfile:
        default = {"sim": "h100-80gb", "cpu": "cpu", "cuda": None}[self.backend]
        name = self.device or default
        if name is None:
            from memgnn.dataset.cuda_backend import detect_profile

            return detect_profile()
        return get_profile(name)

    def replayer(self):
        """The `simulate` replayer of `replay` (None: the Python reference)."""
        if self.replay == "python":
            return None
        from memgnn.predictor.sim.replay.trace import replay_trace_fast

        return replay_trace_fast


def profile(
    bundle: ModelBundle,
    train: TrainSpec,
    sizes: dict[str, int],
    config: ProfileConfig,
    *,
    graph: StepGraph | None = None,
) -> ProfileRecord:
    """Measure or simulate one config; ValueError for a config that cannot run.

    `graph` (sim only): a symbolic capture of this model and training config, already
    checked against a concrete capture (`symbolic_agrees`); it is simulated at `sizes`
    instead of capturing the step again. Where its guards do not hold at `sizes`, the step
    is captured concretely as usual.
    """
    sizes = bundle.sizes(sizes)
    if train.parallel.distributed and config.backend != "sim":
        raise ValueError(
            f"--sharding {train.parallel.sharding} --tp {train.parallel.tp} "
            f"--gpus {train.parallel.gpus}: the "
            f"{config.backend} backend "
            "runs one process; --backend sim runs rank 0 over a fake process group"
        )
    device = config.device_profile()
    device.check_precision(train.numerics.precision)
    t0 = time.perf_counter()
    result = _run_backend(bundle, train, sizes, config, device, graph)
    graph = result.pop("graph", None)
    return ProfileRecord(
        backend=config.backend,
        device=device.name,
        device_name=result.pop("device_name", None),
        torch_version=torch.__version__,
        model=bundle.name,
        family=bundle.family,
        hparams=bundle.hparams,
        sizes=sizes,
        train=train.flat(),
        graph_id=graph.graph_id if graph is not None and config.backend == "sim" else None,
        seconds=round(time.perf_counter() - t0, 3),
        **result,
    )


def _run_backend(
    bundle, train, sizes, config: ProfileConfig, device, graph: StepGraph | None = None
) -> dict[str, Any]:
    if config.backend == "cpu":
        from memgnn.dataset.cpu_backend import profile_cpu

        return profile_cpu(bundle, train, sizes)
    if config.backend == "cuda":
        from memgnn.dataset.cuda_backend import profile_cuda

        return profile_cuda(
            bundle,
            train,
            sizes,
            device,
            warmup_steps=config.warmup_steps,
            snapshot_path=config.snapshot_path,
        )
    from memgnn.predictor.capture.capture import CaptureConfig, capture
    from memgnn.predictor.sim.simulate import simulate

    if graph is not None:
        sim = simulate(
            graph,
            sizes,
            device,
            scenario=config.scenario,
            allocator=config.allocator,
            replayer=config.replayer(),
        )
        if not sim.stats["violated_guards"]:
            _export(graph, sizes, device, config, sim.stats)
            return _sim_result(sim, graph, label_graph="symbolic")
        log.info("%s at %s: symbolic guards fail; capturing concretely", bundle.name, sizes)
    target = "cuda" if device.is_gpu else "cpu"
    cap = CaptureConfig(
        symbolic=False,
        sizes=sizes,
        target=target,
        scenario=config.scenario,
        sm=device.sm or 80,
    )
    graph = capture(bundle, train, cap)
    sim = simulate(
        graph,
        sizes,
        device,
        scenario=config.scenario,
        allocator=config.allocator,
        replayer=config.replayer(),
    )
    _export(graph, sizes, device, config, sim.stats)
    return _sim_result(sim, graph, label_graph="concrete")


def _export(graph: StepGraph, sizes, device, config: ProfileConfig, stats: dict) -> None:
    """With `snapshot_path`, write the simulated step (the path `simulate` reports) as a
    `_dump_snapshot` pickle (gzip if the name ends in .gz)."""
    if not config.snapshot_path:
        return
    from memgnn.predictor.snapshot.export import simulated_step_snapshot, write_snapshot

    snap = simulated_step_snapshot(
        graph, sizes, device, scenario=config.scenario, allocator=config.allocator
    )
    write_snapshot(snap, config.snapshot_path)
    stats["snapshot_path"] = str(config.snapshot_path)


def _sim_result(sim, graph: StepGraph, *, label_graph: str) -> dict[str, Any]:
    stats = sim.stats | {"nodes": sum(p.num_nodes for p in graph.paths), "label_graph": label_graph}
    return {
        "peak_allocated_bytes": sim.peak_allocated_bytes,
        "peak_reserved_bytes": sim.peak_reserved_bytes,
        "device_total_bytes": sim.device_total_bytes,
        "breakdown": sim.breakdown,
        "stats": stats,
        "graph": graph,
    }


def symbolic_agrees(
    graph: StepGraph, record: ProfileRecord, config: ProfileConfig
) -> tuple[bool, str]:
    """Does the symbolic `graph`, simulated at `record`'s sizes, give `record`'s labels
    (a concrete sim record) byte for byte? (verdict, a line saying why)"""
    from memgnn.predictor.sim.simulate import simulate

    device = config.device_profile()
    sim = simulate(
        graph,
        record.sizes,
        device,
        scenario=config.scenario,
        allocator=config.allocator,
        replayer=config.replayer(),
    )
    if sim.stats["violated_guards"]:
        return False, f"guards fail at {record.sizes}: {sim.stats['violated_guards'][:2]}"
    pairs = {
        "allocated": (sim.peak_allocated_bytes, record.peak_allocated_bytes),
        "reserved": (sim.peak_reserved_bytes, record.peak_reserved_bytes),
        "device_total": (sim.device_total_bytes, record.device_total_bytes),
    }
    diff = {k: v for k, v in pairs.items() if v[0] != v[1]}
    if diff:
        return False, f"symbolic != concrete at {record.sizes} (bytes sym, conc): {diff}"
    return True, f"symbolic == concrete at {record.sizes}"


def failed_record(
    bundle_name: str,
    family: str,
    sizes: dict[str, int],
    train: dict[str, Any],
    config: ProfileConfig,
    error: BaseException,
) -> ProfileRecord:
    return ProfileRecord(
        backend=config.backend,
        device=config.device or "",
        torch_version=torch.__version__,
        model=bundle_name,
        family=family,
        sizes=sizes,
        train=train,
        error=f"{type(error).__name__}: {error}",
    )


def profile_many(
    jobs: Iterable[tuple[ModelBundle, TrainSpec, dict[str, int]]], config: ProfileConfig
) -> Iterator[ProfileRecord]:
    """Profile each job; a job that raises yields a record with its error and config."""
    for bundle, train, sizes in jobs:
        try:
            yield profile(bundle, train, sizes, config)
        except Exception as exc:  # a model failing mid-step must not stop the batch
            log.warning("profile of %s %s failed: %s", bundle.name, sizes, exc)
            log.debug("%s", traceback.format_exc())
            yield failed_record(bundle.name, bundle.family, sizes, train.flat(), config, exc)
