"""Where the answer layer gets its models and graphs: the `Backend` protocol, and
`LocalBackend`, the one the command line and the Python API use.

The layer (`answer.predict`, `answer.plan`) decides what to answer and how; a backend
supplies what differs between a one-shot process and the service: how a model SPEC is
resolved (the server allows only some), where captured graphs come from (the on-disk
cache here; the server's store, memory cache and capture worker with its time budget),
which learned model answers and with what live correction, and how the method is chosen
(the server waits for its replay JIT's warm-up). `serving.answers.EngineBackend` is the
service's.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import replace
from typing import Protocol

from memgnn.predictor.answer.exact import Choice, ExactConfig, ReplayModel, decide
from memgnn.predictor.answer.types import GraphEntry, ModelRef, Served
from memgnn.predictor.capture.query import graph_for_query
from memgnn.predictor.errors import UserError
from memgnn.predictor.ir.graph import StepGraph
from memgnn.predictor.memory.analytic import AnalyticModel
from memgnn.predictor.memory.base import MemoryModel, Query
from memgnn.predictor.memory.features import op_id
from memgnn.predictor.memory.onnx_model import load_default_model
from memgnn.predictor.memory.ops import op_checker, unknown_ops
from memgnn.predictor.spec.bundle import ModelBundle
from memgnn.predictor.spec.train import TrainSpec
from memgnn.predictor.zoo import resolve

__all__ = ["CLI_REPLAY_BUDGET_MS", "Backend", "LocalBackend"]

# A one-shot answer: the compiled replay core's load from numba's on-disk cache (2.19 s,
# benchmarks/results/replay_speed.md "JIT warm-up") fits, its compile (67.59 s) does not;
# the server keeps its per-request 250 ms (`ServeConfig.replay_budget_ms`).
CLI_REPLAY_BUDGET_MS = 5000.0


class Backend(Protocol):
    """What `answer.predict` / `answer.plan` need from where they run."""

    replay_budget_ms: float  # `auto`'s per-request budget when the request gives none

    @property
    def version(self) -> str:
        """The learned model's version (the answer's `model_version` when it answers)."""
        ...

    @property
    def learned_model(self) -> MemoryModel:
        """The learned model as a plain `MemoryModel` (the plan screens with it)."""
        ...

    def bundle(self, ref: ModelRef) -> ModelBundle: ...

    def _unknown_op(self):
        """The learned model's "unknown op" test, without loading the shipped model (its
        vocabulary is the features' op table)."""
        if self._learned is None:
            return lambda op: op_id(op)[1]
        return op_checker(self._learned)

    def entry(self, graph_id: str) -> GraphEntry: ...

    def register(self, graph: StepGraph) -> GraphEntry: ...

    def spec_entry(
        self, bundle: ModelBundle, train: TrainSpec, ref: ModelRef, *, target: str, sm: int,
        sizes: dict[str, int], scenario: str,
    ) -> GraphEntry: ...  # fmt: skip

    def choose(self, method: str, budget_ms: float, entry: GraphEntry) -> Choice: ...

    def learned(
        self, entry: GraphEntry, queries: Sequence[Query], *, correct: bool
    ) -> list[Served]: ...

    def plan_route(
        self, method: str, budget_ms: float, entry: GraphEntry, is_gpu: bool
    ) -> tuple[MemoryModel | None, str, str | None]:
        """For a plan: (the exact model deciding the steps near the limit or None, the
        method that decides them, why the replay was skipped)."""
        ...


class LocalBackend:
    max_captures: int | None = None  # a plan captures every variant it searches

    """This process: models resolved from the zoo / catalog / `hf:` / `py:`, graphs from
    the on-disk capture cache (`use_cache=False`: captured anew, nothing stored), the
    shipped GNN (or `learned`), no live correction, `auto` judged on the JIT's state."""

    def __init__(
        self,
        *,
        use_cache: bool = True,
        capture_mode: str = "blocks",
        replay_budget_ms: float = CLI_REPLAY_BUDGET_MS,
        learned: MemoryModel | None = None,
    ):
        self.use_cache, self.capture_mode = use_cache, capture_mode
        self.replay_budget_ms = replay_budget_ms
        self._learned = learned
        self._entries: dict[str, GraphEntry] = {}
        self._lock = threading.Lock()

    @property
    def learned_model(self) -> MemoryModel:
        with self._lock:
            if self._learned is None:
                self._learned = load_default_model()
            return self._learned

    @property
    def version(self) -> str:
        return self.learned_model.version

    def bundle(self, ref: ModelRef) -> ModelBundle:
        try:
            return resolve(ref.spec, ref.args, ref.task)
        except UserError:
            raise
        except ValueError as exc:
            raise UserError(str(exc), loc=("model",)) from None

    def _entry(self, graph: StepGraph) -> GraphEntry:
        gid = graph.graph_id
        with self._lock:
            hit = self._entries.get(gid)
        if hit is not None:
            return hit
        entry = GraphEntry(
            graph=graph, graph_id=gid, n_nodes=sum(p.num_nodes for p in graph.paths),
            unknown_ops=unknown_ops(graph, self._unknown_op()),
            model_version=self._learned.version if self._learned is not None else "",
        )  # fmt: skip
        with self._lock:
            self._entries[gid] = entry
        return entry

    def _unknown_op(self):
        """The learned model's "unknown op" test, without loading the shipped model (its
        vocabulary is the features' op table)."""
        if self._learned is None:
            return lambda op: op_id(op)[1]
        return op_checker(self._learned)

    def entry(self, graph_id: str) -> GraphEntry:
        with self._lock:
            hit = self._entries.get(graph_id)
        if hit is None:
            raise UserError(
                f"unknown graph id {graph_id!r}: give the graph itself", loc=("graph_id",)
            )
        return hit

    def register(self, graph: StepGraph) -> GraphEntry:
        return self._entry(graph)

    def spec_entry(
        self, bundle: ModelBundle, train: TrainSpec, ref: ModelRef, *, target: str, sm: int,
        sizes: dict[str, int], scenario: str,
    ) -> GraphEntry:  # fmt: skip
        graph = graph_for_query(
            bundle, train, sizes, target=target, sm=sm, scenario=scenario,
            use_cache=self.use_cache, capture_mode=self.capture_mode,
        )  # fmt: skip
        return self._entry(graph)

    def choose(self, method: str, budget_ms: float, entry: GraphEntry) -> Choice:
        return decide(method, entry.graph, ExactConfig(budget_s=budget_ms / 1e3))

    def learned(
        self, entry: GraphEntry, queries: Sequence[Query], *, correct: bool
    ) -> list[Served]:
        model = self.learned_model
        preds = model.predict(entry.graph, queries)
        if isinstance(model, AnalyticModel):  # no learned model ships: the sweep answers
            preds = [replace(p, method="analytic") for p in preds]
        return [Served(prediction=p, raw=p) for p in preds]

    def plan_route(
        self, method: str, budget_ms: float, entry: GraphEntry, is_gpu: bool
    ) -> tuple[MemoryModel | None, str, str | None]:
        """`auto` and `replay` replay near the limit on a GPU target (the JIT loads from
        numba's cache in seconds, as long as a plan's captures take); a CPU target has no
        allocator to replay (the sweep is its answer)."""
        if method in ("gnn", "analytic"):
            return None, method, None
        if not is_gpu:
            return None, "gnn", "cpu target: no allocator to replay"
        return ReplayModel(), "replay", None
