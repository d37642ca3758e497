"""Pydantic models of the HTTP API (requests are strict: unknown fields are errors).

All sizes and memory amounts are in bytes. A config names its device profile (see
`memgnn devices`); its metric defaults to reserved on a GPU profile, allocated on cpu.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from memgnn.predictor.answer.runconfig import MAX_CONFIG_BYTES, RunConfig
from memgnn.predictor.frameworks.base import FORMATS
from memgnn.predictor.ir.vocab import MethodChoice as Method
from memgnn.predictor.ir.vocab import Metric, Scenario, SearchMode, Sharding
from memgnn.predictor.spec.choices import (
    OPTIMIZER_IMPLS,
    PP_SCHEDULES,
    PRECISIONS,
)
from memgnn.predictor.spec.devices import get_profile
from memgnn.predictor.spec.options import Option
from memgnn.predictor.spec.train import BY_NAME, OPTIONS, TrainSpec
from memgnn.predictor.zoo import TASKS
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StringConstraints,
    create_model,
    model_validator,
)

MAX_SIZE = (1 << 31) - 1
SymbolName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")]
Size = Annotated[StrictInt, Field(ge=1, le=MAX_SIZE)]
Sizes = Annotated[dict[SymbolName, Size], Field(max_length=32)]
GraphId = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{8,64}$")]


def _known_device(name: str) -> str:
    get_profile(name)  # a ValueError names the known profiles
    return name


# a profile of `memgnn devices`, or any GPU by its size: custom-<memory>-sm<XY>
Device = Annotated[
    str,
    StringConstraints(max_length=64),
    AfterValidator(_known_device),
    Field(examples=["h100-80gb", "custom-48gib-sm89"]),
]
Precision = Literal[PRECISIONS]  # type: ignore[valid-type]
Checkpointing = Annotated[
    str,
    StringConstraints(
        pattern=r"^(none|full|hf|selective-op|blocks:[0-9]{1,6}|every:[1-9][0-9]{0,5})$"
    ),
]
Bytes = Annotated[StrictInt, Field(ge=0, le=1 << 60)]
# which path answers (serving.routing): auto = replay within the budget, else the model
ReplayBudget = Annotated[
    float | None,
    Field(default=None, ge=0, le=600_000, description="ms; default: the server's budget"),
]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ConfigIn(Strict):
    """One query: sizes for the graph's symbols (B, S, ...), device profile, metric."""

    sizes: Sizes = Field(default_factory=dict, examples=[{"B": 8, "S": 512}])
    device: Device = "h100-80gb"
    metric: Metric | None = None
    scenario: Scenario = "worst"

    @model_validator(mode="after")
    def _metric_fits_device(self) -> ConfigIn:
        if get_profile(self.device).kind == "cpu" and self.metric not in (None, "allocated"):
            raise ValueError(f"metric {self.metric!r} needs a GPU device profile, not cpu")
        return self


def _option_field(o: Option) -> tuple[Any, Any]:
    """(annotation, FieldInfo) of one training option, from its `Option` metadata."""
    if o.choices is not None:
        kind: Any = Literal[o.choices]  # type: ignore[valid-type]
    else:
        kind = {bool: StrictBool, int: StrictInt, float: float, str: str}[o.type]
    bounds: dict[str, Any] = {}
    if o.lo is not None:
        bounds["gt" if o.lo_open else "ge"] = o.lo
    if o.hi is not None:
        bounds["lt" if o.hi_open else "le"] = o.hi
    if o.max_length is not None:
        bounds["max_length"] = o.max_length
    if o.pattern is not None:
        bounds["pattern"] = o.pattern
    if o.type is float:
        bounds["allow_inf_nan"] = False
    return kind, Field(default=o.default, description=o.help, **bounds)


def _group_model(group: str) -> type[BaseModel]:
    fields = {o.field: _option_field(o) for o in OPTIONS if o.group == group}
    name = "Train" + "".join(w.title() for w in group.split("_")) + "In"
    return create_model(name, __base__=Strict, **fields)


_GROUP_MODELS = {g: _group_model(g) for g in dict.fromkeys(o.group for o in OPTIONS)}


