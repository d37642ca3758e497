"""What `auto` believes a replay costs: the JIT's state in this process (a cold process
must not route a request into a 67 s compile), a factor measured on this process's own
warm replays (a loaded machine's slower replays flip `auto` to the model), and the route
every answer carries."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from memgnn.predictor.answer import exact
from memgnn.predictor.answer.backend import LocalBackend
from memgnn.predictor.answer.exact import ExactConfig, ReplayModel, decide, estimated_seconds
from memgnn.predictor.answer.predict import answer_entry
from memgnn.predictor.capture.capture import CaptureConfig, capture
from memgnn.predictor.memory.analytic import AnalyticModel
from memgnn.predictor.memory.base import Query
from memgnn.predictor.sim.replay.cost import ReplayCost, jit_state
from memgnn.predictor.spec.train import TrainSpec
from memgnn.serving.routing import warm_replay
from tiny_models import tiny_mlp_bundle

Q = [Query(sizes={"B": 8}, device="a100-80gb")]


@pytest.fixture(scope="module")
def graph():
    return capture(tiny_mlp_bundle(), TrainSpec(), CaptureConfig(target="cuda"))


@pytest.fixture
def cost(monkeypatch) -> ReplayCost:
    """A fresh process-wide estimate for the test (the real one keeps the suite's)."""
    fresh = ReplayCost()
    monkeypatch.setattr(exact, "REPLAY_COST", fresh)
    return fresh


def test_the_factor_starts_at_the_first_ratio_then_moves_by_the_weight():
    c = ReplayCost(weight=0.5)
    est = c.estimate(0.01, jit="warm", jit_load_s=2.0, jit_compile_s=60.0)
    assert (est.factor, est.samples, est.seconds) == (1.0, 0, 0.01)  # the prior unchanged
    c.observe(0.01, 0.04)  # 4x slower than the prior
    assert (c.factor, c.samples) == (4.0, 1)
    c.observe(0.01, 0.02)  # halfway to 2x
    assert (c.factor, c.samples) == (3.0, 2)
    est = c.estimate(0.01, jit="cached", jit_load_s=2.0, jit_compile_s=60.0)
    assert est.replay_seconds == pytest.approx(0.03) and est.jit_seconds == 2.0
    assert est.seconds == pytest.approx(2.03)
    assert c.estimate(0.01, jit="cold", jit_load_s=2.0, jit_compile_s=60.0).jit_seconds == 60.0
    c.reset()
    assert (c.factor, c.samples) == (1.0, 0)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda c: ReplayCost(weight=0), "weight"),
        (lambda c: c.observe(0, 1.0), "estimated_s"),
        (lambda c: c.observe(0.1, -1.0), "seconds"),
        (lambda c: c.estimate(0.1, jit="lukewarm", jit_load_s=1, jit_compile_s=1), "JIT state"),
        (lambda c: ExactConfig(jit_load_s=-1), "jit_load_s"),
    ],
)
def test_bad_values_name_what_was_wrong(call, message):
    with pytest.raises(ValueError, match=message):
        call(ReplayCost())


def test_a_cold_jit_sends_auto_to_the_model_within_budget_and_replay_past_it(graph, cost):
    prior = estimated_seconds(graph, ExactConfig())
    assert prior < 0.25  # a warm replay fits the default budget
    warm = decide("auto", graph, ExactConfig(), jit="warm")
    assert warm.method == "replay" and "within the 250 ms budget" in warm.reason
    cached = decide("auto", graph, ExactConfig(), jit="cached")
    assert cached.method == "gnn" and "loads it from numba's cache (~2.2 s)" in cached.reason
    cold = decide("auto", graph, ExactConfig(), jit="cold")
    assert cold.method == "gnn" and "compiles it (~67.6 s)" in cold.reason
    assert cold.cost.seconds == pytest.approx(prior + 67.59)
    # a budget that pays for the compile replays; by name, replay is taken and says the cost
    assert decide("auto", graph, ExactConfig(budget_s=70.0), jit="cold").method == "replay"
    named = decide("replay", graph, ExactConfig(), jit="cold")
    assert named.method == "replay" and "asked for by name; JIT cold" in named.reason


