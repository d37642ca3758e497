"""The compiled one-query core against brute force on hand-built count matrices."""

from __future__ import annotations

import numpy as np
import pytest
from memgnn.predictor.memory.curve_bounds import CurveBlocks
from memgnn.predictor.memory.query_kernel import (
    N_OUT,
    OUT_BIG_COUNT,
    OUT_COL,
    OUT_DISTINCT,
    OUT_EXACT,
    OUT_LARGEST,
    OUT_PEAK,
    OUT_S,
    OUT_SEG,
    OUT_VS,
    peak_aggregates,
)

MIB = 1 << 20


def _run(ints, counts, steps, *, gpu=False, ws=0.0, block=2, initial=None):
    """Two pairs (formulas 0 and 1, categories 0 and 1) and one scratch row (formula 2)."""
    blocks = CurveBlocks(counts, steps, block=block)
    gi = {g: k for k, g in enumerate(blocks.group_ids.tolist())}
    gob = np.array([gi[g] for g in blocks.group_of_block.tolist()], dtype=np.int64)
    lo = np.array([np.flatnonzero(gob == k)[0] for k in range(len(gi))], dtype=np.int64)
    hi = np.array([np.flatnonzero(gob == k)[-1] + 1 for k in range(len(gi))], dtype=np.int64)
    n_e = len(ints)
    out = np.empty(N_OUT + len(gi) + 7)
    peak_aggregates(
        np.array(ints, dtype=np.int64), gpu, ws, np.array([0, 1, n_e + 2]), 2, blocks.upper,
        blocks.counts, blocks.starts, blocks.ends, gob, lo, hi, counts[:2].copy(),
        np.zeros(2) if initial is None else np.asarray(initial, dtype=np.float64),
        np.array([0, 1]), counts[:2].max(axis=1), np.array([2.0, 0.0]),
        np.array([2]), out,
    )  # fmt: skip
    return out


def test_peak_column_step_maxima_and_sums_equal_brute_force():
    rng = np.random.default_rng(0)
    counts = rng.integers(0, 4, size=(3, 40)).astype(np.float64)
    counts[2] = rng.integers(0, 2, size=40)  # scratch: at its node only
    steps = np.repeat([0, 1], 20)
    ints = [3 * MIB, 512 * 1024, 7000]
    out = _run(ints, counts, steps)
    live = np.array([ints[0], ints[1], 0.0]) @ counts  # no scratch on the CPU
    assert out[OUT_EXACT] == 1.0
    assert out[OUT_PEAK] == live.max() and out[OUT_COL] == np.argmax(live)
    assert out[N_OUT] == live[:20].max() and out[N_OUT + 1] == live[20:].max()
    col = int(out[OUT_COL])
    assert out[OUT_VS] == counts[1, col] * ints[1]  # the small pair's bytes at the peak
    assert out[OUT_S] == counts[1, col]
    assert out[OUT_LARGEST] == (ints[0] if counts[0, col] else ints[1])
    assert out[OUT_BIG_COUNT] == 2.0 and out[OUT_DISTINCT] == 1.0  # pair 0 is 3 MiB: mid
    # the segment estimate: small bytes in 2 MiB segments, mid bytes in 20 MiB ones
    seg = np.ceil(counts[1] * ints[1] / (2 * MIB)) * 2 * MIB + np.ceil(
        counts[0] * ints[0] / (20 * MIB)
    ) * (20 * MIB)
    assert out[OUT_SEG] == seg.max()


@pytest.mark.parametrize("block", [1, 3, 64])
def test_first_of_tied_maxima_and_scratch_on_a_gpu(block):
    counts = np.zeros((3, 12))
    counts[0, [2, 7, 9]] = 1.0  # the same peak three times: the first column counts
    counts[2, 4] = 1.0  # scratch at column 4 only
    out = _run([600, 100, 0], counts, np.zeros(12, dtype=np.int64), gpu=True, block=block)
    assert out[OUT_PEAK] == 1024 and out[OUT_COL] == 2  # 600 B rounds to 1024 on a GPU
    out = _run([600, 100, 5000], counts, np.zeros(12, dtype=np.int64), gpu=True, block=block)
    assert out[OUT_PEAK] == 5120 and out[OUT_COL] == 4


def test_nothing_above_the_bytes_before_the_step_is_column_minus_one():
    counts = np.zeros((3, 8))
    counts[1, 3] = 1.0
    out = _run([1000, 10, 0], counts, np.zeros(8, dtype=np.int64), initial=[1.0, 0.0])
    assert out[OUT_PEAK] == 1000 and out[OUT_COL] == -1


def test_sums_past_2_to_52_are_refused():
    counts = np.ones((3, 8))
    out = _run([1 << 52, 1, 0], counts, np.zeros(8, dtype=np.int64))
    assert out[OUT_EXACT] == 0.0
