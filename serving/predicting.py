"""`/predict` on the engine: resolve the graph source, batch each graph's configs through
the model in one call, and shape the per-config answers."""

from __future__ import annotations

from typing import Any

from memgnn.predictor.emulate.parallel import annotate
from memgnn.predictor.memory.base import Query
from memgnn.predictor.spec.devices import get_profile
from memgnn.predictor.spec.limits import resolve_limit
from memgnn.serving.captures import Work
from memgnn.serving.engine import Engine, GraphEntry, Served
from memgnn.serving.graphs import RequestError, build_graph
from memgnn.serving.routing import Route, predict_routed


def _entries(
    engine: Engine, req: Any, max_nodes: int, persist: bool, work: Work | None
) -> tuple[list[GraphEntry], list[dict]]:
    """Per config: its graph entry, and its sizes (a spec's example dims filled in)."""
    sizes = [dict(c.sizes) for c in req.configs]
    if req.graph_id is not None:
        entry = engine.entry(req.graph_id)
        return [entry] * len(req.configs), sizes
    if req.graph is not None:
        graph = build_graph(req.graph, max_nodes=max_nodes, loc=("body", "graph"))
        entry, _ = engine.register(graph, persist=persist)
        return [entry] * len(req.configs), sizes
    m = req.model
    bundle = engine.bundle(m.spec, m.args(), m.task)
    try:
        train = m.train.to_spec()
    except ValueError as exc:
        raise RequestError(str(exc), loc=("body", "model", "train")) from None
    entries = []
    for i, config in enumerate(req.configs):
        device = get_profile(config.device)
        try:
            device.check_precision(train.numerics.precision)
        except ValueError as exc:
            raise RequestError(str(exc), loc=("body", "configs", i, "device")) from None
        try:
            sizes[i] = bundle.sizes(config.sizes)
        except ValueError as exc:
            raise RequestError(str(exc), loc=("body", "configs", i, "sizes")) from None
        target = "cuda" if device.is_gpu else "cpu"
        entries.append(
            engine.spec_entry(
                bundle,
                train,
                spec=(m.spec, m.args(), m.task),
                target=target,
                sm=device.sm or 80,
                sizes=sizes[i],
                persist=persist,
                work=work,
            )
        )
    return entries, sizes


def _verdict(req: Any, device: str, p: Any) -> dict[str, Any] | None:
    limit = resolve_limit(
        budget=req.budget_bytes,
        threshold=req.threshold,
        device_total=get_profile(device).total_bytes,
        device=device,
        names=("budget_bytes", "threshold"),
    )
    return None if limit is None else limit.verdict(p.upper_bound_bytes) | {"metric": p.metric}


def run_predict(
    engine: Engine,
    req: Any,
    *,
    max_nodes: int,
    persist: bool = False,
    work: Work | None = None,
    route: Route | None = None,
) -> dict[str, Any]:
    """Answer a validated `PredictRequest` (see `serving.schemas`); `persist`: store
    inline or captured graphs in the database (else only in the memory cache); `work`:
    the request's capture budget (`serving.captures.Work`); `route`: which path answers
    (`serving.routing`; None: the served model)."""
    entries, sizes = _entries(engine, req, max_nodes, persist, work)
    queries = [
        Query(sizes=sz, device=c.device, metric=c.metric, scenario=c.scenario)
        for sz, c in zip(sizes, req.configs)
    ]
    groups: dict[str, list[int]] = {}
    for i, entry in enumerate(entries):
        groups.setdefault(entry.graph_id, []).append(i)
    answers: list[Served | None] = [None] * len(queries)
    for idx in groups.values():
        try:
            group = [queries[i] for i in idx]
            if route is None:
                served = engine.predict(entries[idx[0]], group, correct=req.apply_correction)
            else:
                served = predict_routed(
                    engine, entries[idx[0]], group, route, correct=req.apply_correction
                )
        except RequestError as exc:
            loc = exc.loc
            if len(loc) > 2 and loc[1] == "configs" and isinstance(loc[2], int):
                loc = (*loc[:2], idx[loc[2]], *loc[3:])  # batch index -> request index
            raise RequestError(str(exc), status=exc.status, loc=loc) from None
        for i, one in zip(idx, served):
            answers[i] = one
    unknown = sorted(
        {op for e in {e.graph_id: e for e in entries}.values() for op in e.unknown_ops}
    )
    predictions = []
    for i, (entry, answer, config) in enumerate(zip(entries, answers, req.configs)):
        assert answer is not None, i
        p = answer.prediction
        predictions.append(
            {
                "graph_id": entry.graph_id,
                "config": config.model_dump() | {"sizes": sizes[i]},
                "predicted_peak_bytes": p.predicted_peak_bytes,
                "upper_bound_bytes": p.upper_bound_bytes,
                "metric": p.metric,
                "breakdown": annotate(dict(p.breakdown), entry.graph.train),
                "model_version": p.model_version,
                "method": p.method,
                "paths": p.paths,
                "correction": answer.correction.to_dict(),
                "uncorrected_peak_bytes": answer.raw.predicted_peak_bytes,
                "uncorrected_upper_bound_bytes": answer.raw.upper_bound_bytes,
                "verdict": _verdict(req, config.device, p),
            }
        )
    return {
        "model_version": engine.version,
        "predictions": predictions,
        "unknown_ops": unknown,
        "has_unknown_ops": bool(unknown),
    }
