"""What the answer layer takes and gives: requests, answers, and the pieces in between.

`PredictRequest` is one model source (a model SPEC with its training spec, an uploaded
graph's id, or a graph) and one or more query configs (sizes, device, metric, scenario),
with the method to answer by and an optional memory limit for a verdict. `PredictAnswer`
holds one `Answer` per config: the document `memgnn predict --json` prints, the same with
and without `--url`, and an element of `/predict`'s `predictions`.

`GraphEntry` is a captured graph as the layer hands it around (with the answering model's
encoding and the ops that model does not know); `Served` one answered query with the
live-sample `Correction` applied to it (an exact answer is never corrected).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, replace
from typing import Any

from memgnn.predictor.errors import UserError
from memgnn.predictor.ir.graph import StepGraph
from memgnn.predictor.ir.vocab import METHOD_CHOICES, METRICS, SCENARIOS
from memgnn.predictor.memory.base import Prediction
from memgnn.predictor.spec.train import TrainSpec

__all__ = [
    "Answer",
    "Correction",
    "GraphEntry",
    "ModelRef",
    "PredictAnswer",
    "PredictRequest",
    "QueryConfig",
    "Served",
    "corrected",
]


@dataclass(frozen=True, slots=True)
class Correction:
    """Scales from live samples (`/samples`): peak x `peak_scale`, bound x `bound_scale`."""

    peak_scale: float = 1.0
    bound_scale: float = 1.0
    samples: int = 0  # how many samples the scales come from (<= window per writer)
    writers: int = 0  # how many distinct writers sent them
    # the bounds in force (None: no correction): one writer alone moves an answer by at
    # most `writer_max_scale`, k agreeing writers by `writer_max_scale`**k, none past
    # `max_scale`; `capped`: a bound held the correction back
    writer_max_scale: float | None = None
    max_scale: float | None = None
    capped: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "peak_scale": self.peak_scale,
            "bound_scale": self.bound_scale,
            "samples": self.samples,
            "writers": self.writers,
            "writer_max_scale": self.writer_max_scale,
            "max_scale": self.max_scale,
            "capped": self.capped,
        }


def corrected(pred: Prediction, corr: Correction) -> Prediction:
    """Scale the peak by the median ratio and the bound by the (>= 1) bound ratio; the
    bound never drops below the corrected peak."""
    if corr.samples == 0:
        return pred
    peak = round(pred.predicted_peak_bytes * corr.peak_scale)
    bound = max(round(pred.upper_bound_bytes * corr.bound_scale), peak)
    paths = [
        p | {"predicted_peak_bytes": round(p["predicted_peak_bytes"] * corr.peak_scale)}
        if isinstance(p.get("predicted_peak_bytes"), int)
        else p
        for p in pred.paths
    ]
    return replace(pred, predicted_peak_bytes=peak, upper_bound_bytes=bound, paths=paths)


@dataclass(kw_only=True, slots=True)
class GraphEntry:
    graph: StepGraph
    graph_id: str
    n_nodes: int
    unknown_ops: list[str]
    model_version: str
    encoding: Any = None


@dataclass(kw_only=True, slots=True)
class Served:
    """One answered query: the corrected prediction, the model's own, the correction."""

    prediction: Prediction
    raw: Prediction
    correction: Correction = field(default_factory=Correction)


@dataclass(kw_only=True, slots=True)
class ModelRef:
    """A model as the user names it: a zoo name, `hf:...` or `py:module:factory`."""

    spec: str
    args: dict[str, str] = field(default_factory=dict)
    task: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.spec, str) or not self.spec.strip():
            raise UserError("a model SPEC is a non-empty string", loc=("model", "spec"))


