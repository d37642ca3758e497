"""Predictions: the interface every memory model implements, and the analytic baseline.

A `MemoryModel` answers `Query`s (sizes, device profile, metric, data scenario) about one
captured `StepGraph`. Models encode a graph once (cached by graph id) and answer many
queries cheaply. `AnalyticModel` is the baseline the learned model corrects: the liveness
sweep with the CUDA allocator's 512-byte block rounding, plus the device's cuBLAS
workspaces (allocated) and CUDA context (device total); it models no caching or
fragmentation, so its reserved estimate equals its allocated one.

`capture_cached` captures a model's step once per (model, hparams, training config, target)
and keeps it on disk, so repeated predictions skip the capture.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from predictor.analytic import sweep
from predictor.graph import StepGraph
from predictor.spec import ModelBundle, TrainSpec
from predictor.vocab import cublas_workspaces

log = logging.getLogger(__name__)

METRICS = ("allocated", "reserved", "device_total")


@dataclass(kw_only=True, slots=True)
class Query:
    sizes: dict[str, int]
    device: str = "h100-80gb"
    metric: str | None = None  # default: reserved on a GPU profile, allocated on cpu
    scenario: str = "worst"  # data-dependent sizes: min | balanced | worst

    def __post_init__(self) -> None:
        if self.metric is not None and self.metric not in METRICS:
            raise ValueError(f"unknown metric {self.metric!r}; expected one of {METRICS}")
        if self.scenario not in ("min", "balanced", "worst"):
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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


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
        from dataset.devices import get_profile

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
                    breakdown={
                        "categories": swept.best.breakdown,
                        "phase": swept.best.peak_phase,
                        "step_peaks": swept.best.step_peaks,
                        "workspace_and_context_bytes": extra,
                        "violated_guards": swept.violated_guards,
                    },
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


def cache_dir() -> Path:
    """Where captured graphs are kept: $MEMGNN_CACHE, else ~/.cache/memgnn."""
    return Path(os.environ.get("MEMGNN_CACHE", Path.home() / ".cache" / "memgnn"))


# bumped whenever capture records a step differently, so cached graphs are captured anew
CAPTURE_VERSION = 2  # 2: open slices elided as in eager; oneDNN LSTM workspace on the CPU


def capture_key(
    bundle: ModelBundle, train: TrainSpec, target: str, sm: int, static: dict[str, int]
) -> str:
    blob = json.dumps(
        {
            "capture": CAPTURE_VERSION,
            "model": bundle.name,
            "hparams": bundle.hparams,
            "dims": bundle.dims,
            "train": train.to_dict(),
            "target": target,
            "sm": sm,
            "static": static,
        },
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def capture_cached(
    bundle: ModelBundle,
    train: TrainSpec,
    *,
    target: str = "cuda",
    sm: int = 80,
    sizes: dict[str, int] | None = None,
    directory: Path | None = None,
) -> StepGraph:
    """A symbolic capture of the step, from the on-disk cache when it was made before.

    Dims the bundle declares static are captured at `sizes` (default: the example dims),
    so each such size has its own cached graph."""
    from predictor.capture import CaptureConfig, capture

    wanted = sizes or {}
    trace = bundle.sizes({d: wanted[d] for d in bundle.static_dims if d in wanted})
    static = {d: trace[d] for d in bundle.static_dims}
    folder = (directory or cache_dir()) / "graphs"
    path = folder / f"{capture_key(bundle, train, target, sm, static)}.json.gz"
    if path.is_file():
        try:
            return StepGraph.load(path)
        except ValueError as exc:  # corrupt or old: capture again
            log.warning("ignoring cached graph %s: %s", path, exc)
    graph = capture(bundle, train, CaptureConfig(target=target, sm=sm, sizes=trace))
    folder.mkdir(parents=True, exist_ok=True)
    graph.save(path)
    return graph


def default_model() -> MemoryModel:
    """The shipped learned model (onnxruntime); the analytic baseline if none ships."""
    try:
        from predictor.onnx_model import load_default_model
    except ImportError:
        log.warning("no learned model in this install: using the analytic baseline")
        return AnalyticModel()
    return load_default_model()
