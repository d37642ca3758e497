"""Query features: what the head sees for one graph path at (sizes, device, scenario).

Log sizes, training config, device profile, the analytic liveness-sweep estimate of each
metric, and a few size-dependent aggregates at the analytic peak (category shares, storage
size classes the caching allocator treats differently, segment-rounded bytes); the columns
are `features.QUERY_COLUMNS`.

Every one of them is a function of the values of the graph's byte-size expressions, and a
path has far fewer distinct (expression, category) pairs than storages (GPT-2 with 16
blocks: 3,772 storages, 23 expressions). `PathContext` therefore counts, once per path,
the storages of each pair alive at every node where live bytes can rise; a batch of
queries is then one small matrix product for the live-byte curves plus array operations
over [queries, pairs], with no per-storage work per query. The sums are exact: byte counts
are integers and stay below 2**53 (8 PiB) for any size a device can hold.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from memgnn.predictor.ir.graph import StepGraph
from memgnn.predictor.ir.vocab import (
    CATEGORIES,
    FEATURE_CATEGORIES,
    PHASES,
    category_bytes,
    cublas_workspaces,
)
from memgnn.predictor.memory.analytic import live_curves, live_index, round_bytes
from memgnn.predictor.memory.curve_bounds import CurveBlocks
from memgnn.predictor.memory.features import config_features, log_scale, op_id
from memgnn.predictor.memory.query_fast import FastQuery, QueryResult, ws_segment

_MIB = 1 << 20
# above this many (pair, node) counts the curves use per-storage cumulative sums instead
# of the dense count matrix (a few graphs with hundreds of expressions and 10k+ nodes)
MAX_COUNT_MATRIX = 1 << 20


@dataclass(frozen=True, slots=True)
class PeakState:
    """Per query [Q]: the analytic peak, its node (-1: before the step) and phase, each
    step's peak, and the bytes alive there by category [Q, len(CATEGORIES)]."""

    peak: np.ndarray
    node: np.ndarray
    phase: np.ndarray
    steps: dict[int, np.ndarray]
    categories: np.ndarray


@dataclass(frozen=True, slots=True)
class Pairs:
    """A path's storages grouped by (byte-size expression, category)."""

    expr: np.ndarray  # [K] expression index of each pair
    of_storage: np.ndarray  # [S] pair of each storage
    category: np.ndarray  # [K, len(CATEGORIES)] one-hot category (float64)
    total: np.ndarray  # [K] storages per pair
    allocated: np.ndarray  # [K] of them allocated during the step
    initial: np.ndarray  # [K] of them alive before the first node (float64)
    alive_at: np.ndarray | None  # [K, nodes in `at`] alive at each curve node (float64)


def path_pairs(graph: StepGraph, path: int, at: np.ndarray) -> Pairs:
    """Group a path's storages by (expression, category) and count them over the schedule
    at the nodes `at` (a storage is alive at node i from its allocating node through the
    node after which it is freed; storages with alloc -1 are alive before the step)."""
    p = graph.paths[path]
    alloc, free = p.array("storages", "alloc"), p.array("storages", "free")
    nc = len(CATEGORIES)
    keys, of_storage = np.unique(
        p.array("storages", "nbytes") * nc + p.array("storages", "category"), return_inverse=True
    )
    k = len(keys)
    of_storage = of_storage.reshape(-1).astype(np.int64)
    alive_at = None
    if k * len(at) <= MAX_COUNT_MATRIX:
        delta = np.zeros((k, p.num_nodes + 1), dtype=np.int64)
        np.add.at(delta, (of_storage, np.maximum(alloc, 0)), 1)
        gone = free >= 0
        np.add.at(delta, (of_storage[gone], free[gone] + 1), -1)
        alive_at = np.cumsum(delta, axis=1)[:, at].astype(np.float64)
    return Pairs(
        expr=keys // nc,
        of_storage=of_storage,
        category=np.eye(nc)[keys % nc],
        total=np.bincount(of_storage, minlength=k),
        allocated=np.bincount(of_storage[alloc >= 0], minlength=k),
        initial=np.bincount(of_storage[alloc < 0], minlength=k).astype(np.float64),
        alive_at=alive_at,
    )


