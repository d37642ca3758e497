"""Predictions: the interface every memory model implements, and the analytic baseline.

A `MemoryModel` answers `Query`s (sizes, device profile, metric, data scenario) about one
captured `StepGraph`. Models encode a graph once (cached by graph id) and answer many
queries cheaply. `AnalyticModel` is the baseline the learned model corrects: the liveness
sweep with the CUDA allocator's 512-byte block rounding, plus the device's cuBLAS
workspaces (allocated) and CUDA context (device total); it models no caching or
fragmentation, so its reserved estimate equals its allocated one.

`capture_cached` (re-exported from `predictor.capture_cache`) captures a model's step once
and keeps it on disk, keyed on everything that decides the graph.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from memgnn.predictor.analytic import sweep
from memgnn.predictor.capture_cache import cache_dir, capture_cached, capture_key  # noqa: F401
from memgnn.predictor.errors import UserError
from memgnn.predictor.graph import StepGraph
from memgnn.predictor.parallel import annotate
from memgnn.predictor.spec import ModelBundle, TrainSpec
from memgnn.predictor.vocab import METRICS, SCENARIOS, cublas_workspaces

log = logging.getLogger(__name__)

METHODS = ("replay", "gnn", "analytic")


@dataclass(kw_only=True, slots=True)
class Query:
    sizes: dict[str, int]
    device: str = "h100-80gb"
    metric: str | None = None  # default: reserved on a GPU profile, allocated on cpu
    scenario: str = "worst"  # data-dependent sizes: min | balanced | worst

    def __post_init__(self) -> None:
        if self.metric is not None and self.metric not in METRICS:
            raise ValueError(f"unknown metric {self.metric!r}; expected one of {METRICS}")
        if self.scenario not in SCENARIOS:
            raise ValueError(f"unknown scenario {self.scenario!r}")

    def resolved_metric(self, is_gpu: bool) -> str:
        metric = self.metric or ("reserved" if is_gpu else "allocated")
        if not is_gpu and metric != "allocated":
            raise ValueError(f"metric {metric!r} needs a GPU device profile, not cpu")
        return metric


@dataclass(kw_only=True, slots=True)
class Prediction:
    predicted_peak_bytes: int
    upper_bound_bytes: int
    metric: str
    breakdown: dict[str, Any]
    model_version: str
    paths: list[dict[str, Any]] = field(default_factory=list)  # per control-flow path
    method: str = "analytic"  # the path that made it: replay | gnn | analytic

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"unknown prediction method {self.method!r}; expected {METHODS}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class GuardViolation(UserError):
    """A query outside the sizes a captured graph is valid for (its shape guards)."""

    def __init__(self, message: str, guards: list[str], sizes: dict[str, int]):
        super().__init__(message)
        self.guards, self.sizes = guards, sizes


def check_guards(graph: StepGraph, queries: Sequence[Query]) -> None:
    """Raise `GuardViolation` when a query's sizes break a guard of `graph`.

    A capture records the conditions the traced code relied on (e.g. `S < 256` where a
    sliding-window model takes another branch past its window, or a model's position
    limit): at sizes that break one, the step runs other code than the graph holds, so
    no answer from this graph is right. Recapture at the query's sizes instead."""
    for q in queries:
        bad = graph.violated_guards(graph.resolve_sizes(q.sizes, q.scenario))
        if bad:
            raise GuardViolation(
                f"sizes {q.sizes} break the captured graph's guard(s) {', '.join(bad)} "
                f"(captured at {graph.symbols}); recapture at these sizes",
                bad,
                dict(q.sizes),
            )


class MemoryModel(Protocol):
    version: str

    def predict(self, graph: StepGraph, queries: Sequence[Query]) -> list[Prediction]: ...


@runtime_checkable
class EncodingModel(MemoryModel, Protocol):
    """A `MemoryModel` that encodes a graph once (`encode`, cached by graph id in the
    server) and answers batches of queries from the encoding (`predict_encoded`).
    `thread_safe`: calls may run concurrently; otherwise the server serialises them."""

    thread_safe: bool

    def encode(self, graph: StepGraph) -> Any: ...

    def predict_encoded(
        self, encoding: Any, graph: StepGraph, queries: Sequence[Query]
    ) -> list[Prediction]: ...


class AnalyticModel:
    """Liveness sweep + block rounding + workspaces + context (see module docstring)."""

    version = "analytic-1"

    def predict(self, graph: StepGraph, queries: Sequence[Query]) -> list[Prediction]:
        from memgnn.predictor.devices import get_profile

        check_guards(graph, queries)
        out = []
        for q in queries:
            device = get_profile(q.device)
            metric = q.resolved_metric(device.is_gpu)
            round_to = 512 if device.is_gpu else 1
            swept = sweep(graph, q.sizes, scenario=q.scenario, round_to=round_to)
            extras = [_extra_bytes(graph, k, device, metric) for k in range(len(swept.paths))]
            per_path = [
                {"conditions": p.conditions, "predicted_peak_bytes": p.peak_bytes + extra}
                for p, extra in zip(swept.paths, extras, strict=True)
            ]
            best = max(range(len(per_path)), key=lambda k: per_path[k]["predicted_peak_bytes"])
            value, extra = per_path[best]["predicted_peak_bytes"], extras[best]
            out.append(
                Prediction(
                    predicted_peak_bytes=value,
                    upper_bound_bytes=value,
                    metric=metric,
                    breakdown=annotate(
                        {
                            "categories": swept.best.breakdown,
                            "phase": swept.best.peak_phase,
                            "step_peaks": swept.best.step_peaks,
                            "workspace_and_context_bytes": extra,
                            "violated_guards": swept.violated_guards,
                        },
                        graph.train,
                    ),
                    model_version=self.version,
                    paths=per_path,
                )
            )
        return out


