"""The /explain request as the answer layer's (`serving.explaining`)."""

from __future__ import annotations

import pytest
from memgnn.serving.explaining import ExplainIn, to_explain_request
from pydantic import ValidationError


def test_the_request_carries_model_train_query_and_whatifs():
    req = ExplainIn.model_validate(
        {
            "model": {"spec": "gpt2", "model_args": {"layers": 3}, "train": {"grad_accum": 2}},
            "query": {"sizes": {"B": 4}, "device": "a100-80gb", "metric": "allocated"},
            "top": 7,
            "whatifs": ["checkpointing"],
        }
    )
    got = to_explain_request(req)
    assert got.model.spec == "gpt2" and got.model.args == {"layers": "3"}
    assert got.train.loop.grad_accum == 2 and got.explicit == frozenset({"grad_accum"})
    assert got.config.sizes == {"B": 4} and got.config.metric == "allocated"
    assert got.top == 7 and got.whatifs == ("checkpointing",)


def test_whatifs_default_to_all_and_empty_means_none():
    assert to_explain_request(ExplainIn(model={"spec": "mlp"})).whatifs is None
    assert to_explain_request(ExplainIn(model={"spec": "mlp"}, whatifs=[])).whatifs == ()


def test_exactly_one_source():
    with pytest.raises(ValidationError):
        ExplainIn()
    with pytest.raises(ValidationError):
        ExplainIn(graph_id="ab" * 8, model={"spec": "mlp"})
