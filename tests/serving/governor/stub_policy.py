"""Test helpers: the governor's Policy over a stub predictor with a known formula.

The stub says a step at micro-batch B, length S needs BASE + PER_TOKEN[C] x B x S bytes
(checkpointing `full` keeps a quarter of the activations), as `allocated` bytes with the
bound equal to the prediction.
"""

from __future__ import annotations

from memgnn.predictor.memory.base import Prediction
from memgnn.predictor.spec.train import TrainSpec
from memgnn.serving.governor.correction import GovernedPredictor
from memgnn.serving.governor.policy import Policy, PolicyConfig
from memgnn.serving.governor.world import World

__all__ = ["BASE", "PER_TOKEN", "StubGraph", "StubModel", "stub_policy"]

BASE = 10_000
PER_TOKEN = {"none": 100, "full": 25}


class StubGraph:
    def __init__(self, train: TrainSpec) -> None:
        self.train = train


class StubModel:
    version = "stub"

    def predict(self, graph, queries):
        per = PER_TOKEN[graph.train.activations.checkpointing]
        out = []
        for q in queries:
            peak = BASE + per * q.sizes["B"] * q.sizes.get("S", 1)
            out.append(
                Prediction(
                    predicted_peak_bytes=peak,
                    upper_bound_bytes=peak,
                    metric="allocated",
                    breakdown={},
                    model_version="stub",
                )
            )
        return out


def stub_policy(capacity: int, config: PolicyConfig, *, world: World | None = None) -> Policy:
    """A Policy deciding with the stub on a device of `capacity` bytes, over two blocks; one
    StubGraph per (checkpointing, precision, grad_accum)."""
    graphs: dict[tuple, StubGraph] = {}

    def graph_for(train: TrainSpec) -> StubGraph:
        key = (train.activations.checkpointing, train.numerics.precision, train.loop.grad_accum)
        return graphs.setdefault(key, StubGraph(train))

    predictor = GovernedPredictor(StubModel(), device="cpu", metric="allocated")
    return Policy(predictor, graph_for, TrainSpec(), config, capacity=capacity, device="cpu",
                  metric="allocated", n_blocks=2, world=world)  # fmt: skip
