"""The compiled (numba) core of one query (`predictor.memory.query_fast`): maxima over a path's
live-byte curves by exact block bounds, and the aggregates at the peak.

`peak_aggregates` is `query_features.PathContext.query_many` for one query from the
evaluated size formulas to the numbers its features are made of: the block walk of
`curve_bounds.CurveBlocks.candidates` (bound every block, evaluate the best block of each
step and of the segment estimate, then every block whose bound reaches what was found)
and the sums over the pairs alive at the peak. Every sum is of integer byte counts, exact
in float64 in any order while below 2**52 (checked: `OUT_EXACT` is 0 past it), so the
numbers are the reference's to the bit. All compiled code lives in this one module:
numba's on-disk cache (``cache=True``) checks only the source file of what it loads.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

__all__ = ["N_OUT", "peak_aggregates"]

_MIB = 1 << 20
_SEG_SMALL = 2 * _MIB
_SEG_MID = 20 * _MIB
_EXACT = float(1 << 52)
# layout of the output vector; then one entry per step group, then one per category
(OUT_EXACT, OUT_PEAK, OUT_COL, OUT_SEG, OUT_VS, OUT_VM, OUT_VL, OUT_S, OUT_M, OUT_L,
 OUT_LR, OUT_EX, OUT_CHURN, OUT_BIG_BYTES, OUT_BIG_COUNT, OUT_LARGEST, OUT_DISTINCT,
 OUT_SCRATCH) = range(18)  # fmt: skip
N_OUT = 18


@njit(cache=True)
def _segment(small: float, mid: float, large: float, ws: float) -> float:
    """The caching-allocator-shaped estimate of `query_features._schedule`."""
    return (
        math.ceil(small / _SEG_SMALL) * 2.0 * _MIB
        + math.ceil((mid + ws) / _SEG_MID) * 20.0 * _MIB
        + large
    )


@njit(cache=True)
def _evaluate(b, v0, vc, cls_r, counts, starts, ends, ws, live, best, group_max, g):
    """Evaluate block b's columns exactly: per column the live bytes (set 0) and the
    segment estimate; updates the first maximum `best` [value, column, segment max] and
    the block's group maximum."""
    n_r = counts.shape[0]
    for c in range(starts[b], ends[b]):
        live[:] = 0.0
        for r in range(n_r):
            x = counts[r, c]
            if x != 0.0:
                live[0] += v0[r] * x
                live[1 + cls_r[r]] += vc[r] * x
        main = live[0]
        seg = _segment(live[1], live[2], live[3], ws)
        if main > best[0] or (main == best[0] and c < best[1]):
            best[0], best[1] = main, c
        if seg > best[2]:
            best[2] = seg
        if main > group_max[g]:
            group_max[g] = main


