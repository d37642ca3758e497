"""The answer layer on the service's engine: `EngineBackend` is where `answer.predict` and
`answer.plan` get models, graphs, the served model and the route when the HTTP API asks.

Against `LocalBackend` (the command line's): model SPECs pass the server's rules
(`allow_local_specs`, hparam caps), graphs come from the engine's memory cache and store
or are captured in its worker process under the request's budget (`Work`), the served
model answers with the live-sample correction, and the route waits for (or skips) the
replay JIT's warm-up (`serving.routing.choose`).
"""

from __future__ import annotations

from collections.abc import Sequence

from memgnn.predictor.answer.exact import Choice
from memgnn.predictor.answer.types import GraphEntry, ModelRef, Served
from memgnn.predictor.ir.graph import StepGraph
from memgnn.predictor.memory.base import MemoryModel, Prediction, Query
from memgnn.predictor.spec.bundle import ModelBundle
from memgnn.predictor.spec.train import TrainSpec
from memgnn.serving.captures import Work
from memgnn.serving.engine import Engine
from memgnn.serving.routing import Route, choose, plan_exact

__all__ = ["EngineBackend", "EngineModel"]


class EngineModel:
    """The served model as a `MemoryModel` over the engine's entries (cached encodings,
    live corrections): what the plan screens with."""

    def __init__(self, backend: EngineBackend, *, correct: bool):
        self.backend, self.correct = backend, correct
        self.version = backend.engine.version

    def predict(self, graph: StepGraph, queries: Sequence[Query]) -> list[Prediction]:
        entry = self.backend.entry_of(graph)
        return [s.prediction for s in self.backend.learned(entry, queries, correct=self.correct)]


class EngineBackend:
    """`predictor.answer.backend.Backend` on an `Engine` (see the module docstring).
    `persist`: store inline or captured graphs durably (a caller who may write);
    `work`: the request's capture budget; `route`: the method and its budget."""

    def __init__(
        self,
        engine: Engine,
        *,
        route: Route,
        persist: bool = False,
        work: Work | None = None,
        max_nodes: int | None = None,
        correct: bool = True,
    ):
        self.engine, self.route, self.persist, self.work = engine, route, persist, work
        self.max_nodes = max_nodes or engine.config.max_nodes
        self.replay_budget_ms = route.budget_ms
        self.correct = correct
        self._by_graph: dict[int, GraphEntry] = {}

    @property
    def version(self) -> str:
        return self.engine.version

    @property
    def learned_model(self) -> MemoryModel:
        return EngineModel(self, correct=self.correct)

    def _known(self, entry: GraphEntry) -> GraphEntry:
        self._by_graph[id(entry.graph)] = entry
        return entry

    def entry_of(self, graph: StepGraph) -> GraphEntry:
        """The entry of a graph this backend handed out (the plan asks by graph)."""
        return self._by_graph[id(graph)]

    def bundle(self, ref: ModelRef) -> ModelBundle:
        return self.engine.bundle(ref.spec, ref.args, ref.task)

    def entry(self, graph_id: str) -> GraphEntry:
        return self._known(self.engine.entry(graph_id))

    def register(self, graph: StepGraph) -> GraphEntry:
        return self._known(self.engine.register(graph, persist=self.persist)[0])

    def spec_entry(
        self, bundle: ModelBundle, train: TrainSpec, ref: ModelRef, *, target: str, sm: int,
        sizes: dict[str, int], scenario: str,
    ) -> GraphEntry:  # fmt: skip
        return self._known(
            self.engine.spec_entry(
                bundle, train, spec=(ref.spec, ref.args, ref.task), target=target, sm=sm,
                sizes=sizes, persist=self.persist, work=self.work,
            )
        )  # fmt: skip

    def choose(self, method: str, budget_ms: float, entry: GraphEntry) -> Choice:
        route = Route(method=method, budget_ms=budget_ms, warmup=self.route.warmup,
                      wait_s=self.route.wait_s)  # fmt: skip
        return choose(route, entry)

    def learned(
        self, entry: GraphEntry, queries: Sequence[Query], *, correct: bool
    ) -> list[Served]:
        return self.engine.predict(entry, queries, correct=correct)

    @property
    def max_captures(self) -> int:
        return self.engine.config.max_captures_per_request

    def plan_route(
        self, method: str, budget_ms: float, entry: GraphEntry, is_gpu: bool
    ) -> tuple[MemoryModel | None, str, str | None]:
        route = Route(method=method, budget_ms=budget_ms, warmup=self.route.warmup,
                      wait_s=self.route.wait_s)  # fmt: skip
        return plan_exact(route, entry, is_gpu)
