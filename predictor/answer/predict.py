"""`predict(PredictRequest, backend) -> PredictAnswer`: the one place a prediction is made.

The command line, the HTTP `/predict` route and the client all come here (the CLI with
`LocalBackend`, the service with its engine's backend), so `memgnn predict --json` prints
the same document with and without `--url`. Per config: the graph whose guards hold at
its sizes (captured or cached by the backend), then one path per graph for all its
configs, chosen by `backend.choose` (`auto`: the exact replay when its cost fits the
budget, else the learned model): the replay and the analytic sweep run here, the learned
model (with the backend's live correction) in the backend. Every answer says which path
ran and why (`breakdown.route`), what model and training step it assumed (`model`,
`train`), and, with a limit, whether it fits (`verdict`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from memgnn.predictor.answer.backend import Backend
from memgnn.predictor.answer.checks import check_sizes
from memgnn.predictor.answer.exact import Choice, ExactConfig, ReplayModel, with_route
from memgnn.predictor.answer.runconfig import apply_run_config
from memgnn.predictor.answer.types import (
    Answer,
    GraphEntry,
    PredictAnswer,
    PredictRequest,
    Served,
)
from memgnn.predictor.capture.model_info import describe_bundle
from memgnn.predictor.capture.query import sizes_used, unused_sizes
from memgnn.predictor.emulate.fsdp_offload import offload_warnings
from memgnn.predictor.emulate.parallel import annotate
from memgnn.predictor.errors import UserError
from memgnn.predictor.ir.graph import StepGraph
from memgnn.predictor.memory.analytic import AnalyticModel
from memgnn.predictor.memory.base import Query
from memgnn.predictor.spec.bundle import ModelBundle
from memgnn.predictor.spec.devices import get_profile
from memgnn.predictor.spec.limits import default_limit, resolve_limit
from memgnn.predictor.spec.train import TrainSpec

log = logging.getLogger(__name__)

__all__ = [
    "MAX_BYTES",
    "answer_entry",
    "autocast_gather",
    "autocast_gather_warnings",
    "model_info",
    "precision_warning",
    "predict",
    "skipped",
]

MAX_BYTES = 1 << 62  # a prediction past this overflowed int64 arithmetic


def predict(req: PredictRequest, backend: Backend) -> PredictAnswer:
    """Answer every config of `req` (see the module docstring); `UserError` (with `loc`,
    the field at fault) for anything wrong with the request."""
    report = None
    if req.run_config is not None:  # the run as its framework's config file states it
        model, train, sizes, report = apply_run_config(
            req.run_config, model=req.model, train=req.train, explicit=req.explicit,
            sizes=[c.sizes for c in req.configs],
        )  # fmt: skip
        configs = [replace(c, sizes=sz) for c, sz in zip(req.configs, sizes)]
        req = replace(req, model=model, train=train, configs=configs, run_config=None)
    bundle = backend.bundle(req.model) if req.model is not None else None
    entries, sizes = _entries(req, backend, bundle)
    queries = []
    for i, (sz, c) in enumerate(zip(sizes, req.configs)):
        q = Query(sizes=sz, device=c.device, metric=c.metric, scenario=c.scenario)
        try:
            q.resolved_metric(get_profile(c.device).is_gpu)
        except ValueError as exc:
            raise UserError(str(exc), loc=("configs", i, "metric")) from None
        queries.append(q)
    budget_ms = backend.replay_budget_ms if req.replay_budget_ms is None else req.replay_budget_ms
    groups: dict[str, list[int]] = {}
    for i, entry in enumerate(entries):
        groups.setdefault(entry.graph_id, []).append(i)
    served: list[Served | None] = [None] * len(queries)
    seconds = [0.0] * len(queries)
    for idx in groups.values():
        entry = entries[idx[0]]
        t0 = time.perf_counter()
        try:
            choice = backend.choose(req.method, budget_ms, entry)
            group = answer_entry(entry, [queries[i] for i in idx], choice, backend,
                                 correct=req.apply_correction)  # fmt: skip
        except UserError as exc:  # a batch index -> the request's config index
            loc = exc.loc
            at = 1 if loc[:1] == ("configs",) else 2 if loc[:2] == ("body", "configs") else 0
            if at and len(loc) > at and isinstance(loc[at], int) and loc[at] < len(idx):
                exc.loc = (*loc[:at], idx[loc[at]], *loc[at + 1 :])
            raise
        took = round(time.perf_counter() - t0, 6)
        for i, one in zip(idx, group):
            served[i], seconds[i] = one, took
    answers = [
        _answer(req, i, entries[i], served[i], sizes[i], bundle, seconds[i])
        for i in range(len(queries))
    ]
    if report is None and (warning := precision_warning(bundle, req.train, req.explicit)):
        answers = [replace(a, warnings=[*a.warnings, warning]) for a in answers]
    if report is not None:
        answers = [replace(a, config=report.to_dict()) for a in answers]
    unknown = sorted(
        {op for e in {e.graph_id: e for e in entries}.values() for op in e.unknown_ops}
    )
    version = answers[0].model_version if len(answers) == 1 else backend.version
    return PredictAnswer(model_version=version, predictions=answers, unknown_ops=unknown)


def _entries(
    req: PredictRequest, backend: Backend, bundle: ModelBundle | None
) -> tuple[list[GraphEntry], list[dict[str, int]]]:
    """Per config: its graph entry, and its sizes (a model's example dims filled in)."""
    sizes = [dict(c.sizes) for c in req.configs]
    if req.graph_id is not None:
        return [backend.entry(req.graph_id)] * len(req.configs), sizes
    if req.graph is not None:
        return [backend.register(req.graph)] * len(req.configs), sizes
    assert bundle is not None and req.model is not None
    entries = []
    for i, config in enumerate(req.configs):
        try:
            device = get_profile(config.device)
            device.check_precision(req.train.numerics.precision)
        except ValueError as exc:
            raise UserError(str(exc), loc=("configs", i, "device")) from None
        try:
            sizes[i] = bundle.sizes(config.sizes)
        except ValueError as exc:
            raise UserError(str(exc), loc=("configs", i, "sizes")) from None
        entries.append(
            backend.spec_entry(
                bundle, req.train, req.model, target="cuda" if device.is_gpu else "cpu",
                sm=device.sm or 80, sizes=sizes[i], scenario=config.scenario,
            )
        )  # fmt: skip
    return entries, sizes


def skipped(choice: Choice) -> str | None:
    """Why an ``auto`` request was not replayed (None where it was, or was not ``auto``)."""
    return choice.reason if choice.asked == "auto" and choice.method != "replay" else None


def answer_entry(
    entry: GraphEntry, queries: Sequence[Query], choice: Choice, backend: Backend, *,
    correct: bool = True,
) -> list[Served]:  # fmt: skip
    """One graph's queries by the chosen path. The learned model's answers carry the
    backend's live correction; the replay and the sweep are exact and never corrected."""
    check_sizes(entry.graph, queries)
    if choice.method == "gnn":
        why = skipped(choice)
        out = []
        for s in backend.learned(entry, queries, correct=correct):
            note = {"replay_skipped": why} if why else {}
            out.append(
                Served(prediction=_routed(s.prediction, choice, note),
                       raw=_routed(s.raw, choice, note), correction=s.correction)
            )  # fmt: skip
        return out
    if choice.method == "replay":
        model: Any = ReplayModel(config=ExactConfig(budget_s=choice.budget_s))
    else:
        model = AnalyticModel()
    out = []
    for i, q in enumerate(queries):  # one at a time: an error names its config
        try:
            (p,) = model.predict(entry.graph, [q])
        except (UserError, ArithmeticError) as exc:
            raise UserError(str(exc), loc=("configs", i, "sizes")) from None
        if not 0 <= p.predicted_peak_bytes < MAX_BYTES:
            raise UserError(
                "sizes too large: the prediction overflows 64-bit bytes",
                loc=("configs", i, "sizes"),
            )
        if choice.method == "analytic":
            p = replace(p, method="analytic")
        p = _routed(p, choice, {})
        out.append(Served(prediction=p, raw=p))
    return out


def _routed(p, choice: Choice, note: dict[str, Any]):
    p = with_route(p, choice)
    return replace(p, breakdown={**p.breakdown, **note}) if note else p


_LOW = {"bfloat16": "bf16", "float16": "fp16"}


def precision_warning(
    bundle: ModelBundle | None, train: TrainSpec, explicit: frozenset[str]
) -> str | None:
    """A warning when the step trains float32 weights (the default `--precision fp32`, not
    chosen by the caller) of a checkpoint stored in bf16/fp16: transformers 5's
    `from_pretrained` loads the checkpoint's dtype unless told otherwise, so a script that
    does not say would train the stored dtype, at about half the weights' bytes."""
    stored = _LOW.get(bundle.stored_dtype or "") if bundle is not None else None
    if stored is None or train.numerics.precision != "fp32" or "precision" in explicit:
        return None
    return (
        f"the checkpoint is stored in {bundle.stored_dtype} (config.json dtype); the answer "
        "trains float32 weights (--precision fp32, the default: from_pretrained(dtype="
        "torch.float32)). transformers 5's from_pretrained loads the stored dtype unless "
        f"told otherwise: --precision {stored} if your script trains the weights as loaded "
        f"(no fp32 master copy), amp-{stored} for fp32 weights with {stored} autocast"
    )


def autocast_gather(train: TrainSpec) -> tuple[str | None, str]:
    """(the low precision autocast casts FSDP2's all-gathered float32 weights to, or None;
    why none): autocast over FSDP2 without a MixedPrecisionPolicy (see
    `autocast_gather_warnings`)."""
    if train.parallel.sharding not in ("fsdp", "hsdp"):
        return None, f"not FSDP2 (--sharding {train.parallel.sharding})"
    if not train.numerics.precision.startswith("amp-"):
        return None, f"--precision {train.numerics.precision} gathers its weights as they are"
    if train.parallel.fsdp_param_dtype != "none":
        return None, f"FSDP2 gathers {train.parallel.fsdp_param_dtype} already"
    return train.numerics.precision.removeprefix("amp-"), ""


def autocast_gather_warnings(train: TrainSpec | None, info: dict[str, Any] | None) -> list[str]:
    """Autocast over FSDP2 without a MixedPrecisionPolicy: the gathered float32 weights are
    cast per use, and autocast's weight-cast cache (leaf parameters that require grad)
    keeps each cast until the autocast region exits, so every layer's unsharded weights
    stay on each rank in the low precision until the forward ends, checkpointed or not
    (without checkpointing autograd saves them too; tests/predictor/answer/test_predict.py
    checks it on a real CPU FSDP2 step). The capture runs PyTorch's autocast, so the
    figure includes them; this says why and what avoids it."""
    low = autocast_gather(train)[0] if train is not None else None
    if low is None:
        return []
    params = int((info or {}).get("parameters") or 0)
    size = f" (up to 2 B x {params:,} parameters = {2 * params:,} B)" if params else ""
    return [
        f"--precision {train.numerics.precision} under FSDP2 without a MixedPrecisionPolicy: "
        f"autocast casts each all-gathered float32 weight to {low} and its weight-cast cache "
        f"keeps every cast until the forward ends, so each rank holds the whole model's "
        f"weights in {low}{size} at the forward's end; --fsdp-param-dtype {low} "
        f"--fsdp-reduce-dtype fp32 (FSDP2's MixedPrecisionPolicy, as torchtitan) gathers "
        f"{low} weights instead (`memgnn explain --whatif fsdp_mixed_precision`)"
    ]


def model_info(
    graph: StepGraph, bundle: ModelBundle | None, train: TrainSpec, target: str
) -> dict[str, Any] | None:
    """What model the answer is about: from the graph's capture, else built on fake
    tensors from the bundle (None for a graph that carries none and no bundle)."""
    info = graph.meta.get("model_info")
    if info is None and bundle is not None:
        info = describe_bundle(bundle, train, target).to_dict()
    if info is None:
        return None
    if bundle is not None and bundle.origin:  # how the user named it, not the cached graph's
        info = info | {"kind": bundle.origin}
    how = graph.meta.get("capture")
    return info | ({"capture": how} if how else {})


_Facts = tuple[TrainSpec | None, dict[str, Any] | None, frozenset[str]]
_FACTS: OrderedDict[str, _Facts] = OrderedDict()
_FACTS_LOCK = threading.Lock()


def _facts(entry: GraphEntry) -> _Facts:
    """Per graph (by its content id), built once: the training spec it was captured under,
    that spec's nested dict, and the size names its formulas use (`sizes_used`). Every
    config of a request asked for them again: 20% of a warm /predict's CPU
    (benchmarks/results/serving_fast.md)."""
    with _FACTS_LOCK:
        hit = _FACTS.get(entry.graph_id)
    if hit is None:
        graph = entry.graph
        train = TrainSpec.from_dict(graph.train) if graph.train else None
        hit = (train, train.to_dict() if train is not None else None, sizes_used(graph))
        with _FACTS_LOCK:
            _FACTS[entry.graph_id] = hit
            while len(_FACTS) > 256:
                _FACTS.popitem(last=False)
    return hit


def _fresh(nested: dict[str, Any] | None) -> dict[str, Any] | None:
    """A copy of a cached nested spec dict an answer may own (the options are scalars)."""
    return None if nested is None else {g: dict(kv) for g, kv in nested.items()}


def _answer(
    req: PredictRequest, i: int, entry: GraphEntry, served: Served | None,
    sizes: dict[str, int], bundle: ModelBundle | None, seconds: float,
) -> Answer:  # fmt: skip
    assert served is not None, i
    config, p, graph = req.configs[i], served.prediction, entry.graph
    device = get_profile(config.device)
    train, train_dict, used = _facts(entry)
    limit = resolve_limit(
        budget=req.budget, threshold=req.threshold, device_total=device.total_bytes,
        device=device.name, names=("budget_bytes", "threshold"),
    ) or default_limit(device.total_bytes)  # fmt: skip
    verdict = None if limit is None else limit.verdict(p.upper_bound_bytes) | {"metric": p.metric}
    target = "cuda" if device.is_gpu else "cpu"
    info = model_info(graph, bundle, train or req.train, target)
    return Answer(
        predicted_peak_bytes=p.predicted_peak_bytes,
        upper_bound_bytes=p.upper_bound_bytes,
        metric=p.metric,
        method=p.method,
        model_version=p.model_version,
        breakdown=annotate(dict(p.breakdown), graph.train, p.paths),
        paths=p.paths,
        sizes=sizes,
        device=device.name,
        scenario=config.scenario,
        graph_id=entry.graph_id,
        model=info,
        train=_fresh(train_dict),
        warnings=unused_sizes(graph, list(config.sizes), used)
        + offload_warnings(train)
        + autocast_gather_warnings(train, info),
        verdict=verdict,
        correction=served.correction.to_dict(),
        uncorrected_peak_bytes=served.raw.predicted_peak_bytes,
        uncorrected_upper_bound_bytes=served.raw.upper_bound_bytes,
        unknown_ops=entry.unknown_ops,
        predict_seconds=seconds,
    )
