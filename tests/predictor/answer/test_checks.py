"""A query's sizes against its graph, before any model answers."""

from __future__ import annotations

import pytest
from memgnn.predictor.answer.checks import check_sizes
from memgnn.predictor.capture.capture import capture
from memgnn.predictor.errors import UserError
from memgnn.predictor.memory.base import Query
from memgnn.predictor.spec.train import TrainSpec
from tiny_models import tiny_mlp_bundle


@pytest.fixture(scope="module")
def graph():
    return capture(tiny_mlp_bundle(), TrainSpec.of(optimizer="sgd"))


def test_sizes_are_checked_per_config_naming_the_config(graph):
    check_sizes(graph, [Query(sizes={"B": 2})])
    with pytest.raises(UserError, match="size for symbol 'B' is missing") as err:
        check_sizes(graph, [Query(sizes={"B": 2}), Query(sizes={"S": 2})])
    assert err.value.loc == ("configs", 1, "sizes")
