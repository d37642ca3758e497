"""One query's features at a fixed cost: `PathContext.query_many` for a single query.

`query_many` is vectorised over a batch of queries ([queries, pairs] arrays); for one
query its cost is ~150 small numpy calls, ~1 ms whatever the graph's size. `FastQuery`
stacks once what depends only on the path (`__init__`), evaluates the size formulas as
Python integers, runs the block walk and the sums at the peak in one compiled call
(`predictor.memory.query_kernel`), and fills the feature vector from a list with one `log2`
call for all its log-scaled columns.

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
from memgnn.predictor.ir.vocab import CATEGORIES, PHASES, category_bytes
from memgnn.predictor.memory.features import FEATURE_CATEGORIES, QUERY_COLUMNS
from memgnn.predictor.memory.query_kernel import (
    N_OUT,
    OUT_BIG_BYTES,
    OUT_BIG_COUNT,
    OUT_CHURN,
    OUT_COL,
    OUT_DISTINCT,
    OUT_EX,
    OUT_EXACT,
    OUT_L,
    OUT_LARGEST,
    OUT_LR,
    OUT_M,
    OUT_PEAK,
    OUT_S,
    OUT_SCRATCH,
    OUT_SEG,
    OUT_VL,
    OUT_VM,
    OUT_VS,
    peak_aggregates,
)

if TYPE_CHECKING:
    from memgnn.predictor.memory.query_features import PathContext

__all__ = ["FastQuery", "QueryResult", "ws_segment"]

_MIB = 1 << 20
_SEG_SMALL, _SEG_MID = 2 * _MIB, 20 * _MIB
SAFE_SIZE = 1 << 16  # below this no size formula can overflow int64 (`ExprTable`)


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
        self.usable = blocks is not None and pairs.alive_at is not None and len(blocks.starts) > 2
        if not self.usable:
            return
        n_exprs = len(ctx.graph.exprs)
        i64 = np.int64
        # the rows of the count matrices: the pairs' formulas, then the scratch formulas
        self.vcols = np.ascontiguousarray(
            np.concatenate([pairs.expr, n_exprs + ctx.scratch_exprs]), dtype=i64
        )
        self.n_pairs = len(pairs.expr)
        self.upper = np.ascontiguousarray(blocks.upper, dtype=np.float64)
        self.counts = blocks.counts
        self.starts = np.ascontiguousarray(blocks.starts, dtype=i64)
        self.ends = np.ascontiguousarray(blocks.ends, dtype=i64)
        gi = {g: k for k, g in enumerate(blocks.group_ids.tolist())}
        gob = [gi[g] for g in blocks.group_of_block.tolist()]  # group index of each block
        self.block_group = np.asarray(gob, dtype=i64)
        # blocks of a group are contiguous ([lo, hi) in block order)
        self.group_lo = np.array([gob.index(k) for k in range(len(gi))], dtype=i64)
        self.group_hi = np.array([len(gob) - gob[::-1].index(k) for k in range(len(gi))], i64)
        self.group_step = blocks.group_ids.tolist()  # the step of each group
        self.alive_at = np.ascontiguousarray(pairs.alive_at, dtype=np.float64)
        self.initial = np.ascontiguousarray(pairs.initial, dtype=np.float64)
        self.pcat = np.ascontiguousarray(pairs.category.argmax(axis=1), dtype=i64)
        self.total = pairs.total.astype(np.float64)
        self.allocated = pairs.allocated.astype(np.float64)
        self.scratch_e = np.ascontiguousarray(ctx.scratch_exprs, dtype=i64)
        self.n_out = N_OUT + len(gi) + len(CATEGORIES)
        self.steps = list(ctx.step_nodes)
        self.at = ctx.at.tolist()
        self.phase = ctx.phase.tolist()
        self.node_step = ctx.step.tolist()
        self.static = ctx.static

    def query(self, sizes: dict[str, int], device: Any, scenario: str) -> QueryResult | None:
        """The query's result, or None where only `query_many` can promise the bits."""
        if not self.usable:
            return None
        resolved = self.graph.resolve_sizes(sizes, scenario)
        if max(resolved.values(), default=0) >= SAFE_SIZE or not self.table._small_is_safe:
            return None
        ints = self.table.evaluate_exact(resolved) if len(self.table) else []
        if min(ints, default=0) < 0:
            return None
        gpu = bool(device.is_gpu)
        ws = float(self.ctx._workspace(device))
        out = np.empty(self.n_out)
        peak_aggregates(np.array(ints, dtype=np.int64), gpu, ws, self.vcols, self.n_pairs,
                        self.upper, self.counts, self.starts, self.ends, self.block_group,
                        self.group_lo, self.group_hi, self.alive_at, self.initial, self.pcat,
                        self.total, self.allocated, self.scratch_e, out)  # fmt: skip
        if out[OUT_EXACT] == 0.0:
            return None  # sums could round: only the reference's order gives its bits
        return self._result(resolved, device, gpu, ws, out.tolist())

    def _result(self, resolved, device, gpu: bool, ws: float, o: list[float]) -> QueryResult:
        g = self.graph
        peak, col = o[OUT_PEAK], int(o[OUT_COL])
        node = self.at[col] if col >= 0 else -1
        n_g = len(self.group_step)
        steps = dict(zip(self.group_step, o[N_OUT : N_OUT + n_g]))
        steps = {s: steps[s] for s in self.steps}
        cat = o[N_OUT + n_g :]
        est = peak + ws
        safe = max(peak, 1.0)
        dims = {s: v for s, v in resolved.items() if s in g.symbols}
        other = [v for s, v in dims.items() if s != "B"]
        tokens = math.prod([float(v) for v in dims.values()])
        k = len(FEATURE_CATEGORIES)
        fcat = [*cat[: k - 1], cat[k - 1] + sum(cat[k:])]
        phase = self.phase[node] if node >= 0 else 0
        first, steady = steps.get(0, peak), steps.get(1, peak)
        class_bytes = (o[OUT_VS], o[OUT_VM], o[OUT_VL])
        segments = (math.ceil(class_bytes[0] / _SEG_SMALL) * 2 * _MIB
                    + math.ceil(class_bytes[1] / _SEG_MID) * 20 * _MIB + o[OUT_LR])  # fmt: skip
        largest, seg = o[OUT_LARGEST], o[OUT_SEG]
        total = float(device.total_bytes or 0)
        ws_seg = ws_segment(device.cublas_workspace_bytes) * 2 if gpu else 0.0
        onehot = [0.0] * len(PHASES)
        onehot[phase] = 1.0
        # log-scaled columns hold 1 + max(x, 0) until the one log2 call below
        lin = [
            _arg(dims.get("B", 1)), _arg(max(other, default=1)), _arg(tokens), _arg(est),
            (peak - o[OUT_EX]) / safe, *(c / safe for c in fcat), *onehot,
            self.node_step[node] if node >= 0 else 0, max(first, 1.0) / max(steady, 1.0),
            *(b / safe for b in class_bytes), _arg(o[OUT_S]), _arg(o[OUT_M]), _arg(o[OUT_L]),
            _arg(largest), largest / safe, _arg(o[OUT_CHURN] / safe), segments / safe - 1.0,
            o[OUT_SCRATCH] / safe, max(seg, 1.0) / safe, _arg(o[OUT_BIG_BYTES] / safe),
            _arg(o[OUT_BIG_COUNT]), _arg(o[OUT_DISTINCT]),
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
