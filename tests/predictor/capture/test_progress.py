"""predictor.capture.progress: a long capture says how long it has run and has left."""

import pytest
from memgnn.predictor.capture.capture import CaptureConfig, capture
from memgnn.predictor.capture.progress import (
    FIRST_STEP_WEIGHT,
    PHASE_WEIGHTS,
    Progress,
    StepProgress,
    report_left,
)
from memgnn.predictor.spec.train import TrainSpec
from memgnn.predictor.zoo.resolve import resolve


class Calls:
    def __init__(self) -> None:
        self.phases: list[str] = []

    def on_phase(self, phase, step, micro):
        self.phases.append(phase)

    def on_backward_end(self, model, step, micro):
        self.phases.append("backward_end")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_message_counts_down_from_the_last_estimate():
    p = Progress("capturing x")
    p._t0 = 100.0
    assert p.message(112.0) == "capturing x ... (12 s)"  # nothing reported yet
    with p:
        report_left(30.0)
    _, at = p._left
    assert p.message(at + 10).endswith(", about 20 s left)")
    assert p.message(at + 30).endswith(" s)")  # past the estimate: no countdown below 1 s
    report_left(5.0)  # outside the block: no running Progress, nothing changes
    assert p._left[0] == 30.0


def test_step_progress_scales_the_phases_seen_by_the_weight_left():
    inner, clock, said = Calls(), Clock(), []
    with Progress("capturing x") as p:
        p.left = said.append
        obs = StepProgress(inner, steps=2, micro=1, clock=clock)
        w = PHASE_WEIGHTS
        total = (w["forward"] + w["backward"] + w["optimizer"]) * (FIRST_STEP_WEIGHT + 1)
        clock.now = 5.0  # building the model: not step work
        obs.on_phase("input", 0, 0)
        obs.on_phase("forward", 0, 0)
        assert said == []  # no forward finished yet
        clock.now = 5.0 + 2 * FIRST_STEP_WEIGHT  # the first forward: 2 s a weighted forward
        obs.on_phase("backward", 0, 0)
        done = w["forward"] * FIRST_STEP_WEIGHT
        assert said == [pytest.approx(2.0 * (total - done))]
        obs.on_backward_end(None, 0, 0)  # passed on
    assert inner.phases == ["input", "forward", "backward", "backward_end"]


def test_a_capture_reports_the_time_left_to_the_running_progress(monkeypatch):
    seen: list[float] = []
    monkeypatch.setattr("memgnn.predictor.capture.progress.report_left", seen.append)
    capture(resolve("mlp"), TrainSpec(), CaptureConfig(symbolic=False, sizes={"B": 2}))
    assert len(seen) >= 4 and seen[-1] == pytest.approx(0.0, abs=1e-9)  # nothing left
