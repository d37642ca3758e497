import pytest
from memgnn.predictor.capture.capture import CaptureConfig, capture
from memgnn.predictor.plan.decision import decide, state_bytes
from memgnn.predictor.spec.train import TrainSpec
from tiny_models import tiny_mlp_bundle


@pytest.fixture(scope="module")
def mlp_graph():
    return capture(tiny_mlp_bundle(), TrainSpec.of(optimizer="adamw"), CaptureConfig(target="cpu"))


def test_state_bytes_match_the_hand_formula(mlp_graph):
    params = 24 * 64 + 64 + 64 * 5 + 5  # two Linear layers
    assert params * 4 == 7700
    state = state_bytes(mlp_graph, {"B": 1})
    assert state["parameter"] == params * 4
    assert state["gradient"] == params * 4
    # AdamW: exp_avg + exp_avg_sq per parameter, and a float32 `step` per parameter tensor
    assert state["optimizer_state"] == 2 * params * 4 + 4 * 4
    assert state["total"] == 7700 + 7700 + 15416
    assert state_bytes(mlp_graph, {"B": 512}) == state  # the state does not grow with B


def test_decision_on_a_line_gives_its_slope_intercept_and_largest_batch():
    line = {b: 1000 + 200 * b for b in (1, 2, 24)}
    d = decide(lambda bs: (line[bs[0]], line[bs[1]]), None, {}, 24, limit=8000)
    assert d.per_sample_bytes == 200 and d.fixed_bytes == 1000
    assert d.theoretical_max_batch == (8000 - 1000) // 200 == 35
    assert d.slope_batches == (1, 24) and d.state_bytes is None
    one = decide(lambda bs: (line[bs[0]], line[bs[1]]), None, {}, 1, limit=8000)
    assert one.slope_batches == (1, 2) and one.per_sample_bytes == 200


def test_decision_without_bounds_says_nothing_rather_than_guessing(mlp_graph):
    d = decide(lambda bs: None, mlp_graph, {}, 8, limit=10**6)
    assert d.per_sample_bytes is None and d.theoretical_max_batch is None
    assert d.state_bytes == 30816