def test_slow_measured_replays_flip_auto_to_the_model(graph, cost):
    config = ExactConfig()
    prior = estimated_seconds(graph, config)
    assert decide("auto", graph, config, jit="warm").method == "replay"
    cost.observe(prior, 0.3)  # a loaded machine: the replay took 300 ms
    slow = decide("auto", graph, config, jit="warm")
    assert slow.method == "gnn"
    assert "replay estimated 300.0 ms" in slow.reason and "from 1 measured replays" in slow.reason
    assert slow.cost.factor == pytest.approx(0.3 / prior)


def test_warm_replays_are_measured_and_a_jit_call_is_not(graph, cost, monkeypatch):
    warm_replay()
    assert jit_state() == "warm"
    model = ReplayModel()
    model.predict(graph, [Query(sizes={"B": b}, device="a100-80gb") for b in (8, 9)])
    assert cost.samples == 2 and cost.factor > 0
    model.predict(graph, [Query(sizes={"B": 9}, device="a100-80gb")])  # remembered: no replay
    assert cost.samples == 2
    # a call that met a cold JIT (faked here) is not timed into the factor
    monkeypatch.setattr(exact, "jit_state", lambda: "cached")
    model.predict(graph, [Query(sizes={"B": 10}, device="a100-80gb")])
    assert cost.samples == 2
    # a CPU target is the sweep, not a replay: not measured either
    monkeypatch.setattr(exact, "jit_state", lambda: "warm")
    model.predict(graph, [Query(sizes={"B": 8}, device="cpu")])
    assert cost.samples == 2


def test_every_answer_says_which_path_ran_and_why(graph, cost):
    warm_replay()
    backend = LocalBackend()
    entry = backend.register(graph)
    (p,) = [
        s.prediction for s in answer_entry(entry, Q, backend.choose("auto", 250, entry), backend)
    ]
    route = p.breakdown["route"]
    assert p.method == route["method"] == "replay" and route["asked"] == "auto"
    assert route["jit"] == "warm" and route["budget_ms"] == 250.0 and route["estimated_ms"] > 0
    backend = LocalBackend(learned=AnalyticModel())
    entry = backend.register(graph)
    (g,) = [s.prediction for s in answer_entry(entry, Q, backend.choose("auto", 0, entry), backend)]
    assert g.method == g.breakdown["route"]["method"] == "analytic"  # the learned slot
    assert "over the 0 ms budget" in g.breakdown["route"]["reason"]


def test_jit_state_of_a_fresh_process_with_an_empty_cache_is_cold(tmp_path):
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}
    code = "from memgnn.predictor.sim.replay.cost import jit_state; print(jit_state())"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=300, check=True)  # fmt: skip
    assert out.stdout.strip() == "cold"


@pytest.mark.slow
def test_cli_auto_in_a_cold_process_answers_by_the_model_without_compiling(tmp_path):
    """`memgnn predict` (auto, 250 ms) in a fresh process with an empty numba cache: the
    old estimate replayed this graph and compiled the JIT inline (67 s); now the model
    answers and says why."""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba"),
           "MEMGNN_CACHE": str(tmp_path / "cache")}  # fmt: skip
    argv = ["-m", "memgnn.cli", "predict", "--model", "mlp", "--device", "a100-80gb",
            "--batch", "8", "--json"]  # fmt: skip
    out = subprocess.run([sys.executable, *argv], env=env, capture_output=True, text=True,
                         timeout=300, check=True)  # fmt: skip
    got = json.loads(out.stdout)
    route = got["breakdown"]["route"]
    assert got["method"] in ("gnn", "analytic") and route["jit"] == "cold"
    assert "compiles it" in route["reason"] and got["predict_seconds"] < 30
    assert not list((tmp_path / "numba").rglob("*.nbi"))  # nothing was compiled
