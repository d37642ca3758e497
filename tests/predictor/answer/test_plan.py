"""`plan(PlanRequest, backend)`: the chosen configuration, its runners-up and its reasons."""

from __future__ import annotations

import pytest
from memgnn.predictor.answer.backend import LocalBackend
from memgnn.predictor.answer.plan import PlanRequest, plan
from memgnn.predictor.answer.types import ModelRef
from memgnn.predictor.errors import UserError
from memgnn.predictor.memory.analytic import AnalyticModel


@pytest.fixture(scope="module")
def backend():
    return LocalBackend(learned=AnalyticModel())


def test_the_chosen_batch_fits_and_the_next_power_does_not(backend):
    req = PlanRequest(model=ModelRef(spec="mlp"), budget="64MiB", device="a100-80gb",
                      method="analytic", space={"max_batch": 1 << 16})  # fmt: skip
    out = plan(req, backend).to_dict()
    assert out["best"]["under_threshold"]
    b = out["batch_size"]
    assert out["best"]["bound_bytes"] <= out["limit_bytes"] == 64 << 20
    assert out["global_batch"] == b * out["grad_accum"] * out["gpus"]
    assert out["train"]["loop"]["grad_accum"] == out["grad_accum"]
    assert out["model"]["spec"] == "mlp" and out["method"] == "analytic"


def test_nothing_fits_says_why_and_chooses_nothing(backend):
    req = PlanRequest(model=ModelRef(spec="mlp"), budget=4096, device="a100-80gb",
                      method="analytic")  # fmt: skip
    answer = plan(req, backend)
    assert answer.best is None and answer.reason and answer.to_dict()["batch_size"] is None


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"budget": "1GiB", "threshold": 0.5}, "exactly one of budget"),
        ({"budget": "1GiB", "space": {"batch": 4}}, "unknown search-space fields"),
        ({"budget": "1GiB", "objective": "speed"}, "objective must be one of"),
    ],
)
def test_a_bad_plan_request_is_refused(kw, message):
    with pytest.raises(UserError, match=message):
        PlanRequest(model=ModelRef(spec="mlp"), **kw)
