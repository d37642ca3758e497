"""Maxima of live-byte curves without evaluating every node: exact block bounds.

A path's live bytes at its curve nodes are `values @ counts` (`query_features`): counts
[rows, nodes] of live storages per (size formula, category) pair, values [R, rows] the
bytes of each pair at R queries. A query needs only maxima of these curves (the peak and
its node, each step's peak, the segment estimate), not the curves. With non-negative
values and counts, the column-wise maximum of `counts` over a block of nodes bounds
every node of the block from above: `values @ block_max >= values @ counts[:, node]`. So:

1. bound every block (one product with [rows, blocks], ~64x smaller than the curves);
2. evaluate exactly the block with the highest bound in each step, which gives a value
   the maximum reaches at least;
3. evaluate exactly every block whose bound reaches that value; all others hold only
   nodes strictly below it, so they can be neither the maximum nor tied with it.

The result is the maximum, the first node reaching it and the per-step maxima exactly
as over the full curves (integers below 2**53 sum exactly in float64), usually from a
few hundred of a 20k-node path's nodes. Monotone functions of several curves (the
segment estimate) are bounded the same way, by the function of the bounds.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

__all__ = ["BLOCK", "CurveBlocks"]

BLOCK = 64  # curve nodes per block


class CurveBlocks:
    """Block bounds over the columns of a non-negative count matrix [rows, A]; blocks never
    span two groups (steps), so each group's maximum is bounded by its own blocks."""

    def __init__(self, counts: np.ndarray, groups: np.ndarray, block: int = BLOCK):
        if block < 1:
            raise ValueError(f"block must be >= 1, got {block}")
        if counts.ndim != 2 or groups.shape != (counts.shape[1],):
            raise ValueError("counts must be [rows, nodes] and groups [nodes]")
        if counts.size and counts.min() < 0:
            raise ValueError("block bounds need non-negative counts")
        self.counts = np.ascontiguousarray(counts, dtype=np.float64)
        self.groups = np.asarray(groups, dtype=np.int64)
        n = counts.shape[1]
        cuts = np.flatnonzero(np.diff(self.groups)) + 1 if n else np.zeros(0, np.int64)
        starts: list[int] = []
        for lo, hi in zip(np.r_[0, cuts], np.r_[cuts, n]):
            starts.extend(range(int(lo), int(hi), block))
        self.starts = np.asarray(starts, dtype=np.int64)
        self.ends = np.r_[self.starts[1:], n].astype(np.int64)
        self.group_of_block = self.groups[self.starts] if n else np.zeros(0, np.int64)
        self.upper = (
            np.maximum.reduceat(self.counts, self.starts, axis=1)
            if n
            else np.zeros((counts.shape[0], 0))
        )
        self.group_ids = np.unique(self.groups)
        self._block_cols = [np.arange(lo, hi) for lo, hi in zip(self.starts, self.ends)]
        self._in_group = [self.group_of_block == g for g in self.group_ids]

    def _columns(self, blocks: np.ndarray) -> np.ndarray:
        """The columns of the given blocks (sorted, each block once)."""
        return np.concatenate([self._block_cols[b] for b in np.unique(blocks)])

    def candidates(
        self,
        values: np.ndarray,
        curves: Callable[[np.ndarray], tuple[np.ndarray, list[np.ndarray]]],
    ) -> tuple[np.ndarray, np.ndarray]:
        """(columns, values @ counts[:, columns]) holding every maximum that matters.

        `curves(live)` maps evaluated curves [R, C] (or bounds [R, blocks]) to
        (the curve whose per-group maxima and first argmax are needed [Q, C],
        [further monotone curves whose maxima are needed, each [Q, C]]); values must be
        non-negative. The columns come back sorted."""
        n = self.counts.shape[1]
        if n == 0 or len(self.starts) <= 2:
            cols = np.arange(n)
            return cols, values @ self.counts
        bound_main, bound_rest = curves(values @ self.upper)  # [Q, blocks]
        first = []
        for in_g in self._in_group:
            masked = np.where(in_g, bound_main, -np.inf)
            first.append(np.argmax(masked, axis=1))
        for b in bound_rest:
            first.append(np.argmax(b, axis=1))
        done = np.zeros(len(self.starts), dtype=bool)
        done[np.concatenate(first)] = True
        cols = self._columns(np.flatnonzero(done))
        live = values @ self.counts[:, cols]
        main, rest = curves(live)
        keep = np.zeros(len(self.starts), dtype=bool)
        col_group = self.groups[cols]
        for g, in_g in zip(self.group_ids, self._in_group):
            lower = main[:, col_group == g].max(axis=1)  # the group's maximum reaches it
            keep |= in_g & (bound_main >= lower[:, None]).any(axis=0)
        for b, c in zip(bound_rest, rest):
            keep |= (b >= c.max(axis=1)[:, None]).any(axis=0)
        more = np.flatnonzero(keep & ~done)
        if len(more):
            extra = self._columns(more)
            cols = np.concatenate([cols, extra])
            live = np.concatenate([live, values @ self.counts[:, extra]], axis=1)
            order = np.argsort(cols, kind="stable")
            cols, live = cols[order], live[:, order]
        return cols, live
