"""The serving core, free of HTTP: graphs by id (LRU of decoded graphs and their encoder
output, backed by the store), batched predictions through the model, residual
corrections from live samples, and graphs captured from model specs.

Threads: FastAPI runs handlers in a thread pool; the engine's caches take a lock, the
model is swapped atomically (`set_model`), captures run one at a time.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext

from memgnn.predictor.answer.checks import check_sizes
from memgnn.predictor.answer.predict import MAX_BYTES
from memgnn.predictor.answer.types import Correction, GraphEntry, Served, corrected
from memgnn.predictor.errors import UserError
from memgnn.predictor.ir.graph import StepGraph
from memgnn.predictor.memory.base import EncodingModel, MemoryModel, Prediction, Query
from memgnn.predictor.memory.ops import as_encoding_model, op_checker, unknown_ops
from memgnn.predictor.spec.bundle import ModelBundle
from memgnn.predictor.spec.train import TrainSpec
from memgnn.serving.captures import CaptureWorker, Work
from memgnn.serving.checks import check_measurement
from memgnn.serving.config import ServeConfig
from memgnn.serving.graphs import RequestError, build_graph, decode_body, graph_bytes
from memgnn.serving.metrics import Metrics
from memgnn.serving.store import Sample, Store

log = logging.getLogger(__name__)


class Engine:
    def __init__(
        self, config: ServeConfig, store: Store, model: MemoryModel, metrics: Metrics | None = None
    ):
        self.config, self.store = config, store
        self.metrics = metrics or Metrics()
        self._model = as_encoding_model(model)
        self._lock = threading.Lock()
        self.captures = CaptureWorker(timeout_s=config.capture_timeout_s)
        self._model_lock = threading.Lock()
        self._graphs: OrderedDict[str, GraphEntry] = OrderedDict()
        self._corrections: dict[tuple[str, str, str, str], tuple[float, Correction]] = {}
        self._spec_ids: OrderedDict[str, str] = OrderedDict()
        self._bundles: OrderedDict[str, ModelBundle] = OrderedDict()

    def close(self) -> None:
        """Shutdown: stop the capture worker (a capture in flight answers 503)."""
        self.captures.close()

    # ---- model --------------------------------------------------------------------------
    @property
    def model(self) -> EncodingModel:
        return self._model

    @property
    def thread_safe(self) -> bool:
        return self._model.thread_safe

    @property
    def version(self) -> str:
        return self._model.version

    def set_model(self, model: MemoryModel) -> None:
        """Swap the model; cached encodings and corrections belong to the old one."""
        model = as_encoding_model(model)
        with self._lock:
            self._model = model
            self._graphs.clear()
            self._corrections.clear()
        log.info("serving model %s", model.version)

    # ---- graphs -------------------------------------------------------------------------
    def _guard(self, model: EncodingModel) -> AbstractContextManager:
        """Calls into a model run one at a time unless it says it is thread-safe (the
        learned model keeps unlocked caches; handlers run in a thread pool)."""
        return nullcontext() if model.thread_safe else self._model_lock

    def _make_entry(self, graph: StepGraph, graph_id: str | None = None) -> GraphEntry:
        model = self._model
        with self._guard(model):
            encoding = model.encode(graph)
        return GraphEntry(
            graph=graph,
            graph_id=graph_id or graph.graph_id,
            n_nodes=sum(p.num_nodes for p in graph.paths),
            unknown_ops=unknown_ops(graph, op_checker(model)),
            model_version=model.version,
            encoding=encoding,
        )

    def _remember(self, entry: GraphEntry) -> GraphEntry:
        with self._lock:
            self._graphs[entry.graph_id] = entry
            self._graphs.move_to_end(entry.graph_id)
            while len(self._graphs) > self.config.graph_cache_size:
                self._graphs.popitem(last=False)
        return entry

    def register(
        self, graph: StepGraph, blob: bytes | None = None, *, persist: bool = True
    ) -> tuple[GraphEntry, bool]:
        """Store a graph durably (`persist`) and cache it; (entry, newly stored)."""
        graph_id = graph.graph_id
        with self._lock:
            entry = self._graphs.get(graph_id)
        if entry is not None and entry.model_version == self._model.version:
            return self._remember(entry), False  # cached here: stored when it was cached
        entry = self._make_entry(graph, graph_id)
        if not persist or self.store.has_graph(graph_id):
            return self._remember(entry), False
        blob = blob if blob is not None and blob[:2] == b"\x1f\x8b" else graph_bytes(graph)
        stored = self.store.put_graph(entry.graph_id, blob, entry.n_nodes)
        self.metrics.inc("graphs_uploaded_total")
        return self._remember(entry), stored

    def entry(self, graph_id: str) -> GraphEntry:
        """The cached entry of a graph id, loading it from the store on a miss (404 if none)."""
        with self._lock:
            entry = self._graphs.get(graph_id)
            if entry is not None:
                self._graphs.move_to_end(graph_id)
        if entry is not None and entry.model_version == self._model.version:
            self.metrics.inc("graph_cache_hits_total")
            return entry
        self.metrics.inc("graph_cache_misses_total")
        if entry is not None:  # encoded by a model since replaced
            return self._remember(self._make_entry(entry.graph, graph_id))
        blob = self.store.get_graph(graph_id)
        if blob is None:
            raise RequestError(
                f"unknown graph id {graph_id!r}; upload it to /graphs first",
                status=404,
                loc=("body", "graph_id"),
            )
        raw = decode_body(blob, "gzip", max_bytes=self.config.max_decompressed_bytes)
        graph = build_graph(json.loads(raw), max_nodes=10**9)
        return self._remember(self._make_entry(graph, graph_id))

    def is_warm(self, graph_id: str, pairs: Sequence[tuple[str, str]]) -> bool:
        """Whether predicting (device, metric) pairs on a graph needs no I/O: the entry is
        cached for the current model and every correction is fresh."""
        version, now = self._model.version, time.monotonic()
        with self._lock:
            entry = self._graphs.get(graph_id)
            if entry is None or entry.model_version != version:
                return False
            for device, metric in pairs:
                hit = self._corrections.get((graph_id, device, metric, version))
                if hit is None or hit[0] <= now:
                    return False
        return True

    def cached_graphs(self) -> int:
        with self._lock:
            return len(self._graphs)

    # ---- predictions ------------------------------------------------------------------------
    def predict(
        self, entry: GraphEntry, queries: Sequence[Query], *, correct: bool = True
    ) -> list[Served]:
        """All queries of one graph in one batch through the model, then corrections."""
        model = self._model
        if entry.model_version != model.version:
            entry = self.entry(entry.graph_id)
        check_sizes(entry.graph, queries)
        try:
            with self._guard(model):
                raw = model.predict_encoded(entry.encoding, entry.graph, queries)
        except (UserError, ArithmeticError) as exc:
            raise self._locate(entry, queries, exc) from None
        for i, p in enumerate(raw):
            if not (
                0 <= p.predicted_peak_bytes < MAX_BYTES and 0 <= p.upper_bound_bytes < MAX_BYTES
            ):
                raise RequestError(
                    "sizes too large: the prediction overflows 64-bit bytes",
                    loc=("body", "configs", i, "sizes"),
                )
        out = []
        for q, p in zip(queries, raw):
            # an exact answer (the sweep on CPU allocated, a replay) is not a model's
            # estimate to correct: live samples leave it as it is
            exact = p.method == "replay" or bool(p.breakdown.get("exact"))
            corr = (
                self.correction(entry.graph_id, q.device, p.metric)
                if correct and not exact
                else Correction()
            )
            out.append(Served(prediction=corrected(p, corr), raw=p, correction=corr))
        return out

    def _locate(self, entry: GraphEntry, queries: Sequence[Query], exc: Exception) -> RequestError:
        """A batch failed on the caller's sizes: find the first failing query to name it."""
        for i, q in enumerate(queries):
            try:
                with self._guard(self._model):
                    self._model.predict(entry.graph, [q])
            except (UserError, ArithmeticError) as one:
                return RequestError(f"{one}", loc=("body", "configs", i, "sizes"))
        return RequestError(f"{exc}", loc=("body", "configs"))

    def correction(self, graph_id: str, device: str, metric: str) -> Correction:
        key = (graph_id, device, metric, self._model.version)
        now = time.monotonic()
        with self._lock:
            hit = self._corrections.get(key)
        if hit is not None and hit[0] > now:
            return hit[1]
        corr = self.store.correction(*key)
        with self._lock:
            if len(self._corrections) > 100_000:
                self._corrections.clear()
            self._corrections[key] = (now + self.config.correction_ttl_s, corr)
        return corr

    def add_sample(
        self,
        *,
        graph_id: str,
        query: Query,
        measured_bytes: int,
        key: str | None = None,
        provenance: dict[str, str | None] | None = None,
    ) -> tuple[int, bool, Prediction, Correction]:
        """Store a measurement against the model's own prediction for its config; the
        updated correction is what later predictions get (this process: at once;
        other replicas: within `correction_ttl_s`). A measurement the graph makes
        impossible is refused (`check_measurement`)."""
        entry = self.entry(graph_id)
        served = self.predict(entry, [query], correct=False)[0]
        raw = served.raw
        check_measurement(entry.graph, query, measured_bytes)
        sample = Sample(
            graph_id=graph_id,
            device=query.device,
            metric=raw.metric,
            model_version=self._model.version,
            scenario=query.scenario,
            sizes=query.sizes,
            measured_bytes=measured_bytes,
            predicted_bytes=raw.predicted_peak_bytes,
            bound_bytes=raw.upper_bound_bytes,
            key=key,
            **(provenance or {}),
        )
        row_id, created = self.store.add_sample(sample)
        self.metrics.inc("samples_received_total")
        ckey = (graph_id, query.device, raw.metric, self._model.version)
        with self._lock:
            self._corrections.pop(ckey, None)
        return row_id, created, raw, self.correction(graph_id, query.device, raw.metric)

    # ---- graphs from model specs --------------------------------------------------------
    def bundle(self, spec: str, model_args: dict[str, str], task: str | None) -> ModelBundle:
        if spec.startswith(("hf:", "py:")) and not self.config.allow_local_specs:
            raise RequestError(
                "hf: and py: model specs are disabled on this server "
                "(allow_local_specs); use a zoo name or upload a graph",
                status=403,
                loc=("body", "model", "spec"),
            )
        key = json.dumps([spec, sorted(model_args.items()), task])
        with self._lock:
            bundle = self._bundles.get(key)
        if bundle is None:
            from memgnn.predictor.zoo import resolve

            try:  # zoo args over the server's cap are refused before any model is made
                bundle = resolve(spec, model_args, task, max_arg_scale=self.config.max_hparam_scale)
            except UserError as exc:
                msg = f"{exc}; capture it locally and upload the graph" if exc.loc else str(exc)
                raise RequestError(msg, loc=("body", "model", *exc.loc)) from None
            except ValueError as exc:
                raise RequestError(str(exc), loc=("body", "model")) from None
            with self._lock:
                self._bundles[key] = bundle
                while len(self._bundles) > 64:
                    self._bundles.popitem(last=False)
        return bundle

    def spec_entry(
        self,
        bundle: ModelBundle,
        train: TrainSpec,
        *,
        spec: tuple[str, dict[str, str], str | None],
        target: str,
        sm: int,
        sizes: dict[str, int],
        persist: bool = False,
        work: Work | None = None,
    ) -> GraphEntry:
        """The captured graph of a model spec (memo, then disk cache, then a capture in
        the worker process: see `serving.captures`). `spec`: (spec, model_args, task)
        as the request gave them; `work`: the request's budget."""
        work = work or Work.unbounded()
        static = {d: sizes[d] for d in bundle.static_dims if d in sizes}
        key = json.dumps(
            [bundle.name, bundle.hparams, bundle.fingerprint, train.flat(), target, sm, static],
            sort_keys=True,
            default=str,
        )
        with self._lock:
            graph_id = self._spec_ids.get(key)
        if graph_id is not None:
            try:
                return self.entry(graph_id)
            except RequestError:
                pass
        work.check()
        work.take_capture(bundle.name)
        job = {
            "spec": spec[0],
            "model_args": spec[1],
            "task": spec[2],
            "train": train.flat(),
            "target": target,
            "sm": sm,
            "sizes": sizes,
        }
        t0 = time.perf_counter()
        blob = self.captures.capture(job, work)
        raw = decode_body(blob, "gzip", max_bytes=self.config.max_decompressed_bytes)
        graph = build_graph(json.loads(raw), max_nodes=self.config.max_nodes, loc=("body", "model"))
        log.info("graph of %s ready in %.2fs", bundle.name, time.perf_counter() - t0)
        entry, _ = self.register(graph, blob, persist=persist)
        with self._lock:
            self._spec_ids[key] = entry.graph_id
            while len(self._spec_ids) > 4096:
                self._spec_ids.popitem(last=False)
        return entry
