"""`EngineBackend`: the answer layer on the service's engine (the served model with its
live correction; the route's method for a plan)."""

from __future__ import annotations

import pytest
from memgnn.predictor.answer.predict import predict
from memgnn.predictor.answer.types import PredictRequest, QueryConfig
from memgnn.predictor.capture.capture import capture
from memgnn.predictor.memory.analytic import AnalyticModel
from memgnn.predictor.memory.base import Query
from memgnn.predictor.spec.train import TrainSpec
from memgnn.serving.answers import EngineBackend
from memgnn.serving.config import ServeConfig
from memgnn.serving.engine import Engine
from memgnn.serving.routing import Route
from memgnn.serving.store import Store
from tiny_models import tiny_mlp_bundle


@pytest.fixture
def engine(tmp_path):
    config = ServeConfig(state_dir=tmp_path, model="analytic")
    eng = Engine(config, Store(config.db_url), AnalyticModel())
    yield eng
    eng.close()


def test_the_served_model_answers_with_its_live_correction(engine):
    graph = capture(tiny_mlp_bundle(), TrainSpec())
    backend = EngineBackend(engine, route=Route(method="gnn", budget_ms=250))
    entry = backend.register(graph)
    q = Query(sizes={"B": 8}, device="a100-80gb")
    raw = backend.learned(entry, [q], correct=True)[0].raw
    for i in range(3):  # measurements 2x the model's answer
        engine.add_sample(graph_id=entry.graph_id, query=q, key=f"k{i}",
                          measured_bytes=2 * raw.predicted_peak_bytes)  # fmt: skip
    req = PredictRequest(graph_id=entry.graph_id, configs=[QueryConfig(sizes={"B": 8},
                         device="a100-80gb")], method="gnn")  # fmt: skip
    (a,) = predict(req, backend).predictions
    assert a.uncorrected_peak_bytes == raw.predicted_peak_bytes
    assert a.correction["samples"] == 3 and a.predicted_peak_bytes > raw.predicted_peak_bytes
    exact = predict(PredictRequest(graph_id=entry.graph_id, configs=req.configs,
                                   method="analytic"), backend).predictions[0]  # fmt: skip
    assert exact.correction["samples"] == 0  # an exact answer is never corrected


def test_a_plan_route_asks_by_name(engine):
    backend = EngineBackend(engine, route=Route(method="auto", budget_ms=250))
    entry = backend.register(capture(tiny_mlp_bundle(), TrainSpec()))
    assert backend.plan_route("analytic", 250, entry, True) == (None, "analytic", None)
    assert backend.plan_route("auto", 250, entry, False)[1] == "gnn"  # no allocator on cpu
    assert backend.max_captures == engine.config.max_captures_per_request
