"""Which model the server answers with, and how any `MemoryModel` is served."""

from __future__ import annotations

import pytest
from memgnn.predictor.memory.analytic import AnalyticModel
from memgnn.predictor.memory.base import EncodingModel
from memgnn.predictor.memory.encoded_analytic import EncodedAnalytic
from memgnn.predictor.memory.ops import Unencoded, as_encoding_model
from memgnn.serving.models import load_model


def test_loader_serves_the_analytic_model_encoded():
    model = load_model("analytic")
    assert isinstance(model, EncodedAnalytic) and isinstance(model, EncodingModel)
    assert model.version == AnalyticModel.version
    with pytest.raises(ValueError, match="does not exist"):
        load_model("/no/such/dir")


def test_a_plain_model_is_served_unencoded_and_serialised():
    plain = AnalyticModel()
    assert not isinstance(plain, EncodingModel)  # no encode / predict_encoded
    wrapped = as_encoding_model(plain)
    assert isinstance(wrapped, Unencoded) and isinstance(wrapped, EncodingModel)
    assert wrapped.thread_safe is False and wrapped.version == plain.version
    encoded = EncodedAnalytic()
    assert as_encoding_model(encoded) is encoded
