"""`graph_info`: a graph's counts and byte formulas by category."""

from __future__ import annotations

from memgnn.predictor.capture.capture import capture
from memgnn.predictor.spec.train import TrainSpec
from tiny_models import tiny_mlp_bundle

from memgnn.cli.graph_info import graph_info


def test_parameter_bytes_formula_is_the_weights():
    bundle = tiny_mlp_bundle()
    info = graph_info(capture(bundle, TrainSpec.of(optimizer="sgd")))
    params = sum(p.numel() * 4 for p in bundle.build().parameters())
    (path,) = info["paths"]
    assert int(path["bytes_by_category"]["parameter"]) == params
    assert "B" in path["bytes_by_category"]["activation"]  # activations grow with the batch
    assert "comm" not in path["bytes_by_category"]  # only a sharded step has collectives
