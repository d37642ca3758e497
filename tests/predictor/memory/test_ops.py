"""Which ops a memory model knows."""

from __future__ import annotations

from memgnn.predictor.capture.capture import capture
from memgnn.predictor.memory.analytic import AnalyticModel
from memgnn.predictor.memory.ops import Unencoded, as_encoding_model, op_checker, unknown_ops
from memgnn.predictor.spec.train import TrainSpec
from tiny_models import tiny_mlp_bundle


class Vocab:
    version = "v"
    op_vocab = ("mm.default",)

    def predict(self, graph, queries):
        return []


def test_an_op_vocabulary_decides_what_is_unknown():
    graph = capture(tiny_mlp_bundle(), TrainSpec())
    ops = {op for p in graph.paths for op in p.nodes["op"]}
    assert unknown_ops(graph) == []  # every op is a registered torch op
    unknown = unknown_ops(graph, op_checker(Vocab()))
    assert unknown == sorted(ops - {"mm.default"}) and unknown


def test_a_plain_model_is_served_through_unencoded():
    wrapped = as_encoding_model(Vocab())
    assert isinstance(wrapped, Unencoded) and op_checker(wrapped)("mm.default") is False
    assert op_checker(AnalyticModel()) is None
