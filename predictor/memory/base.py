"""Predictions: the interface every memory model implements.

A `MemoryModel` answers `Query`s (sizes, device profile, metric, data scenario) about one
captured `StepGraph`. Models encode a graph once (cached by graph id) and answer many
queries cheaply (`EncodingModel`). A query outside the sizes a graph is valid for raises
`GuardViolation` (`check_guards`). The models: `memory.analytic.AnalyticModel` (the
baseline), `memory.onnx_model.OnnxMemoryModel` (the learned model), and the exact replay
`answer.exact.ReplayModel`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Protocol, runtime_checkable

from memgnn.predictor.errors import UserError
from memgnn.predictor.ir.graph import StepGraph
from memgnn.predictor.ir.vocab import METHODS, METRICS, SCENARIOS

log = logging.getLogger(__name__)


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

    def copy(self, **breakdown: Any) -> Prediction:
        """A copy its receiver may change (breakdown and paths copied to their leaves,
        which are plain data), with `breakdown` entries added: what a remembered answer
        is handed out as."""
        return replace(self, breakdown=_plain_copy(self.breakdown) | breakdown,
                       paths=_plain_copy(self.paths))  # fmt: skip


def _plain_copy(value: Any) -> Any:
    """A copy of nested dicts and lists (several times cheaper than copy.deepcopy here)."""
    if isinstance(value, dict):
        return {k: _plain_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain_copy(v) for v in value]
    return value


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
