"""The `cpu` backend: a real training step on the CPU, real kernels, real data.

Two numbers, both bytes on the CPU:
- tensor level: the same storage recorder as capture, over real tensors; the liveness sweep
  of what it recorded is the peak of live tensor storages (`peak_allocated_bytes`);
- allocator level: `torch.profiler` memory events (every c10 CPU allocation, including
  kernel scratch the dispatcher does not see), cumulated in time order, plus what was alive
  before the step (`stats.profiler_peak_bytes`).
"""

from __future__ import annotations

import bisect
import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

import torch
from memgnn.predictor.capture.step import TrainingStep, step_plan
from memgnn.predictor.ir.graph import StepGraph
from memgnn.predictor.ir.pathgraph import ExprInterner, path_from_recorder
from memgnn.predictor.ir.recorder import (
    ModuleTracker,
    RecorderObserver,
    StepRecorder,
    register_state,
)
from memgnn.predictor.memory.analytic import sweep
from memgnn.predictor.memory.places import place_breakdown
from memgnn.predictor.spec.bundle import ModelBundle
from memgnn.predictor.spec.train import TrainSpec

log = logging.getLogger(__name__)


@contextlib.contextmanager
def compiled_afresh() -> Iterator[None]:
    """torch.compile inside compiles anew, not from inductor's or AOTAutograd's on-disk
    caches: an artifact an earlier process compiled under other conditions (around other
    saved-tensor hooks) can allocate otherwise (one read 16,384 B apart). For real
    compiled steps measured against the capture."""
    with (
        torch._inductor.config.patch(fx_graph_cache=False),
        torch._functorch.config.patch(enable_autograd_cache=False),
    ):
        yield


def profiler_peak(prof: Any, region: str | None = None, settled: tuple[str, ...] = ()) -> int:
    """Peak of the cumulated CPU allocator events of a `torch.profiler.profile(
    profile_memory=True)` run (each allocation and free in time order, frees first at equal
    times). `region`: count the peak only from the start of the `record_function` of that
    name on (what was allocated before it counts as live); None: over the whole run.
    `settled`: ops (profiler names, e.g. "aten::_scaled_mm") whose allocator events inside
    their own span count as one net event at its end: a CPU kernel's own temporaries that
    the CUDA kernel does not make (the CPU `_scaled_mm` upcasts its float8 operands)."""
    events = prof.profiler.kineto_results.events()
    start = None if region is None else min(e.start_ns() for e in events if e.name() == region)
    memory = sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]")
    if settled:
        memory = _settle(memory, [e for e in events if e.name() in settled])
    live = peak = 0
    for at, delta in memory:
        live += delta
        if start is None or at >= start:
            peak = max(peak, live)
    return peak


def _settle(memory: list[tuple[int, int]], spans: list[Any]) -> list[tuple[int, int]]:
    """`memory` with the events inside each span replaced by their sum at the span's end."""
    bounds = sorted((e.start_ns(), e.start_ns() + e.duration_ns()) for e in spans)
    starts = [b[0] for b in bounds]
    out, net = [], [0] * len(bounds)
    for at, delta in memory:
        k = bisect.bisect_right(starts, at) - 1
        if k >= 0 and at <= bounds[k][1]:
            net[k] += delta
        else:
            out.append((at, delta))
    out += [(bounds[k][1], n) for k, n in enumerate(net) if n]
    return sorted(out)


def record_cpu_step(
    bundle: ModelBundle, train: TrainSpec, sizes: dict[str, int], *, seed: int = 0,
    make_step: Callable[[str], Any] | None = None,
) -> tuple[StepGraph, int]:  # fmt: skip
    """Run the step for real; return its recorded graph and the profiler's peak delta.
    `make_step(target)`: another runner with `TrainingStep`'s face (the user's own step,
    `predictor.capture.user_step.UserStep`), built here on real tensors."""
    from torch.profiler import ProfilerActivity, profile

    torch.manual_seed(seed)
    if make_step is not None:
        step = make_step("cpu")
    else:
        step = TrainingStep(bundle, train, device=torch.device("cpu"), target="cpu")
    warmup, measured = step_plan(train)
    if warmup:
        step.run(sizes, steps=warmup)
    with ModuleTracker(step.model) as tracker:
        rec = StepRecorder(module_stack=tracker.stack)
        register_state(rec, step.state_tensors())
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            with rec:
                step.run(sizes, RecorderObserver(rec), steps=measured)
        rec.close()
    interner = ExprInterner()
    path = path_from_recorder(rec, [], interner, {}, None)
    graph = StepGraph(
        model={"name": bundle.name, "family": bundle.family, "hparams": bundle.hparams},
        train=train.flat(),
        symbols=dict(sizes),
        data_symbols={},
        guards=[],
        exprs=interner.sources,
        paths=[path],
        meta={"backend": "cpu", "torch_version": torch.__version__},
    )
    return graph, profiler_peak(prof)


def profile_cpu(
    bundle: ModelBundle, train: TrainSpec, sizes: dict[str, int], *,
    make_step: Callable[[str], Any] | None = None,
) -> dict[str, Any]:  # fmt: skip
    graph, prof_delta = record_cpu_step(bundle, train, sizes, make_step=make_step)
    swept = sweep(graph, sizes)
    before = int(
        graph.storage_bytes(0, swept.sizes)[
            [i for i, a in enumerate(graph.paths[0].storages["alloc"]) if a < 0]
        ].sum()
    )
    return {
        "peak_allocated_bytes": swept.peak_bytes,
        "peak_reserved_bytes": None,
        "device_total_bytes": None,
        "breakdown": {
            "categories": swept.best.breakdown,
            "tensor_step_peaks": swept.best.step_peaks,
            "tensor_phase_peaks": swept.best.phase_peaks,
            "first_step": {"allocated": swept.best.step_peaks.get("first")},
            "steady_state": {"allocated": swept.best.step_peaks.get("steady")},
            **place_breakdown(graph, 0, swept.sizes, gpu=False),
        },
        "stats": {
            "profiler_peak_bytes": before + prof_delta,
            "nodes": graph.paths[0].num_nodes,
        },
        "graph": graph,
    }
