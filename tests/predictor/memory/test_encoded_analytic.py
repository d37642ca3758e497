"""`EncodedAnalytic` (the served analytic model) answers exactly what `AnalyticModel` answers."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
from memgnn.predictor.capture.capture import capture
from memgnn.predictor.memory.analytic import AnalyticModel
from memgnn.predictor.memory.base import EncodingModel, Query
from memgnn.predictor.memory.encoded_analytic import EncodedAnalytic
from memgnn.predictor.spec.train import TrainSpec


def _queries(graph) -> list[Query]:
    dims = list(graph.symbols)
    sizes = [{d: v for d in dims} for v in (1, 3, 16, 77)]
    out = []
    for sz, (device, metric), scenario in itertools.product(
        sizes,
        [
            ("h100-80gb", None),
            ("v100-16gb", "device_total"),
            ("a100-80gb", "allocated"),
            ("cpu", None),
        ],
        ["worst", "min", "balanced"] if graph.data_symbols else ["worst"],
    ):
        out.append(Query(sizes=sz, device=device, metric=metric, scenario=scenario))
    return out


@pytest.fixture(
    scope="module",
    params=["tiny_mlp", "tiny_gpt", "tiny_moe", "early_exit", "cond_model"],
)
def graph(request):
    import tiny_models as conftest

    bundles = {
        "tiny_mlp": conftest.tiny_mlp_bundle,
        "tiny_gpt": conftest.tiny_gpt_bundle,
        "tiny_moe": lambda: conftest._seq_bundle("moe", conftest.TopKMoE),
        "early_exit": lambda: conftest._seq_bundle("early-exit", conftest.EarlyExit),
        "cond_model": lambda: conftest._seq_bundle("cond", conftest.CondModel),
    }
    train = TrainSpec.of(checkpointing="full") if request.param == "tiny_gpt" else TrainSpec()
    return capture(bundles[request.param](), train)


def test_same_predictions_as_the_analytic_model(graph):
    queries = _queries(graph)
    want = [p.to_dict() for p in AnalyticModel().predict(graph, queries)]
    model = EncodedAnalytic()
    enc = model.encode(graph)
    assert [p.to_dict() for p in model.predict_encoded(enc, graph, queries)] == want
    # one query at a time, and the exact int64 route (no count matrix), agree too
    assert [model.predict_encoded(enc, graph, [q])[0].to_dict() for q in queries] == want
    exact = dataclasses.replace(
        enc, paths=[dataclasses.replace(p, counts=None, count_bound=None) for p in enc.paths]
    )
    assert [p.to_dict() for p in model.predict_encoded(exact, graph, queries)] == want


def test_overflowing_sizes_raise_instead_of_wrapping(graph):
    q = Query(sizes={d: 2**58 for d in graph.symbols}, device="cpu")
    with pytest.raises(ValueError, match="overflows|too large|is over 2147483647"):
        EncodedAnalytic().predict(graph, [q])


def test_empty_batch_and_protocol():
    assert EncodedAnalytic().predict_encoded(None, None, []) == []
    assert isinstance(EncodedAnalytic(), EncodingModel)
    assert EncodedAnalytic.version == AnalyticModel.version
