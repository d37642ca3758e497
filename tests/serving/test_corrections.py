"""Corrections combined across writers: one writer alone is bounded, agreeing writers
reach further, a hostile minority is outvoted (`serving.corrections`)."""

from __future__ import annotations

import math

import pytest
from memgnn.predictor.answer.types import Correction
from memgnn.serving.corrections import combine, correction_of_writers, writer_log_scales

B = 1.25  # the default writer bound


def windows(*ratios: float, n: int = 1):
    """One window per writer: n samples at each writer's ratio (bound ratio the same)."""
    return [([r] * n, [r] * n) for r in ratios]


def test_one_writer_is_bounded_however_many_samples():
    low = correction_of_writers(windows(0.27, n=40), prior=1.0)
    high = correction_of_writers(windows(4.03, n=40), prior=1.0)
    assert low.peak_scale == pytest.approx(1 / B) and low.capped and low.writers == 1
    assert high.peak_scale == pytest.approx(B) and high.bound_scale == pytest.approx(B)
    assert low.bound_scale == 1.0  # the bound is never lowered
    assert (low.samples, low.writer_max_scale, low.max_scale) == (40, B, 4.0)
    # within the bound a writer's own statistics pass through unchanged
    small = correction_of_writers(windows(1.1, n=3), prior=1.0)
    assert small.peak_scale == pytest.approx(1.1**0.75) and not small.capped


def test_agreeing_writers_reach_further_than_one():
    one = correction_of_writers(windows(0.5, n=3))
    two = correction_of_writers(windows(0.5, 0.5, n=3))
    three = correction_of_writers(windows(0.5, 0.5, 0.5, n=3))
    assert one.peak_scale == pytest.approx(1 / B)
    assert two.peak_scale == pytest.approx(1 / B**2)  # 0.5**0.75 = 0.59 < 1/B**2 = 0.64
    assert three.peak_scale == pytest.approx(0.5**0.75)  # within B**3: uncapped
    assert one.peak_scale > two.peak_scale > three.peak_scale
    # never past max_scale, however many writers agree
    many = correction_of_writers(windows(*[0.01] * 20, n=50), max_scale=4.0)
    assert many.peak_scale == pytest.approx(0.25, rel=0.03)


def test_a_hostile_writer_among_three_honest_ones_is_outvoted():
    honest = [1.08, 1.10, 1.12]
    alone = correction_of_writers(windows(*honest, n=3))
    for hostile in (0.27, 4.03):
        mixed = correction_of_writers(windows(*honest, n=3) + windows(hostile, n=40))
        own = [r**0.75 for r in honest]  # each honest writer's own correction
        assert min(own) <= mixed.peak_scale <= max(own)
        assert mixed.writers == 4 and mixed.samples == 9 + 40
    assert alone.peak_scale == pytest.approx(1.10**0.75)


def test_one_writer_with_one_other_cannot_pass_its_own_bound():
    """Two writers: the median is their mean, but a direction only one supports is
    bounded by one writer's reach."""
    c = correction_of_writers(windows(1.0, 0.27, n=20))
    assert c.peak_scale == pytest.approx(1 / B)


def test_combine_and_the_writer_log_scales():
    assert combine([], writer_max_scale=B, max_scale=4.0) == 0.0
    assert combine([0.1, -0.1], writer_max_scale=B, max_scale=4.0) == 0.0
    assert writer_log_scales([2.0], [0.5], prior=0) == (math.log(2.0), 0.0)
    assert correction_of_writers([([], [])]) == Correction()
    with pytest.raises(ValueError):
        correction_of_writers(windows(1.0), writer_max_scale=0.9)
    with pytest.raises(ValueError):
        correction_of_writers(windows(1.0), writer_max_scale=5.0, max_scale=4.0)
