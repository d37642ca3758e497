"""The learned memory model served by onnxruntime: `OnnxMemoryModel` and the shipped default.

A model directory holds `encoder.onnx`, `head.onnx` and `model_card.json` (written by
`memgnn train`). `encode(graph)` runs the encoder once per graph path and caches the
embeddings by graph id; `predict_encoded(embedding, graph, queries)` computes the query
features (`predictor.memory.query_features`: per query through the compiled one-query path for a
few queries, vectorised for more) and runs the head once for all (query, path) pairs.
Predicted bytes = analytic estimate x exp(correction); the upper bound likewise, calibrated
per (target kind, metric) where the card has a `bound_calibration`
(`predictor.memory.calibration`), and never below the prediction. Neither is ever below the
floors of `predictor.memory.trust` (the sweep's exact tensor peak, whole 2 MiB segments for
reserved), and where the sweep is exact (CPU allocated bytes: `trust.exact_reason`) the
answer is the sweep itself, its bound too, and `breakdown["exact"]` says why; past the
card's `training_range` in B the correction learned at the range's edge is applied and the
answer says so in
`breakdown["extrapolated"]`. Sizes that break the graph's guards are refused
(`predict.GuardViolation`). A multi-path graph reports the worst path and each path's values.

`load_default_model()` returns the model shipped in `predictor/memory/default_model/`, or the
analytic baseline with a warning when none is shipped.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from memgnn.predictor.ir.graph import StepGraph
from memgnn.predictor.ir.vocab import METRICS
from memgnn.predictor.memory.analytic import AnalyticModel
from memgnn.predictor.memory.base import MemoryModel, Prediction, Query, check_guards
from memgnn.predictor.memory.calibration import (
    derived_log,
    group_key,
    outside_range,
    served_bound_log,
)
from memgnn.predictor.memory.features import (
    FEATURE_SCHEMA_VERSION,
    NUM_NODE_FEATURES,
    NUM_QUERY_FEATURES,
    graph_inputs,
)
from memgnn.predictor.memory.query_features import PathContext
from memgnn.predictor.memory.trust import (
    batch_cap,
    exact_reason,
    extrapolation_notes,
    floors,
    trust_fields,
)

log = logging.getLogger(__name__)

DEFAULT_MODEL_DIR = Path(__file__).parent / "default_model"
CARD = "model_card.json"
CACHE_SIZE = 32
ANSWER_CACHE_SIZE = 4096  # (graph, query) answers remembered (`predict_encoded`)
# A learned correction (measured / analytic) is clipped to [1/16, 16]: far beyond the
# analytic baseline's errors on the shipped model's validation split (relative error p95
# 0.28, max 1.63: model card analytic_baseline), so a larger one is the network
# extrapolating (a graph far smaller or larger than any it saw), not a step's memory;
# the answer says so in breakdown["extrapolated"].
MAX_CORRECTION = 16.0
MAX_LOG_CORRECTION = float(np.log(MAX_CORRECTION))
# up to this many queries a request takes the one-query path per query, above it the
# batch one (`query_features`): one query costs ~0.07 ms there, a batch call ~0.7 ms
# whatever its size (`benchmarks/capture_speed.py --query-only`)
FEW_QUERIES = 4


def read_card(directory: str | Path) -> dict[str, Any]:
    """The model card of a model directory; ValueError when missing, unreadable or built
    for another feature schema."""
    path = Path(directory) / CARD
    if not path.is_file():
        raise ValueError(f"{directory}: not a memgnn model directory (no {CARD})")
    try:
        card = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: unreadable model card ({exc})") from None
    version = card.get("feature_schema_version")
    if version != FEATURE_SCHEMA_VERSION:
        raise ValueError(
            f"{directory}: model was trained with feature schema version {version!r}, but "
            f"this memgnn computes version {FEATURE_SCHEMA_VERSION}; retrain it (memgnn "
            "train) or use a memgnn release that matches the model"
        )
    expect = {"num_node_features": NUM_NODE_FEATURES, "num_query_features": NUM_QUERY_FEATURES}
    for key, want in expect.items():
        if card.get(key) != want:
            raise ValueError(f"{directory}: model card {key}={card.get(key)!r}, expected {want}")
    return card


def _session(path: Path):
    import onnxruntime as ort

    if not path.is_file():
        raise ValueError(f"model file missing: {path}")
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


class OnnxMemoryModel:
    """A `MemoryModel` backed by onnxruntime (CPU execution provider).

    Thread-safe: onnxruntime sessions may run concurrently, the caches are guarded by a
    lock, and the work behind a cache miss runs outside it (two threads missing at once
    both compute the same value; one is kept)."""

    thread_safe = True

    def __init__(self, directory: Path, card: dict[str, Any]):
        self.directory = directory
        self.card = card
        self.version: str = card["model_version"]
        onnx = card.get("onnx", {})
        self._encoder = _session(directory / onnx.get("encoder", "encoder.onnx"))
        self._head = _session(directory / onnx.get("head", "head.onnx"))
        self._embeddings: OrderedDict[str, np.ndarray] = OrderedDict()
        self._contexts: OrderedDict[str, list[PathContext]] = OrderedDict()
        self._ids: OrderedDict[int, tuple[StepGraph, str]] = OrderedDict()
        self._unknown: OrderedDict[str, list[str]] = OrderedDict()
        self._answers: OrderedDict[tuple[Any, ...], Prediction] = OrderedDict()
        self._lock = threading.Lock()
        # the card's training range, its per-feature bounds as arrays once (not per query)
        self._range = dict(card.get("training_range") or {})
        span = self._range.get("query_features")
        if span is not None:
            arrays = {k: np.asarray(span[k], dtype=np.float64) for k in ("min", "max") if k in span}
            self._range["query_features"] = {**span, **arrays}

    def _get(self, cache: OrderedDict, key: Any) -> Any:
        with self._lock:
            hit = cache.get(key)
            if hit is not None:
                cache.move_to_end(key)
            return hit

    def _put(self, cache: OrderedDict, key: Any, value: Any, limit: int = CACHE_SIZE) -> None:
        with self._lock:
            cache[key] = value
            cache.move_to_end(key)
            while len(cache) > limit:
                cache.popitem(last=False)

    @classmethod
    def load(cls, directory: str | Path) -> OnnxMemoryModel:
        directory = Path(directory)
        return cls(directory, read_card(directory))

    def graph_id(self, graph: StepGraph) -> str:
        """The graph's content id, remembered per graph object (hashing is not free)."""
        hit = self._get(self._ids, id(graph))
        if hit is not None and hit[0] is graph:
            return hit[1]
        gid = graph.graph_id
        self._put(self._ids, id(graph), (graph, gid))
        return gid

    def encode(self, graph: StepGraph) -> np.ndarray:
        """Embeddings [paths, dim] of a graph, cached by graph id."""
        gid = self.graph_id(graph)
        hit = self._get(self._embeddings, gid)
        if hit is not None:
            return hit
        rows, unknown = [], set()
        for k in range(len(graph.paths)):
            inputs = graph_inputs(graph, k)
            unknown.update(inputs.unknown_ops)
            names = ("x", "in_src", "in_ptr", "out_dst", "out_ptr")
            rows.append(self._encoder.run(None, dict(zip(names, (inputs.x, *inputs.csr()))))[0])
        emb = np.concatenate(rows).astype(np.float32)
        if unknown:
            log.info("graph %s: ops outside the vocabulary (hashed): %s", gid[:8], sorted(unknown))
        self._put(self._unknown, gid, sorted(unknown))
        self._put(self._embeddings, gid, emb)
        return emb

    def _path_contexts(self, graph: StepGraph) -> list[PathContext]:
        gid = self.graph_id(graph)
        ctx = self._get(self._contexts, gid)
        if ctx is None:
            ctx = [PathContext(graph, k) for k in range(len(graph.paths))]
            self._put(self._contexts, gid, ctx)
        return ctx

    def head(self, embedding: np.ndarray, query: np.ndarray) -> np.ndarray:
        """Raw head outputs [Q, 6] (log corrections, then log upper bounds)."""
        return self._head.run(None, {"embedding": embedding, "query": query})[0]

    def predict(self, graph: StepGraph, queries: Sequence[Query]) -> list[Prediction]:
        return self.predict_encoded(self.encode(graph), graph, queries)

    def predict_encoded(
        self, embedding: np.ndarray, graph: StepGraph, queries: Sequence[Query]
    ) -> list[Prediction]:
        """Predictions from an embedding `encode(graph)` returned (the head alone). A
        query this model answered before on this graph (same sizes, device, scenario and
        metric: a training job polling its config) is answered as it was then, without the
        features and the head again (`ANSWER_CACHE_SIZE` kept); the others in one batch.
        Live corrections are applied by the caller, after this."""
        gid = self.graph_id(graph)
        keys = [(gid, tuple(sorted(q.sizes.items())), q.device, q.scenario, q.metric)
                for q in queries]  # fmt: skip
        found = [self._get(self._answers, k) for k in keys]
        todo = [i for i, hit in enumerate(found) if hit is None]
        if todo:
            fresh = self._predict_batch(embedding, graph, [queries[i] for i in todo])
            for i, p in zip(todo, fresh):
                self._put(self._answers, keys[i], p.copy(), ANSWER_CACHE_SIZE)
                found[i] = p
        computed = set(todo)
        return [p if i in computed else p.copy() for i, p in enumerate(found)]

    def _predict_batch(
        self, embedding: np.ndarray, graph: StepGraph, queries: Sequence[Query]
    ) -> list[Prediction]:
        """`predict_encoded` for queries not answered before, in one batch."""
        from memgnn.predictor.spec.devices import get_profile

        if not queries:
            return []
        contexts = self._path_contexts(graph)
        if embedding.shape[0] != len(contexts):
            raise ValueError(f"embedding has {embedding.shape[0]} rows, graph has "
                             f"{len(contexts)} paths")  # fmt: skip
        check_guards(graph, queries)
        devices = [get_profile(q.device) for q in queries]
        metrics = [METRICS.index(q.resolved_metric(d.is_gpu)) for q, d in zip(queries, devices)]
        asks = [(q.sizes, d, q.scenario) for q, d in zip(queries, devices)]
        results = _query(contexts, asks)
        # past the corpus's batch range the head sees the query at the range's edge and its
        # correction applies to the analytic estimate at the real size (predictor.memory.trust)
        rng = self._range
        edge = [(_at_batch(q.sizes, batch_cap(q.sizes, graph.symbols, rng)), d, q.scenario)
                for q, d in zip(queries, devices)]  # fmt: skip
        seen = results
        if any(e[0] != a[0] for e, a in zip(edge, asks)):
            seen = _query(contexts, edge)
        n_paths = len(contexts)
        rows = [r.features for per in seen for r in per]
        feats = rows[0][None] if len(rows) == 1 else np.stack(rows)
        emb = embedding.astype(np.float32, copy=False)
        if len(queries) > 1:
            emb = np.tile(emb, (len(queries), 1))
        out = self.head(emb, feats).astype(np.float64).reshape(len(queries), n_paths, 6)
        unknown = self._get(self._unknown, self.graph_id(graph)) or []
        preds = []
        for qi, per in enumerate(results):
            m, device = metrics[qi], devices[qi]
            analytic = np.array([r.analytic[m] for r in per])
            floor = np.array([floors(r.breakdown["tensor_peak_bytes"], device.is_gpu,
                                     r.breakdown["context_bytes"])[m] for r in per])  # fmt: skip
            raw = out[qi, :, [m, 3 + m]]  # [2, paths] log corrections: value, upper bound
            log_corr = np.clip(raw, -MAX_LOG_CORRECTION, MAX_LOG_CORRECTION)
            exact = exact_reason(graph, device.is_gpu, METRICS[m])
            notes = [extrapolation_notes(queries[qi].sizes, graph.symbols, rng, s.features)
                     for s in seen[qi]]  # fmt: skip
            cal = (self.card.get("bound_calibration") or {}).get(
                group_key(device.is_gpu, METRICS[m])
            )
            outside = outside_range(log_corr[0], cal) | (raw[0] != log_corr[0])
            fell = np.zeros(n_paths, dtype=bool)
            if exact is not None:  # the sweep is the label: nothing learned may move it
                log_corr[:] = 0.0
                value = upper = floor
            else:  # out of distribution: the network-free bound (predictor.memory.trust)
                ood = np.array([bool(n) or bool(unknown) for n in notes]) | outside
                derived = None
                if (cal or {}).get("form") == "derived":  # device total = reserved + context
                    res = np.clip(out[qi, :, [1, 4]], -MAX_LOG_CORRECTION, MAX_LOG_CORRECTION)
                    res_cal = self.card["bound_calibration"].get(group_key(True, "reserved"))
                    res_bound = served_bound_log(res[0], res[1], res_cal, ood)[1]
                    derived = derived_log([r.analytic[1] for r in per], analytic, res_bound)
                log_corr[0], log_bound, fell = served_bound_log(
                    log_corr[0], log_corr[1], cal, ood, derived
                )
                value = np.maximum(np.round(analytic * np.exp(log_corr[0])), floor)
                log_bound = np.minimum(log_bound, MAX_LOG_CORRECTION)
                upper = np.ceil(np.maximum(analytic * np.exp(log_bound), value))
            worst = int(np.argmax(value))
            breakdown = dict(per[worst].breakdown)
            extra = breakdown["workspace_bytes"] + (breakdown["context_bytes"] if m == 2 else 0)
            notes = notes[worst]
            if exact is None and np.any(raw != np.clip(raw, -MAX_LOG_CORRECTION,
                                                       MAX_LOG_CORRECTION)):  # fmt: skip
                notes.append(f"the network's correction (x{np.exp(raw.max()):.3g} / "
                             f"x{np.exp(raw.min()):.3g}) is outside x{MAX_CORRECTION:g}"
                             "^(+-1): clipped there (onnx_model.MAX_CORRECTION)")  # fmt: skip
            trust = trust_fields(exact=exact, notes=notes, unknown_ops=unknown, cal=cal,
                                 fell_back=bool(fell.any()),
                                 correction_outside=bool(outside[worst]))  # fmt: skip
            breakdown.update(workspace_and_context_bytes=extra, analytic_bytes=int(analytic[worst]),
                             correction=float(np.exp(log_corr[0, worst])),
                             floor_bytes=int(floor[worst]), extrapolated=notes,
                             unknown_ops=unknown, exact=exact, trust=trust)  # fmt: skip
            paths = [
                {"conditions": c.graph.paths[c.path].conditions,
                 "predicted_peak_bytes": int(v), "upper_bound_bytes": int(u)}
                for c, v, u in zip(contexts, value, upper)
            ]  # fmt: skip
            preds.append(
                Prediction(
                    predicted_peak_bytes=int(value[worst]),
                    upper_bound_bytes=int(upper.max()),
                    metric=METRICS[m],
                    breakdown=breakdown,
                    model_version=self.version,
                    paths=paths,
                    method="gnn",
                )
            )
        return preds


def _query(contexts: list[PathContext], asks: list) -> list[list[Any]]:
    """Per query, each path's `QueryResult`: one at a time (`PathContext.query`, a fixed
    cost each) for a few queries, vectorised (`query_many`) for more; the same bits."""
    if len(asks) <= FEW_QUERIES:
        return [[c.query(*a) for c in contexts] for a in asks]
    return [list(per) for per in zip(*(c.query_many(asks) for c in contexts))]


def _at_batch(sizes: dict[str, int], cap: int | None) -> dict[str, int]:
    """`sizes` with B lowered to `cap` where it is above it."""
    if cap is None or sizes.get("B", 0) <= cap:
        return sizes
    return {**sizes, "B": cap}


def load_default_model(directory: str | Path | None = None) -> MemoryModel:
    """The shipped learned model, or `AnalyticModel` (with a warning) if none is shipped."""
    path = Path(directory) if directory is not None else DEFAULT_MODEL_DIR
    if not (path / CARD).is_file():
        log.warning("no learned model shipped in %s: using the analytic baseline", path)
        return AnalyticModel()
    return OnnxMemoryModel.load(path)