class _TrainBase(Strict):
    """How the step trains (`predictor.spec.train.TrainSpec`), nested by group as the answer
    shows it (`{"numerics": {"precision": "bf16"}, "adapter": {"method": "lora"}}`); the
    flat option names of the CLI and of stored records are accepted too
    (`{"precision": "bf16", "peft": "lora"}`). Every field is generated from the spec's
    options (`TrainIn` below), so this schema cannot drift from it."""

    @model_validator(mode="before")
    @classmethod
    def _flat_to_nested(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not any(k in BY_NAME for k in data):
            return data
        nested: dict[str, Any] = {}
        for key, value in data.items():
            o = BY_NAME.get(key)
            if o is None:  # a group, or a typo the strict model names
                nested[key] = value
            else:
                nested.setdefault(o.group, {})[o.field] = value
        return nested

    @model_validator(mode="after")
    def _rules(self) -> _TrainBase:
        self.to_spec()  # the rules across options (ValueError names the option) live in TrainSpec
        return self

    def to_spec(self) -> TrainSpec:
        return TrainSpec.from_dict(self.model_dump())

    def given(self) -> set[str]:
        """The flat names of the options the request set."""
        by_field = {(o.group, o.field): o.name for o in OPTIONS}
        return {
            by_field[(g, f)]
            for g in self.model_fields_set
            for f in getattr(self, g).model_fields_set
        }


TrainIn = create_model(
    "TrainIn",
    __base__=_TrainBase,
    __doc__=_TrainBase.__doc__,
    **{g: (m, Field(default_factory=m)) for g, m in _GROUP_MODELS.items()},
)


class ConfigFileIn(Strict):
    """A framework's config file, as `memgnn predict --config FILE` reads it: its text and
    file name (the extension tells JSON, YAML or TOML), the framework (default: detected),
    and a PEFT adapter_config.json's text for an HF/TRL file."""

    name: str = Field(min_length=1, max_length=255, examples=["lora_single_device.yaml"])
    text: str = Field(max_length=MAX_CONFIG_BYTES)
    format: Literal[FORMATS] | None = None  # type: ignore[valid-type]
    adapter_config: str | None = Field(default=None, max_length=MAX_CONFIG_BYTES)

    def to_run_config(self) -> RunConfig:
        return RunConfig(text=self.text, name=self.name, format=self.format,
                         adapter_config=self.adapter_config)  # fmt: skip


class ModelIn(Strict):
    """A model SPEC as the CLI takes it: zoo name (or hf:/py: where the server allows);
    with a `config` file the spec may be left out when the file names the model."""

    spec: str | None = Field(default=None, min_length=1, max_length=512, examples=["gpt2"])
    model_args: dict[Annotated[str, StringConstraints(max_length=64)], str | int | float | bool] = (
        Field(default_factory=dict, max_length=64)
    )
    task: Literal[TASKS] | None = None  # type: ignore[valid-type]
    train: TrainIn = Field(default_factory=TrainIn)

    def args(self) -> dict[str, str]:
        return {
            k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in self.model_args.items()
        }

    def explicit(self) -> frozenset[str]:
        """The training options the request set (they override a config file's)."""
        return frozenset(self.train.given())


def _check_spec(model: ModelIn | None, config: ConfigFileIn | None) -> None:
    if model is not None and model.spec is None and config is None:
        raise ValueError("model.spec is required without a config file that names the model")


class PredictRequest(Strict):
    """Exactly one of `graph_id` (uploaded with POST /graphs), `graph` (inline StepGraph
    JSON) or `model` (captured on the server, then cached)."""

    graph_id: GraphId | None = None
    graph: dict[str, Any] | None = None
    model: ModelIn | None = None
    configs: list[ConfigIn] = Field(min_length=1, max_length=1024)
    apply_correction: bool = True
    # a fits / does not fit verdict per config, on its upper bound: at most one of these
    threshold: float | None = Field(default=None, gt=0, le=1)  # of each config's device
    budget_bytes: Bytes | None = Field(default=None, ge=1)
    method: Method = "auto"
    replay_budget_ms: ReplayBudget = None
    config: ConfigFileIn | None = None  # the run as its framework's config file states it

    @model_validator(mode="after")
    def _one_source(self) -> PredictRequest:
        given = [n for n in ("graph_id", "graph") if getattr(self, n) is not None]
        if self.model is not None or self.config is not None:
            given.append("model" if self.model is not None else "config")
        if len(given) != 1:
            raise ValueError(f"give exactly one of graph_id, graph, model (got {given or 'none'})")
        _check_spec(self.model, self.config)
        if self.threshold is not None and self.budget_bytes is not None:
            raise ValueError("budget_bytes and threshold are mutually exclusive: give one")
        if self.threshold is not None:
            for c in self.configs:
                if get_profile(c.device).total_bytes is None:
                    raise ValueError(
                        f"threshold is a fraction of the device's memory; device "
                        f"{c.device!r} has no memory total (give budget_bytes)"
                    )
        return self


class CorrectionOut(BaseModel):
    """The live correction applied (`serving.corrections`): its scales, how many samples
    and distinct writers it comes from, and the bounds in force (None: no correction)."""

    peak_scale: float
    bound_scale: float
    samples: int
    writers: int = 0
    writer_max_scale: float | None = None
    max_scale: float | None = None
    capped: bool = False


class PredictionOut(BaseModel):
    """One config's answer: `predictor.answer.types.Answer`, the document `memgnn predict
    --json` prints (the same with and without `--url`)."""

    predicted_peak_bytes: int
    upper_bound_bytes: int
    metric: str
    method: str  # the path that made it: replay | gnn | analytic
    model_version: str
    breakdown: dict[str, Any]
    paths: list[dict[str, Any]]
    sizes: dict[str, int]  # the config's sizes, the model's example dims filled in
    device: str
    scenario: str
    graph_id: str
    model: dict[str, Any] | None  # what model the answer is about
    train: dict[str, Any] | None  # the training step it assumed (nested by group)
    warnings: list[str]
    verdict: dict[str, Any] | None = None  # under the request's threshold / budget_bytes
    correction: CorrectionOut
    uncorrected_peak_bytes: int
    uncorrected_upper_bound_bytes: int
    unknown_ops: list[str]
    predict_seconds: float
    config: dict[str, Any] | None = None  # what a framework config file said, key by key


class PredictResponse(BaseModel):
    model_version: str
    predictions: list[PredictionOut]
    unknown_ops: list[str]
    has_unknown_ops: bool


class GraphOut(BaseModel):
    graph_id: str
    stored: bool  # False: the server had it already
    nodes: int
    paths: int
    symbols: dict[str, int]
    unknown_ops: list[str]
    has_unknown_ops: bool


class SpaceIn(Strict):
    """The search space (`predictor.plan.space.SearchSpace`): B is searched up to max_batch."""

    sizes: Sizes = Field(default_factory=dict, examples=[{"S": 1024}])
    max_batch: int = Field(default=4096, ge=1, le=1 << 20)
    grad_accum: list[Annotated[int, Field(ge=1, le=4096)]] = Field(
        default_factory=lambda: [1], min_length=1, max_length=16
    )
    checkpointing: list[Checkpointing] = Field(
        default_factory=lambda: ["none", "full"], min_length=1, max_length=8
    )
    precision: list[Precision] = Field(default_factory=lambda: ["fp32"], min_length=1, max_length=5)
    effective_batch: int | None = Field(default=None, ge=1, le=1 << 24)
    mode: SearchMode = "binsearch"
    power_of_two: bool = True
    # [] = the model's train spec's (each a capture: see max_captures_per_request)
    optimizer_impl: list[Literal[OPTIMIZER_IMPLS]] = Field(  # type: ignore[valid-type]
        default_factory=list, max_length=4
    )
    sharding: list[Sharding] = Field(default_factory=list, max_length=7)
    gpus: list[Annotated[int, Field(ge=1, le=1 << 16)]] = Field(default_factory=list, max_length=8)
    # model-parallel layouts ([] = the model's train spec's; each layout a capture)
    tp: list[Annotated[int, Field(ge=1, le=1 << 16)]] = Field(default_factory=list, max_length=8)
    pp: list[Annotated[int, Field(ge=1, le=4096)]] = Field(default_factory=list, max_length=8)
    pp_schedule: list[Literal[PP_SCHEDULES]] = Field(  # type: ignore[valid-type]
        default_factory=list, max_length=8
    )
    microbatches: list[Annotated[int, Field(ge=0, le=1 << 16)]] = Field(
        default_factory=list, max_length=8
    )


class PlanRequest(Strict):
    """Exactly one model source (`model` SPEC, or `graph_ids`: uploaded graphs, one per
    training variant) and exactly one limit: `budget_bytes`; `threshold`, a fraction of
    the device's memory the bound may reach (`budget_bytes` in the answer is then the
    device's total); or `budget_fraction`, a budget of that share of it. Objective
    `throughput` (default): the largest B*G per unit of
    recompute/precision cost; `effective_batch`: the largest B*G."""

    model: ModelIn | None = None
    config: ConfigFileIn | None = None  # the run as its framework's config file states it
    graph_ids: list[GraphId] | None = Field(default=None, min_length=1, max_length=64)
    budget_bytes: Bytes | None = Field(default=None, ge=1)
    budget_fraction: float | None = Field(default=None, gt=0, le=1)
    device: Device = "h100-80gb"
    metric: Metric | None = None
    threshold: float | None = Field(default=None, gt=0, le=1)
    use_upper_bound: bool = True
    space: SpaceIn = Field(default_factory=SpaceIn)
    objective: Literal["throughput", "effective_batch"] = "throughput"
    top: int = Field(default=5, ge=1, le=50)
    apply_correction: bool = True
    method: Method = "auto"
    replay_budget_ms: ReplayBudget = None

    @model_validator(mode="after")
    def _one_each(self) -> PlanRequest:
        if (self.model is None and self.config is None) == (self.graph_ids is None):
            raise ValueError("give exactly one of model (or config), graph_ids")
        _check_spec(self.model, self.config)
        limits = ("budget_bytes", "budget_fraction", "threshold")
        given = [n for n in limits if getattr(self, n) is not None]
        if len(given) != 1:
            raise ValueError(
                f"give exactly one of budget_bytes, threshold, budget_fraction, got "
                f"{' and '.join(given) or 'none'}"
            )
        fraction = given[0] != "budget_bytes"
        if fraction and get_profile(self.device).total_bytes is None:
            raise ValueError(f"{given[0]} needs a device with a memory total, not {self.device!r}")
        if get_profile(self.device).kind == "cpu" and self.metric not in (None, "allocated"):
            raise ValueError(f"metric {self.metric!r} needs a GPU device profile, not cpu")
        if self.budget_fraction is not None and not math.isfinite(self.budget_fraction):
            raise ValueError("budget_fraction must be finite")
        return self


class CandidateOut(BaseModel):
    batch_size: int
    grad_accum: int
    checkpointing: str
    precision: str
    objective: float
    bound_bytes: int
    limit_bytes: int
    under_threshold: bool
    graph_id: str
    prediction: dict[str, Any]
    optimizer_impl: str = "auto"
    gpus: int = 1
    sharding: str = "none"
    tp: int = 1
    pp: int = 1
    pp_schedule: str = "1f1b"
    microbatches: int = 1
    stage_peaks: list[int] = Field(default_factory=list)  # --pp: each stage's, by stage
    fsdp_reshard_after_forward: bool = True
    decision: dict[str, Any] = Field(default_factory=dict)  # state, per-sample bytes


class PlanResponse(BaseModel):
    best: CandidateOut | None
    runners_up: list[CandidateOut]
    budget_bytes: int
    limit_bytes: int
    threshold: float  # limit_bytes / budget_bytes (1.0 under budget_bytes)
    objective: str
    queries: int
    graphs: int = 0  # distinct captured graphs the search used
    variants: int = 0  # training configurations searched
    reason: str = ""
    model_version: str
    method: str = "gnn"  # what decided the steps near the limit: replay | gnn | analytic
    replay_skipped: str | None = None
    model: dict[str, Any] | None = None  # what model the answer is about
    train: dict[str, Any] | None = None  # the chosen training step (nested by group)
    graph_seconds: list[float] = Field(default_factory=list)  # per distinct capture
    config: dict[str, Any] | None = None  # what a framework config file said, key by key
    left_out: list[str] = Field(default_factory=list)  # refused by the spec or the capture, why
    # the chosen configuration again at the top (`memgnn plan --json`'s contract); None
    # where nothing fits
    batch_size: int | None = None
    grad_accum: int | None = None
    checkpointing: str | None = None
    precision: str | None = None
    optimizer_impl: str | None = None
    gpus: int | None = None
    sharding: str | None = None
    tp: int | None = None
    pp: int | None = None
    pp_schedule: str | None = None
    microbatches: int | None = None
    stage_peaks: list[int] | None = None
    global_batch: int | None = None
    decision: dict[str, Any] | None = None
    prediction: dict[str, Any] | None = None


class SampleIn(Strict):
    """A live measurement of a config of an uploaded (or spec-captured) graph. `key`, if
    given, makes retries idempotent: a sample with a key already stored is not added.
    Refused (422): a peak below the bytes the graph holds before its step starts, or
    above the device's memory."""

    graph_id: GraphId
    sizes: Sizes
    device: Device
    metric: Metric | None = None
    scenario: Scenario = "worst"
    measured_peak_bytes: Annotated[StrictInt, Field(ge=1, le=1 << 60)]
    key: str | None = Field(default=None, min_length=1, max_length=128)
    source: str | None = Field(
        default=None,
        min_length=1,
        max_length=128,
        description="who measured (a run, host or tool), kept with the sample",
        examples=["governor/run-17"],
    )

    @model_validator(mode="after")
    def _metric_fits_device(self) -> SampleIn:
        if get_profile(self.device).kind == "cpu" and self.metric not in (None, "allocated"):
            raise ValueError(f"metric {self.metric!r} needs a GPU device profile, not cpu")
        return self


class SampleOut(BaseModel):
    stored: bool  # False: a sample with this key was stored before
    sample_id: int
    graph_id: str
    device: str
    metric: str
    model_version: str
    predicted_peak_bytes: int  # the model's own prediction for this config
    upper_bound_bytes: int
    correction: CorrectionOut  # what /predict applies from now on


class SamplesOut(BaseModel):
    graph_id: str
    device: str | None
    metric: str | None
    correction: CorrectionOut | None
    samples: list[dict[str, Any]]


class ReloadIn(Strict):
    model: str | None = Field(default=None, max_length=1024)
