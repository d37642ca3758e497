"""`LocalBackend`: graphs by id once seen, the learned model's unknown ops, plan routes."""

from __future__ import annotations

import pytest
from memgnn.predictor.answer.backend import LocalBackend
from memgnn.predictor.answer.exact import ReplayModel
from memgnn.predictor.capture.capture import capture
from memgnn.predictor.errors import UserError
from memgnn.predictor.memory.analytic import AnalyticModel
from memgnn.predictor.spec.train import TrainSpec
from tiny_models import tiny_mlp_bundle


def test_a_registered_graph_is_known_by_id_and_an_unknown_id_is_a_user_error():
    backend = LocalBackend(learned=AnalyticModel())
    graph = capture(tiny_mlp_bundle(), TrainSpec())
    entry = backend.register(graph)
    assert backend.entry(graph.graph_id) is entry and entry.n_nodes > 0
    with pytest.raises(UserError, match="unknown graph id") as err:
        backend.entry("f" * 16)
    assert err.value.loc == ("graph_id",)


def test_unknown_ops_are_the_learned_models_without_loading_it():
    backend = LocalBackend()  # the shipped model: its vocabulary is the features' op table
    entry = backend.register(capture(tiny_mlp_bundle(), TrainSpec()))
    assert entry.unknown_ops == [] and backend._learned is None


def test_plan_route_replays_near_the_limit_on_a_gpu_only():
    backend = LocalBackend(learned=AnalyticModel())
    entry = backend.register(capture(tiny_mlp_bundle(), TrainSpec()))
    exact, method, why = backend.plan_route("auto", 250, entry, True)
    assert isinstance(exact, ReplayModel) and method == "replay" and why is None
    assert backend.plan_route("auto", 250, entry, False) == (
        None, "gnn", "cpu target: no allocator to replay"
    )  # fmt: skip
    assert backend.plan_route("analytic", 250, entry, True) == (None, "analytic", None)
