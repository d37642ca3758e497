"""The answer layer's requests refuse what cannot be answered, naming it."""

from __future__ import annotations

import pytest
from memgnn.predictor.answer.types import (
    Correction,
    ModelRef,
    PredictRequest,
    QueryConfig,
    corrected,
)
from memgnn.predictor.errors import UserError
from memgnn.predictor.memory.base import Prediction


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({}, "give exactly one of model, graph_id, graph"),
        ({"model": ModelRef(spec="mlp"), "graph_id": "ab" * 8}, "exactly one"),
        ({"model": ModelRef(spec="mlp"), "method": "guess"}, "unknown method 'guess'"),
        ({"model": ModelRef(spec="mlp"), "budget": 10, "threshold": 0.5}, "mutually exclusive"),
    ],
)
def test_a_bad_request_is_refused(kw, message):
    with pytest.raises(UserError, match=message):
        PredictRequest(configs=[QueryConfig()], **kw)


def test_configs_and_models_are_checked():
    with pytest.raises(UserError, match="at least one config"):
        PredictRequest(model=ModelRef(spec="mlp"), configs=[])
    with pytest.raises(UserError, match="unknown metric"):
        QueryConfig(metric="peak")
    with pytest.raises(UserError, match="non-empty string") as err:
        ModelRef(spec=" ")
    assert err.value.loc == ("model", "spec")


def test_a_correction_scales_peak_and_bound_never_below_the_peak():
    p = Prediction(predicted_peak_bytes=100, upper_bound_bytes=110, metric="reserved",
                   breakdown={}, model_version="x", method="gnn",
                   paths=[{"predicted_peak_bytes": 100}])  # fmt: skip
    assert corrected(p, Correction()) is p
    c = corrected(p, Correction(peak_scale=1.5, bound_scale=1.0, samples=3))
    assert (c.predicted_peak_bytes, c.upper_bound_bytes) == (150, 150)
    assert c.paths == [{"predicted_peak_bytes": 150}]