class PathContext:
    """Per (graph, path) arrays reused by every query (built once, cached by the caller)."""

    def __init__(self, graph: StepGraph, path: int = 0):
        self.graph, self.path = graph, path
        p = graph.paths[path]
        # Live bytes only rise at a node that allocates or has kernel scratch: every maximum
        # over the schedule (the peak, each step's peak, the segment estimate) is reached at
        # such a node or at the first node of a step, so the curves are computed there only.
        steps = p.array("nodes", "step")
        alloc = p.array("storages", "alloc")
        zero = np.array([e.strip() == "0" for e in graph.exprs] or [True])
        rises = ~zero[p.array("nodes", "scratch")] if p.num_nodes else np.zeros(0, dtype=bool)
        rises[alloc[alloc >= 0]] = True
        rises[np.flatnonzero(np.diff(steps, prepend=-1))] = True  # first node of each step
        self.at = np.flatnonzero(rises)  # the nodes where curves are evaluated
        self.pairs = path_pairs(graph, path, self.at)
        self.index = None  # the schedule for per-storage curves, where no count matrix is
        if self.pairs.alive_at is None:
            full = live_index(p)
            self.index = replace(
                full, alloc_pos=full.alloc_pos[self.at], free_pos=full.free_pos[self.at]
            )
        self.scratch_at = p.array("nodes", "scratch")[self.at]
        # the scratch formulas at the curve nodes, and block bounds over [pair counts;
        # scratch one-hot] (predictor.memory.curve_bounds): a query evaluates few of the nodes
        self.scratch_exprs, scratch_row = np.unique(self.scratch_at, return_inverse=True)
        self.scratch_row = scratch_row.reshape(-1)  # row in scratch_exprs of each curve node
        self.blocks = None
        if self.pairs.alive_at is not None:
            onehot = np.zeros((len(self.scratch_exprs), len(self.at)))
            onehot[self.scratch_row, np.arange(len(self.at))] = 1.0
            counts = np.concatenate([self.pairs.alive_at, onehot])
            self.blocks = CurveBlocks(counts, steps[self.at])
        self.step_nodes = {
            s: np.flatnonzero(steps[self.at] == s) for s in (0, 1) if np.any(steps == s)
        }
        self.alloc, self.free = alloc, p.array("storages", "free")
        self.phase, self.step = p.array("nodes", "phase"), steps
        n = max(p.num_nodes, 1)
        unknown = sum(op_id(op)[1] for op in p.nodes["op"])
        self.workspace_handles = cublas_workspaces(p.nodes["op"], p.nodes["phase"])
        self.static = np.concatenate([
            config_features(graph.train, graph.meta.get("target", "cuda")),
            [log_scale(p.num_nodes, 16), log_scale(p.num_storages, 16),
             float(np.mean(self.phase == PHASES.index("backward"))) if p.num_nodes else 0.0,
             unknown / n],
        ]).astype(np.float64)  # fmt: skip
        self._fast: FastQuery | None = None  # built at the first `query`

    def query(self, sizes: dict[str, int], device: Any, scenario: str = "worst") -> QueryResult:
        """Query features at `sizes` on `device` (a `predictor.spec.devices.DeviceProfile`):
        `query_many` of one query, to the bit, at a fixed cost (`predictor.memory.query_fast`)."""
        fast = self._fast
        if fast is None:
            fast = self._fast = FastQuery(self)
        ask = (sizes, device, scenario)
        return fast.query(*ask) or self.query_many([ask])[0]

    def _workspace(self, device: Any) -> int:
        return self.workspace_handles * device.cublas_workspace_bytes if device.is_gpu else 0

    def _curves(self, values_RK: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(bytes alive before the first node [R], live bytes at the `at` nodes [R, A]) for
        R assignments of bytes to pairs."""
        pairs = self.pairs
        if pairs.alive_at is not None:
            return values_RK @ pairs.initial, values_RK @ pairs.alive_at
        return live_curves(self.index, np.take(values_RK, pairs.of_storage, axis=1))

    def _alive_counts(self, node_Q: np.ndarray) -> np.ndarray:
        """Storages of each pair alive at each query's peak node (-1: before the step)."""
        k = len(self.pairs.expr)
        node = node_Q[:, None]
        alive = (self.alloc <= node) & ((self.free < 0) | (self.free >= node))
        slot = np.arange(len(node_Q))[:, None] * k + self.pairs.of_storage
        counts = np.bincount(slot[alive], minlength=len(node_Q) * k)
        return counts.reshape(len(node_Q), k).astype(np.float64)

    def query_many(self, queries: list[tuple[dict[str, int], Any, str]]) -> list[QueryResult]:
        """`query` for (sizes, device, scenario) triples at once, in array operations over
        [queries, pairs] (see the module docstring)."""
        g, pairs, q = self.graph, self.pairs, len(queries)
        resolved = [g.resolve_sizes(sizes, scenario) for sizes, _, scenario in queries]
        devices = [d for _, d, _ in queries]
        columns = {s: np.array([r[s] for r in resolved], dtype=np.int64) for s in resolved[0]}
        per_expr = g.table().evaluate(columns).reshape(len(g.exprs), q).T  # [Q, exprs]
        gpu = np.array([bool(d.is_gpu) for d in devices])
        rounded = np.where(gpu[:, None], round_bytes(per_expr, 512), per_expr)
        exact = np.take(per_expr, pairs.expr, axis=1).astype(np.float64)  # [Q, K]
        values = np.take(rounded, pairs.expr, axis=1)  # int64 [Q, K]
        small, large = values <= _MIB, values >= 10 * _MIB
        mid = ~small & ~large
        large_rounded = np.where(large, round_bytes(values, 2 * _MIB), 0).astype(np.float64)
        values = values.astype(np.float64)
        scratch = np.where(gpu[:, None], np.take(rounded, self.scratch_exprs, axis=1), 0)
        ws = np.array([self._workspace(d) for d in devices], dtype=np.float64)
        initial, cols, live, seg = self._schedule(values, small, mid, large_rounded, scratch, ws)
        col = live.argmax(axis=1) if live.shape[1] else np.zeros(q, dtype=np.int64)
        top = live.max(axis=1, initial=-np.inf)
        rose = top > initial
        peak = np.where(rose, top, initial)
        node = np.where(rose, self.at[cols[col]] if len(cols) else -1, -1)
        col_step = self.step[self.at[cols]]
        steps = {s: live[:, col_step == s].max(axis=1) for s in self.step_nodes}
        if pairs.alive_at is not None:  # [Q, K] storages alive at the peak, as counted
            at_peak = pairs.alive_at[:, cols[col]].T if len(cols) else np.zeros((q, 0))
            counts = np.where((node >= 0)[:, None], at_peak, pairs.initial[None, :])
        else:
            counts = self._alive_counts(node)
        cat = (counts * values) @ pairs.category
        est = peak + ws
        safe = np.maximum(peak, 1.0)
        shares = _at_peak(counts, values, exact, (small, mid, large), large_rounded, peak)
        big = ~small * pairs.allocated  # blocks of 1 MiB and more allocated in the step
        phase = np.where(node >= 0, self.phase[np.maximum(node, 0)], 0)
        first = steps.get(0, peak)
        steady = steps.get(1, peak)
        f = np.column_stack([
            _size_features(g, resolved), log_scale(est), shares["round_slack"],
            _feature_cats(cat) / safe[:, None], np.eye(len(PHASES))[phase],
            np.where(node >= 0, self.step[np.maximum(node, 0)], 0),
            np.clip(np.log2(np.maximum(first, 1.0) / np.maximum(steady, 1.0)), -4, 4),
            shares["classes"], log_scale(values @ pairs.total / safe, 8),
            shares["segment_slack"], scratch.max(axis=1, initial=0) / safe,
            np.log2(np.maximum(seg, 1.0) / safe), log_scale((big * values).sum(axis=1) / safe, 8),
            log_scale(big.sum(axis=1), 16), log_scale(_distinct(values, big > 0), 16),
            _device_features(devices, est, ws, safe), np.tile(self.static, (q, 1)),
        ]).astype(np.float32)  # fmt: skip
        at = PeakState(peak=peak, node=node, phase=phase, steps=steps, categories=cat)
        return self._results(resolved, devices, f, est, ws, at)

    def _schedule(self, values, small, mid, large_rounded, scratch, ws):
        """(bytes alive before the step [Q], the curve nodes evaluated (positions in `at`,
        sorted) [C], live bytes there [Q, C], and a caching-allocator-shaped estimate [Q]:
        the max over the schedule of small blocks in 2 MiB segments + 1-10 MiB blocks (and
        the workspaces) in 20 MiB segments + large blocks rounded to 2 MiB (with the kernel
        scratch)). `scratch` [Q, len(scratch_exprs)]: bytes of each scratch formula. The
        nodes left out hold no maximum (`predictor.memory.curve_bounds`)."""
        q = len(values)
        sets = np.concatenate(
            [values, np.where(small, values, 0), np.where(mid, values, 0), large_rounded]
        )

        def curves(live: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
            seg = (np.ceil(live[q : 2 * q] / (2 * _MIB)) * 2 * _MIB
                   + np.ceil((live[2 * q : 3 * q] + ws[:, None]) / (20 * _MIB)) * 20 * _MIB
                   + live[3 * q :])  # fmt: skip
            return live[:q], [seg]

        if self.blocks is not None and sets.min(initial=0) >= 0 and scratch.min(initial=0) >= 0:
            none = np.zeros_like(scratch)
            with_scratch = np.concatenate([scratch, none, none, scratch]).astype(np.float64)
            cols, live = self.blocks.candidates(np.hstack([sets, with_scratch]), curves)
            initial = sets[:q] @ self.pairs.initial
        else:
            initial, live = self._curves(sets)
            initial = initial[:q]
            per_node = np.take(scratch, self.scratch_row, axis=1)
            live[:q] += per_node
            live[3 * q :] += per_node
            cols = np.arange(live.shape[1])
        main, (seg,) = curves(live)
        return initial, cols, main, seg.max(axis=1, initial=0)

    def _results(self, resolved, devices, f, est, ws, at: PeakState) -> list[QueryResult]:
        """Per query: features, the analytic estimates and the breakdown at the peak."""
        g, results = self.graph, []
        peak, node, phase, steps, cat = at.peak, at.node, at.phase, at.steps, at.categories
        for i, device in enumerate(devices):
            context = device.context_bytes or 0
            analytic = np.array([est[i], est[i], est[i] + context])
            breakdown = {
                "categories": category_bytes(cat[i]),
                "phase": PHASES[phase[i]] if node[i] >= 0 else "setup",
                "step_peaks": {("first", "steady")[s]: int(v[i]) for s, v in steps.items()},
                "tensor_peak_bytes": int(peak[i]),
                "workspace_bytes": int(ws[i]),
                "context_bytes": int(context) if device.is_gpu else 0,
                "violated_guards": g.violated_guards(resolved[i]),
            }
            results.append(QueryResult(features=f[i], analytic=analytic,
                                       baseline=analytic.copy(), breakdown=breakdown))  # fmt: skip
        return results


def _at_peak(counts, values, exact, classes, large_rounded, peak) -> dict[str, np.ndarray]:
    """Size-class aggregates of the storages alive at each query's peak ([Q, K] inputs)."""
    safe = np.maximum(peak, 1.0)
    held = counts * values
    class_bytes = np.column_stack([(held * c).sum(axis=1) for c in classes])
    class_count = np.column_stack([(counts * c).sum(axis=1) for c in classes])
    largest = np.where(counts > 0, values, 0).max(axis=1, initial=0)
    segments = (np.ceil(class_bytes[:, 0] / (2 * _MIB)) * 2 * _MIB
                + np.ceil(class_bytes[:, 1] / (20 * _MIB)) * 20 * _MIB
                + (counts * large_rounded).sum(axis=1))  # fmt: skip
    return {
        "round_slack": (peak - (counts * exact).sum(axis=1)) / safe,
        "classes": np.column_stack(
            [
                class_bytes / safe[:, None],
                log_scale(class_count, 16),
                log_scale(largest),
                largest / safe,
            ]
        ),  # fmt: skip
        "segment_slack": segments / safe - 1.0,
    }


def _distinct(values: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Per row, the number of distinct values where mask holds (values are >= 0)."""
    s = np.sort(np.where(mask, values, -1.0), axis=1)
    new = np.ones_like(s, dtype=bool)
    new[:, 1:] = s[:, 1:] != s[:, :-1]
    return (new & (s >= 0)).sum(axis=1)


def _size_features(graph: StepGraph, resolved: list[dict[str, int]]) -> np.ndarray:
    """log B, log of the largest other input size, log of their product (tokens)."""
    rows = []
    for r in resolved:
        dims = {s: v for s, v in r.items() if s in graph.symbols}
        other = [v for s, v in dims.items() if s != "B"]
        rows.append([dims.get("B", 1), max(other, default=1),
                     np.prod([float(v) for v in dims.values()])])  # fmt: skip
    a = np.array(rows, dtype=np.float64)
    return np.column_stack([log_scale(a[:, 0], 16), log_scale(a[:, 1], 16), log_scale(a[:, 2])])


def _device_features(devices: list[Any], est: np.ndarray, ws: np.ndarray, safe: np.ndarray):
    gpu = np.array([float(bool(d.is_gpu)) for d in devices])
    total = np.array([float(d.total_bytes or 0) for d in devices])
    ws_seg = np.array([ws_segment(d.cublas_workspace_bytes) * 2 if d.is_gpu else 0.0
                       for d in devices])  # fmt: skip
    return np.column_stack([
        log_scale(ws_seg / safe, 4), gpu, log_scale(total),
        np.array([(d.sm or 0) / 100 for d in devices]), log_scale(ws, 30),
        log_scale(ws / safe, 4), np.where(total > 0, est / np.maximum(total, 1.0), 0.0),
    ])  # fmt: skip


def _feature_cats(cat: np.ndarray) -> np.ndarray:
    """[Q, len(CATEGORIES)] bytes by category -> the feature columns (comm in temporary)."""
    k = len(FEATURE_CATEGORIES)
    out = cat[:, :k].copy()
    out[:, k - 1] += cat[:, k:].sum(axis=1)
    return out