def _extra_bytes(graph: StepGraph, path: int, device: Any, metric: str) -> int:
    """cuBLAS workspaces (one per thread running a matmul) and, for device_total, the
    CUDA context: what the device holds besides the step's tensors."""
    if not device.is_gpu:
        return 0
    p = graph.paths[path]
    extra = cublas_workspaces(p.nodes["op"], p.nodes["phase"]) * device.cublas_workspace_bytes
    return extra + (device.context_bytes if metric == "device_total" else 0)


def graph_for_query(
    bundle: ModelBundle,
    train: TrainSpec,
    sizes: dict[str, int],
    *,
    target: str = "cuda",
    sm: int = 80,
    scenario: str = "worst",
    directory: Path | None = None,
    use_cache: bool = True,
    capture_mode: str = "blocks",
) -> StepGraph:
    """A captured graph whose guards hold at `sizes` (`capture_mode`: CaptureConfig.mode).

    The cached capture (traced at the example sizes) when its guards hold there; else a
    capture traced at `sizes` themselves (logged; not cached: the cache keys on the
    example sizes). `GuardViolation` when even that graph's guards fail at `sizes`: the
    model itself cannot run there (e.g. more positions than its position table)."""
    from memgnn.predictor.branches import CaptureError
    from memgnn.predictor.capture import CaptureConfig, capture

    with Progress(f"capturing {bundle.name} for a {target} target"):
        graph = capture_cached(
            bundle, train, target=target, sm=sm, sizes=sizes, directory=directory,
            use_cache=use_cache, mode=capture_mode,
        )  # fmt: skip
    bad = graph.violated_guards(graph.resolve_sizes(sizes, scenario))
    if not bad:
        return graph
    log.info(
        "%s: the graph traced at %s does not hold at %s (guards %s): capturing at %s",
        bundle.name, graph.symbols, sizes, ", ".join(bad), sizes,
    )  # fmt: skip
    trace = bundle.sizes(sizes)
    try:
        with Progress(f"capturing {bundle.name} at {trace}"):
            cfg = CaptureConfig(target=target, sm=sm, sizes=trace, mode=capture_mode)
            graph = capture(bundle, train, cfg)
    except CaptureError as exc:
        raise GuardViolation(f"{bundle.name} cannot run at {sizes}: {exc}", bad, sizes) from exc
    bad = graph.violated_guards(graph.resolve_sizes(sizes, scenario))
    if bad:
        raise GuardViolation(
            f"{bundle.name} cannot run at {sizes}: {', '.join(bad)} fails even when traced "
            "at these sizes (a limit of the model)",
            bad,
            dict(sizes),
        )
    return graph


def unused_sizes(graph: StepGraph, names: Sequence[str]) -> list[str]:
    """A warning per size in `names` that no byte count of `graph` depends on: the model's
    make_inputs ignored it, so the answer is the same at any value of it."""
    used: set[str] = set()
    texts = [*graph.exprs, *(d[k] for d in graph.data_symbols.values() for k in ("lo", "hi"))]
    for text in texts:
        used.update(_NAME_RE.findall(text))
    return [
        f"size {name} never reaches the captured step (no tensor's bytes depend on it): "
        f"the answer is the same at any {name}; does make_inputs read sizes[{name!r}]?"
        for name in names
        if name in graph.symbols and name not in used
    ]


_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class Progress:
    """`with Progress("capturing gpt2"):` says on the `predictor.progress` logger (the CLI
    shows it on stderr) that the block is still running, after `first` seconds and then
    every `every` seconds, and when it ends; a block faster than `first` says nothing."""

    first = 2.0
    every = 10.0

    def __init__(self, what: str):
        self.what = what
        self._done = threading.Event()
        self._t0 = 0.0
        self._said = False

    def _beat(self) -> None:
        wait = self.first
        while not self._done.wait(wait):
            self._said = True
            _progress.info("%s ... (%.0f s)", self.what, time.perf_counter() - self._t0)
            wait = self.every

    def __enter__(self) -> Progress:
        self._t0 = time.perf_counter()
        threading.Thread(target=self._beat, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        if self._said and exc[0] is None:
            _progress.info("%s: done in %.1f s", self.what, time.perf_counter() - self._t0)


_progress = logging.getLogger("predictor.progress")
