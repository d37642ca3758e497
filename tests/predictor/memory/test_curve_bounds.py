"""Block bounds give the maxima of live-byte curves exactly, from few of their nodes."""

from __future__ import annotations

import numpy as np
import pytest
from memgnn.predictor.memory.curve_bounds import CurveBlocks


def _dense(values, counts, groups):
    live = values @ counts
    first = live.argmax(axis=1)
    per_group = {g: live[:, groups == g].max(axis=1) for g in np.unique(groups)}
    return live, first, per_group


def _curves(live):
    return live, [np.ceil(live / 7.0) * 7.0]


@pytest.mark.parametrize("seed", range(8))
def test_candidates_hold_the_exact_maxima_first_argmax_and_group_maxima(seed):
    rng = np.random.default_rng(seed)
    rows, n = 6, 700
    # a training-step-like curve: counts rise to a peak, then fall, plus noise and ties
    trend = np.minimum(np.arange(n), n - np.arange(n))[None, :] // 40
    counts = (trend + rng.integers(0, 3, (rows, n))).astype(np.float64)
    counts[:, 300] = counts[:, 200]  # an exact tie with an earlier column
    groups = (np.arange(n) >= 350).astype(np.int64)
    values = rng.integers(0, 1000, (5, rows)).astype(np.float64)
    blocks = CurveBlocks(counts, groups, block=16)
    cols, live = blocks.candidates(values, _curves)
    assert np.all(np.diff(cols) > 0)
    np.testing.assert_array_equal(live, values @ counts[:, cols])
    full, first, per_group = _dense(values, counts, groups)
    np.testing.assert_array_equal(cols[live.argmax(axis=1)], first)
    for g, top in per_group.items():
        np.testing.assert_array_equal(live[:, groups[cols] == g].max(axis=1), top)
    np.testing.assert_array_equal(_curves(live)[1][0].max(axis=1), _curves(full)[1][0].max(axis=1))
    assert len(cols) < n // 2  # the bounds leave most nodes out on a peaked curve


def test_ties_keep_the_first_node_reaching_the_maximum():
    counts = np.zeros((1, 40))
    counts[0, 5] = counts[0, 33] = 3.0  # same maximum in two blocks
    blocks = CurveBlocks(counts, np.zeros(40, dtype=np.int64), block=4)
    cols, live = blocks.candidates(np.array([[2.0]]), _curves)
    assert cols[live.argmax(axis=1)][0] == 5


def test_blocks_never_span_two_groups():
    groups = np.array([0] * 10 + [1] * 7)
    blocks = CurveBlocks(np.ones((2, 17)), groups, block=4)
    for lo, hi in zip(blocks.starts, blocks.ends):
        assert len(set(groups[lo:hi])) == 1
    assert blocks.ends[-1] == 17


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="non-negative"):
        CurveBlocks(-np.ones((1, 3)), np.zeros(3, dtype=np.int64))
    with pytest.raises(ValueError, match="block"):
        CurveBlocks(np.ones((1, 3)), np.zeros(3, dtype=np.int64), block=0)
    with pytest.raises(ValueError, match="groups"):
        CurveBlocks(np.ones((1, 3)), np.zeros(4, dtype=np.int64))
