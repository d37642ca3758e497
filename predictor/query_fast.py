"""One query's features at a fixed cost: `PathContext.query_many` for a single query.

`query_many` is vectorised over a batch of queries ([queries, pairs] arrays); for one
query its cost is ~150 small numpy calls, ~1 ms whatever the graph's size. `FastQuery`
computes the same `QueryResult` for one query with ~40: everything that depends only on
the path is stacked once (`__init__`), the per-expression values and size classes are
Python numbers (a graph has ~20 size formulas), every aggregate over the pairs alive at
the peak is one product `[counts; total; allocated] @ G` with G's columns the per-pair
quantities the features sum, the block bounds of `predictor.curve_bounds` are walked for
one row, and the feature vector is filled from a list with one `log2` call for all its
log-scaled columns.

The answer is the reference's to the bit: every sum is of integer byte counts below
2**52 (exact in float64 in any order: checked per query), each feature is the same float64
operation on the same operands, and the logarithms are numpy's. Where that cannot be
promised (sizes past 2**16, negative bytes, no count matrix or block bounds) `query`
returns None and the caller takes `query_many`. Tests compare the two on tiny graphs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from memgnn.predictor.features import FEATURE_CATEGORIES, QUERY_COLUMNS
from memgnn.predictor.vocab import CATEGORIES, PHASES, category_bytes

if TYPE_CHECKING:
    from memgnn.predictor.query_features import PathContext

__all__ = ["FastQuery", "QueryResult", "ws_segment"]

_MIB = 1 << 20
_SEG_SMALL, _SEG_MID = 2 * _MIB, 20 * _MIB
EXACT = float(1 << 52)  # float64 sums of integers below this are exact in any order
SAFE_SIZE = 1 << 16  # below this no size formula can overflow int64 (`ExprTable`)
# columns of the per-pair matrix G (see `FastQuery.query`), then one per category
_VS, _VM, _VL, _S, _M, _L, _LR, _EX, _V = range(9)
_NG = 9 + len(CATEGORIES)


@dataclass(kw_only=True, slots=True)
class QueryResult:
    """Query features of one path plus the analytic numbers they were built from."""

    features: np.ndarray  # float32 [NUM_QUERY_FEATURES]
    analytic: np.ndarray  # float64 [3]: allocated, reserved, device_total estimates (bytes)
    baseline: np.ndarray  # float64 [3]: what `predict.AnalyticModel` answers
    breakdown: dict[str, Any]


def ws_segment(ws: int) -> int:
    """Bytes the caching allocator reserves for one cuBLAS workspace allocation."""
    return 20 * _MIB if 0 < ws < 10 * _MIB else ws


class FastQuery:
    """`PathContext.query_many([one])[0]` at a fixed cost (see the module docstring)."""

    def __init__(self, ctx: PathContext):
        pairs, blocks = ctx.pairs, ctx.blocks
        self.ctx, self.graph = ctx, ctx.graph
        self.table = ctx.graph.table()
        n_exprs = len(ctx.graph.exprs)
        self.usable = blocks is not None and pairs.alive_at is not None and len(blocks.starts) > 2
        self.expr = pairs.expr.tolist()
        # V's columns (pairs, then scratch formulas) as columns of [values | scratch]
        self.vcols = np.concatenate([pairs.expr, n_exprs + ctx.scratch_exprs])
        self.scratch_exprs = ctx.scratch_exprs.tolist()
        self.rows = np.stack([pairs.total, pairs.allocated]).astype(np.float64)
        self.category = pairs.category
        self.alive_at = pairs.alive_at
        self.initial = pairs.initial
        if not self.usable:
            return
        self.upper, self.counts = blocks.upper, blocks.counts
        starts = blocks.starts.tolist()
        self.block_cols = [np.arange(lo, hi) for lo, hi in zip(starts, blocks.ends.tolist())]
        self.block_len = (blocks.ends - blocks.starts).tolist()
        gob = blocks.group_of_block.tolist()
        self.group_ids = blocks.group_ids.tolist()
        gi = {g: k for k, g in enumerate(self.group_ids)}
        self.block_group = [gi[g] for g in gob]  # group index of each block
        self.block_group_arr = np.asarray(self.block_group, dtype=np.int64)
        # blocks of a group are contiguous ([lo, hi) in block order)
        self.group_span = [(gob.index(g), len(gob) - gob[::-1].index(g)) for g in self.group_ids]
        step_at = ctx.step[ctx.at]
        self.block_step = step_at[blocks.starts].tolist()  # a block never spans two steps
        self.steps = list(ctx.step_nodes)
        self.at = ctx.at
        self.phase = ctx.phase.tolist()
        self.node_step = ctx.step.tolist()
        self.static = ctx.static

    def query(self, sizes: dict[str, int], device: Any, scenario: str) -> QueryResult | None:
        """The query's result, or None where only `query_many` can promise the bits."""
        if not self.usable:
            return None
        g = self.graph
        resolved = g.resolve_sizes(sizes, scenario)
        if max(resolved.values(), default=0) >= SAFE_SIZE or not self.table._small_is_safe:
            return None
        ints = self.table.evaluate_exact(resolved) if len(self.table) else []
        gpu = bool(device.is_gpu)
        rounded = [-(-v // 512) * 512 if v > 0 else 0 for v in ints] if gpu else ints
        if min(rounded, default=0) < 0 or min(ints, default=0) < 0:
            return None
        # per formula: [value, small, mid, large-rounded | scratch (GPU), 0, 0, scratch]
        n_e = len(ints)
        cls = [0 if v <= _MIB else (2 if v >= 10 * _MIB else 1) for v in rounded]
        lr = [float(-(-v // _SEG_SMALL) * _SEG_SMALL) if c == 2 else 0.0
              for v, c in zip(rounded, cls)]  # fmt: skip
        vf = [float(v) for v in rounded]
        sc = vf if gpu else [0.0] * n_e
        zero = [0.0] * n_e
        w = np.array([
            vf + sc,
            [v if c == 0 else 0.0 for v, c in zip(vf, cls)] + zero,
            [v if c == 1 else 0.0 for v, c in zip(vf, cls)] + zero,
            lr + sc,
        ])  # fmt: skip
        v4 = w[:, self.vcols]  # [4, pairs + scratch formulas]: the curve sets
        ws = float(self.ctx._workspace(device))
        main, seg, cols, offsets, done = self._maxima(v4, ws)
        # per pair: the quantities summed over the storages alive at the peak (and over all)
        ge = np.array([
            [v if c == 0 else 0.0, v if c == 1 else 0.0, v if c == 2 else 0.0,
             float(c == 0), float(c == 1), float(c == 2), r, float(x), v]
            for v, c, r, x in zip(vf, cls, lr, ints)
        ]).reshape(n_e, 9)  # fmt: skip
        gm = np.empty((len(self.expr), _NG))
        gm[:, :9] = ge[self.expr]
        np.multiply(self.category, gm[:, _V : _V + 1], out=gm[:, 9:])
        bound = float(self.rows[0] @ (gm[:, _V] + gm[:, _LR] + np.abs(gm[:, _EX])))
        if bound + sum(vf) + ws >= EXACT:
            return None  # sums could round: only the reference's order gives its bits
        col = int(np.argmax(main))
        top = float(main[col])
        initial = float(v4[0, : len(self.expr)] @ self.initial)
        rose = top > initial
        peak = top if rose else initial
        node = int(self.at[cols[col]]) if rose else -1
        at_peak = self.alive_at[:, cols[col]] if rose else self.initial
        agg = np.vstack([at_peak, self.rows]) @ gm  # [3, _NG]
        a_c, a_t, a_a = agg.tolist()
        blockmax = np.maximum.reduceat(main, offsets).tolist()
        steps = {}
        for b, m in zip(done, blockmax):
            s = self.block_step[b]
            steps[s] = max(steps.get(s, -math.inf), m)
        steps = {s: steps[s] for s in self.steps}
        values = gm[:, _V]
        held = at_peak > 0
        largest = float(values[held].max()) if held.any() else 0.0
        big = (self.rows[1] > 0) & (gm[:, _S] == 0)
        distinct = len(set(values[big].tolist()))
        seg_max = max(float(seg.max()), 0.0)
        scratch_max = max((float(rounded[e]) for e in self.scratch_exprs), default=0) if gpu else 0
        return self._result(resolved, device, gpu, ws, peak, node, steps, a_c, a_t, a_a,
                            largest, distinct, seg_max, float(scratch_max))  # fmt: skip

    def _segments(self, live: np.ndarray, ws: float) -> np.ndarray:
        """The caching-allocator-shaped estimate of `query_features` from the sets' rows."""
        return (np.ceil(live[1] / _SEG_SMALL) * 2 * _MIB
                + np.ceil((live[2] + ws) / _SEG_MID) * 20 * _MIB + live[3])  # fmt: skip

    def _maxima(self, v4: np.ndarray, ws: float):
        """(live bytes [C], segment estimate [C], curve columns [C] sorted, block offsets
        in them, the blocks) over the blocks that can hold a maximum (`CurveBlocks.candidates` for
        one query)."""
        bound = v4 @ self.upper
        b_main, b_seg = bound[0], self._segments(bound, ws)
        done = {int(b_seg.argmax())}
        for lo, hi in self.group_span:
            done.add(lo + int(b_main[lo:hi].argmax()))
        blocks = sorted(done)
        main, seg, cols, offsets = self._evaluate(v4, blocks, ws)
        lower = [-math.inf] * len(self.group_ids)
        for b, m in zip(blocks, np.maximum.reduceat(main, offsets).tolist()):
            k = self.block_group[b]
            lower[k] = max(lower[k], m)
        keep = b_main >= np.asarray(lower)[self.block_group_arr]
        keep |= b_seg >= seg.max()
        keep[blocks] = False
        more = np.flatnonzero(keep).tolist()
        if more:
            blocks = sorted(done.union(more))
            main, seg, cols, offsets = self._evaluate(v4, blocks, ws)
        return main, seg, cols, offsets, blocks

    def _evaluate(self, v4: np.ndarray, blocks: list[int], ws: float):
        cols = (np.concatenate([self.block_cols[b] for b in blocks])
                if len(blocks) > 1 else self.block_cols[blocks[0]])  # fmt: skip
        live = v4 @ self.counts[:, cols]
        offsets = np.cumsum([0] + [self.block_len[b] for b in blocks[:-1]])
        return live[0], self._segments(live, ws), cols, offsets

    def _result(self, resolved, device, gpu, ws, peak, node, steps, a_c, a_t, a_a, largest,
                distinct, seg, scratch_max) -> QueryResult:  # fmt: skip
        g = self.graph
        est = peak + ws
        safe = max(peak, 1.0)
        dims = {s: v for s, v in resolved.items() if s in g.symbols}
        other = [v for s, v in dims.items() if s != "B"]
        tokens = math.prod([float(v) for v in dims.values()])
        cat = a_c[9:]
        k = len(FEATURE_CATEGORIES)
        fcat = [*cat[: k - 1], cat[k - 1] + sum(cat[k:])]
        phase = self.phase[node] if node >= 0 else 0
        first, steady = steps.get(0, peak), steps.get(1, peak)
        class_bytes = (a_c[_VS], a_c[_VM], a_c[_VL])
        segments = (math.ceil(class_bytes[0] / _SEG_SMALL) * 2 * _MIB
                    + math.ceil(class_bytes[1] / _SEG_MID) * 20 * _MIB + a_c[_LR])  # fmt: skip
        total = float(device.total_bytes or 0)
        ws_seg = ws_segment(device.cublas_workspace_bytes) * 2 if gpu else 0.0
        onehot = [0.0] * len(PHASES)
        onehot[phase] = 1.0
        # log-scaled columns hold 1 + max(x, 0) until the one log2 call below
        lin = [
            _arg(dims.get("B", 1)), _arg(max(other, default=1)), _arg(tokens), _arg(est),
            (peak - a_c[_EX]) / safe, *(c / safe for c in fcat), *onehot,
            self.node_step[node] if node >= 0 else 0, max(first, 1.0) / max(steady, 1.0),
            *(b / safe for b in class_bytes), _arg(a_c[_S]), _arg(a_c[_M]), _arg(a_c[_L]),
            _arg(largest), largest / safe, _arg(a_t[_V] / safe), segments / safe - 1.0,
            scratch_max / safe, max(seg, 1.0) / safe,
            _arg((a_a[_VM] + a_a[_VL]) / safe), _arg(a_a[_M] + a_a[_L]), _arg(distinct),
            _arg(ws_seg / safe), float(gpu), _arg(total), (device.sm or 0) / 100, _arg(ws),
            _arg(ws / safe), est / max(total, 1.0) if total > 0 else 0.0,
        ]  # fmt: skip
        f = np.empty(len(lin) + len(self.static))
        f[: len(lin)] = lin
        f[len(lin) :] = self.static
        f[_LOGS] = np.log2(f[_LOGS]) / _SCALES
        f[_CLIP] = min(max(f[_CLIP], -4.0), 4.0)
        context = device.context_bytes or 0
        analytic = np.array([est, est, est + context])
        breakdown = {
            "categories": category_bytes(cat),
            "phase": PHASES[phase] if node >= 0 else "setup",
            "step_peaks": {("first", "steady")[s]: int(v) for s, v in steps.items()},
            "tensor_peak_bytes": int(peak),
            "workspace_bytes": int(ws),
            "context_bytes": int(context) if gpu else 0,
            "violated_guards": g.violated_guards(resolved),
        }
        return QueryResult(features=f.astype(np.float32), analytic=analytic,
                           baseline=analytic.copy(), breakdown=breakdown)  # fmt: skip


def _arg(x: float) -> float:
    """`features.log_scale`'s argument of log2."""
    return 1.0 + max(float(x), 0.0)


# the log-scaled columns of the filled list and their scales (`query_features`; the two
# plain log2 columns have scale 1), and first_over_steady, clipped to [-4, 4]
_LOG_SCALES = {"log_b": 16, "log_other_max": 16, "log_tokens": 40, "log_peak": 40,
               "first_over_steady": 1, "n_small": 16, "n_mid": 16, "n_large": 16,
               "log_max_storage": 40, "churn": 8, "seg_estimate": 1, "large_churn": 8,
               "n_large_allocs": 16, "large_sizes": 16, "ws_segment": 4, "log_total": 40,
               "log_workspace": 30, "workspace_over_peak": 4}  # fmt: skip
_LOGS = np.array([QUERY_COLUMNS.index(c) for c in _LOG_SCALES], dtype=np.int64)
_SCALES = np.array(list(_LOG_SCALES.values()), dtype=np.float64)
_CLIP = QUERY_COLUMNS.index("first_over_steady")