@dataclass(kw_only=True, slots=True)
class QueryConfig:
    """One query: sizes for the graph's symbols (B, S, ...; the model's example dims fill
    the rest), the device profile, the metric (default: reserved on a GPU, allocated on
    cpu) and the scenario for data-dependent sizes."""

    sizes: dict[str, int] = field(default_factory=dict)
    device: str = "h100-80gb"
    metric: str | None = None
    scenario: str = "worst"

    def __post_init__(self) -> None:
        if self.metric is not None and self.metric not in METRICS:
            raise UserError(f"unknown metric {self.metric!r}; expected one of {METRICS}")
        if self.scenario not in SCENARIOS:
            raise UserError(f"unknown scenario {self.scenario!r}; expected one of {SCENARIOS}")


@dataclass(kw_only=True, slots=True)
class PredictRequest:
    """Exactly one of `model` (captured, then cached), `graph_id` (stored before) or
    `graph`; `train` applies to `model`. `method`: auto | replay | gnn | analytic;
    `replay_budget_ms` None = the backend's default. `budget`/`threshold`: a fits / does
    not fit verdict per config on its upper bound (at most one; `budget` in bytes or text
    as `predictor.spec.limits.parse_budget` reads it)."""

    configs: list[QueryConfig]
    model: ModelRef | None = None
    train: TrainSpec = field(default_factory=TrainSpec)
    graph_id: str | None = None
    graph: StepGraph | None = None
    method: str = "auto"
    replay_budget_ms: float | None = None
    apply_correction: bool = True
    budget: int | str | None = None
    threshold: float | None = None
    # a framework's config file (`answer.runconfig.RunConfig`) stating the model, the
    # training options and the sizes; `explicit`: the options the caller set, which
    # override the file's (the rest of `train` is defaults)
    run_config: Any = None
    explicit: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        given = [n for n in ("model", "graph_id", "graph") if getattr(self, n) is not None]
        if self.run_config is not None and not given:
            given = ["config"]
        if len(given) != 1:
            raise UserError(f"give exactly one of model, graph_id, graph (got {given or 'none'})")
        if self.run_config is not None and given[0] in ("graph_id", "graph"):
            raise UserError("a config file states a run to capture: not with a graph")
        if not self.configs:
            raise UserError("give at least one config", loc=("configs",))
        if self.method not in METHOD_CHOICES:
            raise UserError(
                f"unknown method {self.method!r}; expected one of {METHOD_CHOICES}",
                loc=("method",),
            )
        if self.budget is not None and self.threshold is not None:
            raise UserError("budget and threshold are mutually exclusive: give one")


@dataclass(kw_only=True, slots=True)
class Answer:
    """One config's answer: the document `memgnn predict --json` prints.

    `predicted_peak_bytes` / `upper_bound_bytes` in `metric` (allocated | reserved |
    device_total), made by `method` (replay | gnn | analytic) with `model_version`;
    `breakdown` says what holds the peak and how the answer was routed (`route`);
    `correction` the live-sample scales applied (none for an exact answer), the
    `uncorrected_*` bytes before them; `model` and `train` what the answer assumed;
    `verdict` against the request's limit; `warnings` what the user should know."""

    predicted_peak_bytes: int
    upper_bound_bytes: int
    metric: str
    method: str
    model_version: str
    breakdown: dict[str, Any]
    paths: list[dict[str, Any]]
    sizes: dict[str, int]
    device: str
    scenario: str
    graph_id: str
    model: dict[str, Any] | None
    train: dict[str, Any] | None
    warnings: list[str]
    verdict: dict[str, Any] | None
    correction: dict[str, Any]
    uncorrected_peak_bytes: int
    uncorrected_upper_bound_bytes: int
    unknown_ops: list[str]
    predict_seconds: float
    config: dict[str, Any] | None = None  # what a framework config file said (`runconfig`)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


@dataclass(kw_only=True, slots=True)
class PredictAnswer:
    model_version: str
    predictions: list[Answer]
    unknown_ops: list[str]

    @property
    def has_unknown_ops(self) -> bool:
        return bool(self.unknown_ops)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model_version": self.model_version,
            "predictions": [a.to_dict() for a in self.predictions],
            "unknown_ops": self.unknown_ops,
            "has_unknown_ops": self.has_unknown_ops,
        }
