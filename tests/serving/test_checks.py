"""Request-vs-graph checks: sizes, measurements, zoo hparams (unit level; the HTTP
answers are in test_api_safety.py, test_api_samples.py and test_api_captures.py)."""

from __future__ import annotations

import pytest
from memgnn.predictor.capture.capture import capture
from memgnn.predictor.memory.base import Query
from memgnn.predictor.spec.train import TrainSpec
from memgnn.serving.checks import check_measurement, resident_bytes
from memgnn.serving.graphs import RequestError
from tiny_models import tiny_mlp_bundle


@pytest.fixture(scope="module")
def graph():
    return capture(tiny_mlp_bundle(), TrainSpec.of(optimizer="sgd"))


def test_resident_bytes_are_the_parameters_here(graph):
    """SGD without momentum keeps no state: what is resident at entry is the weights."""
    params = sum(p.numel() * 4 for p in tiny_mlp_bundle().build().parameters())
    assert resident_bytes(graph, Query(sizes={"B": 1}, device="cpu")) == params
    assert resident_bytes(graph, Query(sizes={"B": 1000}, device="cpu")) == params


def test_measurements_out_of_range_name_the_field(graph):
    q = Query(sizes={"B": 8}, device="a100-80gb")
    floor = resident_bytes(graph, q)
    check_measurement(graph, q, floor)
    for bad in (0, -5, floor - 1, 81920 * 2**20 + 1):
        with pytest.raises(RequestError) as err:
            check_measurement(graph, q, bad)
        assert err.value.loc == ("body", "measured_peak_bytes")