@njit(cache=True)
def peak_aggregates(
    ints, gpu, ws, vcols, n_pairs, upper, counts, starts, ends, block_group, group_lo,
    group_hi, alive_at, initial, pcat, total, allocated, scratch_e, out,
):  # fmt: skip
    """Fill `out` (see the module docstring and the OUT_ layout); `ints` are the size
    formulas' exact values (int64, non-negative), `vcols` the formula of each row of
    `upper`/`counts` (pairs, then scratch formulas offset by len(ints))."""
    n_e = len(ints)
    v = np.empty(n_e)
    cls = np.empty(n_e, dtype=np.int64)  # 0 small (<= 1 MiB), 1 mid, 2 large (>= 10 MiB)
    lr = np.zeros(n_e)  # large blocks rounded to 2 MiB
    for e in range(n_e):
        r = ints[e]
        if gpu:
            r = -(-r // 512) * 512 if r > 0 else 0
        v[e] = float(r)
        cls[e] = 0 if r <= _MIB else (2 if r >= 10 * _MIB else 1)
        if cls[e] == 2:
            lr[e] = float(-(-r // _SEG_SMALL) * _SEG_SMALL)
    # per row of the count matrices: set 0 value, and its one other non-zero set (1 small,
    # 2 mid, 3 large rounded, or 3 = scratch on a GPU)
    n_r = len(vcols)
    v0 = np.zeros(n_r)
    vc = np.zeros(n_r)
    cls_r = np.full(n_r, 2, dtype=np.int64)
    for r in range(n_r):
        e = vcols[r]
        if r < n_pairs:
            v0[r] = v[e]
            cls_r[r] = cls[e]
            vc[r] = lr[e] if cls[e] == 2 else v[e]
        elif gpu:
            v0[r] = v[e - n_e]
            vc[r] = v[e - n_e]
    check = ws
    for e in range(n_e):
        check += v[e]
    for k in range(n_pairs):
        e = vcols[k]
        check += total[k] * (v[e] + lr[e] + abs(float(ints[e])))
    out[:] = 0.0
    if not check < _EXACT:
        return
    out[OUT_EXACT] = 1.0
    # 1. bounds of every block
    n_b = len(starts)
    bnd = np.zeros((4, n_b))
    for r in range(n_r):
        a, c = v0[r], vc[r]
        row = 1 + cls_r[r]
        for b in range(n_b):
            u = upper[r, b]
            bnd[0, b] += a * u
            bnd[row, b] += c * u
    seg_b = np.empty(n_b)
    for b in range(n_b):
        seg_b[b] = _segment(bnd[1, b], bnd[2, b], bnd[3, b], ws)
    # 2. the best block of each group and of the segment estimate, evaluated exactly
    n_g = len(group_lo)
    done = np.zeros(n_b, dtype=np.bool_)
    for g in range(n_g):
        top = group_lo[g]
        for b in range(group_lo[g], group_hi[g]):
            if bnd[0, b] > bnd[0, top]:
                top = b
        done[top] = True
    top = 0
    for b in range(n_b):
        if seg_b[b] > seg_b[top]:
            top = b
    done[top] = True
    live = np.zeros(4)
    best = np.array([-np.inf, -1.0, -np.inf])
    group_max = np.full(n_g, -np.inf)
    for b in range(n_b):
        if done[b]:
            _evaluate(b, v0, vc, cls_r, counts, starts, ends, ws, live, best, group_max,
                      block_group[b])  # fmt: skip
    # 3. every other block whose bound reaches what was found
    seg_found = best[2]
    more = np.zeros(n_b, dtype=np.bool_)
    for b in range(n_b):
        if not done[b]:
            more[b] = bnd[0, b] >= group_max[block_group[b]] or seg_b[b] >= seg_found
    for b in range(n_b):
        if more[b]:
            _evaluate(b, v0, vc, cls_r, counts, starts, ends, ws, live, best, group_max,
                      block_group[b])  # fmt: skip
    # the peak: the first column reaching the maximum, unless nothing rose above the
    # bytes alive before the step
    init = 0.0
    for k in range(n_pairs):
        init += v0[k] * initial[k]
    rose = best[0] > init
    out[OUT_PEAK] = best[0] if rose else init
    col = int(best[1]) if rose else -1
    out[OUT_COL] = col
    out[OUT_SEG] = max(best[2], 0.0)
    for g in range(n_g):
        out[N_OUT + g] = group_max[g]
    # sums over the pairs alive at the peak, and over all pairs
    largest = 0.0
    big_vals = np.empty(n_pairs)
    n_big = 0
    for k in range(n_pairs):
        e = vcols[k]
        x = alive_at[k, col] if rose else initial[k]
        val = v[e]
        ce = cls[e]
        out[OUT_VS + ce] += x * val
        out[OUT_S + ce] += x
        out[OUT_LR] += x * lr[e]
        out[OUT_EX] += x * float(ints[e])
        out[N_OUT + n_g + pcat[k]] += x * val
        if x > 0.0 and val > largest:
            largest = val
        out[OUT_CHURN] += total[k] * val
        if allocated[k] > 0.0 and ce != 0:
            out[OUT_BIG_BYTES] += allocated[k] * val
            out[OUT_BIG_COUNT] += allocated[k]
            big_vals[n_big] = val
            n_big += 1
    out[OUT_LARGEST] = largest
    s = np.sort(big_vals[:n_big])
    distinct = 0
    for i in range(n_big):
        if i == 0 or s[i] != s[i - 1]:
            distinct += 1
    out[OUT_DISTINCT] = distinct
    scratch = 0.0
    if gpu:
        for e in scratch_e:
            scratch = max(scratch, v[e])
    out[OUT_SCRATCH] = scratch
