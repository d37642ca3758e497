"""The analytic baseline as an `EncodingModel`: encode once, query many, vectorised over a
batch of queries (the model the service answers with for `--model analytic`).

`AnalyticModel.predict` redoes per query what depends only on the graph (columns to
arrays, sort orders, masks); for a 5k-node graph that is ~5 ms a query. `EncodedAnalytic`
does that once per graph (`encode`, cached by graph id in the server) and evaluates all
queries of a request in one numpy pass (`predict_encoded`), returning Predictions equal
to `AnalyticModel`'s field for field (tests check it). Same model, same version string.
Live bytes at node i = initial + sum(bytes allocated at nodes <= i) - sum(bytes freed
after nodes < i) + node i's scratch. A graph has few distinct size formulas (a 5k-node
GPT-2 has 23), so the encoding keeps, per node, how many live storages (and scratch) of
each formula there are (`counts`, [nodes, formulas]); the live curve of Q queries is then
one float64 matrix product `counts @ values[formulas, Q]`, exact while every partial sum
stays under 2**53 (checked per call; past it, and for graphs with too many formulas,
exact int64 cumulative sums over the storages sorted by node are used instead).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from memgnn.predictor.errors import UserError
from memgnn.predictor.ir.expr import ExprTable
from memgnn.predictor.ir.graph import StepGraph
from memgnn.predictor.ir.vocab import CATEGORIES, PHASES, category_bytes, cublas_workspaces
from memgnn.predictor.memory.analytic import STEP_NAMES, AnalyticModel, live_index, managed_bytes
from memgnn.predictor.memory.base import Prediction, Query, check_guards
from memgnn.predictor.memory.places import place_breakdown

__all__ = ["AnalyticEncoding", "EncodedAnalytic"]


@dataclass(kw_only=True, slots=True)
class _PathArrays:
    n: int
    nbytes_expr: np.ndarray  # [storages] expression index
    scratch_expr: np.ndarray  # [nodes]
    alloc: np.ndarray
    free: np.ndarray
    category: np.ndarray
    alloc_expr: np.ndarray  # expression of each storage allocated in the step, by node
    alloc_pos: np.ndarray  # [nodes] how many of them are allocated at nodes <= i
    free_expr: np.ndarray  # expression of each storage freed in the step, by node
    free_pos: np.ndarray  # [nodes] how many storages are freed after nodes < i
    initial_expr: np.ndarray  # expressions of the storages alive before the step
    counts: np.ndarray | None  # [nodes, formulas] float64, or None: too large
    count_bound: np.ndarray | None  # [formulas] max |count| over the nodes
    uses: np.ndarray  # [formulas] storages + scratch entries per formula (float64)
    step_nodes: dict[str, np.ndarray | slice]
    ops: list[str]
    phases: list[int]
    conditions: list
    workspaces: int  # cuBLAS workspaces on a CUDA device (`vocab.cublas_workspaces`)


@dataclass(kw_only=True, slots=True)
class AnalyticEncoding:
    paths: list[_PathArrays]
    guards: ExprTable | None


MAX_COUNT_CELLS = 1 << 20  # 8 MiB of counts per path at most
EXACT_FLOAT = float(1 << 52)  # below 2**53 float64 sums of integers are exact
OVERFLOW = float(1 << 62)  # a formula's value past this is taken as an int64 overflow


def _counts(
    n: int,
    n_exprs: int,
    alloc: np.ndarray,
    free: np.ndarray,
    nbytes_expr: np.ndarray,
    scratch_expr: np.ndarray,
) -> np.ndarray | None:
    if n == 0 or n * max(n_exprs, 1) > MAX_COUNT_CELLS:
        return None
    delta = np.zeros((n + 1, n_exprs), dtype=np.int64)
    inside = alloc >= 0
    np.add.at(delta, (alloc[inside], nbytes_expr[inside]), 1)
    freed = free >= 0  # freed after node f: gone from node f + 1 on
    np.add.at(delta, (free[freed] + 1, nbytes_expr[freed]), -1)
    counts = np.cumsum(delta[:n], axis=0)
    counts[np.arange(n), scratch_expr] += 1  # scratch counts at its node only
    return counts.astype(np.float64)


def _encode_path(graph: StepGraph, k: int) -> _PathArrays:
    p = graph.paths[k]
    n = p.num_nodes
    alloc, free = p.array("storages", "alloc"), p.array("storages", "free")
    index = live_index(p)  # the schedule in allocation / free order, as the features use it
    steps = p.array("nodes", "step")
    nbytes_expr = p.array("storages", "nbytes")
    scratch_expr = p.array("nodes", "scratch")
    counts = _counts(n, len(graph.exprs), alloc, free, nbytes_expr, scratch_expr)
    return _PathArrays(
        n=n,
        nbytes_expr=nbytes_expr,
        scratch_expr=scratch_expr,
        alloc=alloc,
        free=free,
        category=p.array("storages", "category"),
        alloc_expr=nbytes_expr[index.alloc_order],
        alloc_pos=index.alloc_pos,
        free_expr=nbytes_expr[index.free_order],
        free_pos=index.free_pos,
        initial_expr=nbytes_expr[index.initial_order],
        counts=counts,
        count_bound=None if counts is None else np.abs(counts).max(axis=0),
        uses=(
            np.bincount(nbytes_expr, minlength=len(graph.exprs))
            + np.bincount(scratch_expr, minlength=len(graph.exprs))
        ).astype(np.float64),
        step_nodes={
            STEP_NAMES[s]: _as_slice(np.flatnonzero(steps == s))
            for s in (0, 1)
            if np.any(steps == s)
        },
        ops=list(p.nodes["op"]),
        phases=list(p.nodes["phase"]),
        conditions=p.conditions,
        workspaces=cublas_workspaces(p.nodes["op"], p.nodes["phase"]),
    )


def _evaluate(table: ExprTable, columns: dict[str, np.ndarray]) -> np.ndarray:
    """All formulas at Q points as int64 [formulas, Q]; ValueError if any would overflow
    int64 (numpy wraps silently), found by evaluating in float64 as well."""
    n_q = len(next(iter(columns.values())))
    if not len(table):
        return np.zeros((0, n_q), dtype=np.int64)
    fn = getattr(table, "_vector", None)
    if fn is None:  # ExprTable changed: its own evaluation, without the overflow check
        return table.evaluate(columns)
    approx = np.empty((len(table), n_q), dtype=np.float64)
    out = np.empty((len(table), n_q), dtype=np.int64)
    with np.errstate(all="ignore"):
        for i, v in enumerate(fn(*(columns[s].astype(np.float64) for s in table.symbols))):
            approx[i] = v
        bad = ~(np.abs(approx) < OVERFLOW)  # NaN too
        if bad.any():
            i = int(np.flatnonzero(bad.any(axis=1))[0])
            what = "is undefined" if np.isnan(approx[i]).any() else "overflows int64"
            raise UserError(
                f"sizes too large or invalid: size formula "
                f"{table.sources[i]!r} {what} at these sizes"
            )
        for i, v in enumerate(fn(*(columns[s] for s in table.symbols))):
            out[i] = v
    return out


def _as_slice(idx: np.ndarray) -> np.ndarray | slice:
    """A contiguous index run as a slice (a view, not a gather)."""
    if len(idx) and idx[-1] - idx[0] + 1 == len(idx):
        return slice(int(idx[0]), int(idx[-1]) + 1)
    return idx


def _round(values: np.ndarray, round_to: np.ndarray) -> np.ndarray:
    """Per-column block rounding; columns with round_to <= 1 stay as they are."""
    on = round_to > 1
    if not on.any():
        return values
    r = np.where(on, round_to, 1)
    rounded = np.where(values > 0, -(-values // r) * r, 0)
    return np.where(on, rounded, values)


class EncodedAnalytic(AnalyticModel):
    """`AnalyticModel` as an `EncodingModel` (see the module docstring)."""

    thread_safe = True  # no state between calls: the server need not serialise them

    def encode(self, graph: StepGraph) -> AnalyticEncoding:
        guards = ExprTable(graph.guards, graph.all_symbols) if graph.guards else None
        return AnalyticEncoding(
            paths=[_encode_path(graph, k) for k in range(len(graph.paths))],
            guards=guards,
        )

    def predict(self, graph: StepGraph, queries: Sequence[Query]) -> list[Prediction]:
        return self.predict_encoded(self.encode(graph), graph, queries)

    def predict_encoded(
        self, enc: AnalyticEncoding, graph: StepGraph, queries: Sequence[Query]
    ) -> list[Prediction]:
        from memgnn.predictor.spec.devices import get_profile

        if not queries:
            return []
        check_guards(graph, queries)  # as AnalyticModel.predict: no answer from a wrong graph
        devices = [get_profile(q.device) for q in queries]
        metrics = [q.resolved_metric(d.is_gpu) for q, d in zip(queries, devices)]
        resolved = [graph.resolve_sizes(q.sizes, q.scenario) for q in queries]
        try:
            columns = {s: np.array([r[s] for r in resolved], dtype=np.int64) for s in resolved[0]}
        except OverflowError:
            raise UserError("sizes too large: a size overflows 64-bit integers") from None
        round_to = np.array([512 if d.is_gpu else 1 for d in devices], dtype=np.int64)
        # rounding is per value: round the few expressions, not the many storages
        per_expr = _round(_evaluate(graph.table(), columns), round_to)  # [exprs, Q]
        magnitude = np.abs(per_expr).astype(np.float64)
        if any((pa.uses @ magnitude >= OVERFLOW).any() for pa in enc.paths):
            raise UserError("sizes too large: the step's bytes overflow 64-bit integers")
        swept = [self._sweep(pa, per_expr) for pa in enc.paths]
        step_peaks = [
            {name: live[idx].max(axis=0) for name, idx in pa.step_nodes.items()}
            for pa, (_, _, live, _) in zip(enc.paths, swept)
        ]
        at_node: dict[tuple[int, int], np.ndarray] = {}  # (path, node) -> category counts
        out = []
        for q, (device, metric) in enumerate(zip(devices, metrics)):
            context = device.context_bytes if metric == "device_total" else 0
            places = [
                place_breakdown(graph, k, resolved[q], gpu=device.is_gpu)
                for k in range(len(enc.paths))
            ]
            extras = [
                (pa.workspaces * device.cublas_workspace_bytes + context if device.is_gpu else 0)
                + managed_bytes(places[k], metric)
                for k, pa in enumerate(enc.paths)
            ]
            peaks = [int(s[0][q]) + e for s, e in zip(swept, extras, strict=True)]
            best = max(range(len(peaks)), key=peaks.__getitem__)
            extra = extras[best]
            pa, node = enc.paths[best], int(swept[best][1][q])
            counts = at_node.get((best, node))
            if counts is None:
                counts = at_node[(best, node)] = _category_counts(pa, node, len(graph.exprs))
            violated = []
            if enc.guards is not None:
                ok = enc.guards.evaluate_exact(resolved[q])
                violated = [g for g, good in zip(graph.guards, ok) if not good]
            value = peaks[best]
            out.append(
                Prediction(
                    predicted_peak_bytes=value,
                    upper_bound_bytes=value,
                    metric=metric,
                    breakdown={
                        "categories": category_bytes((counts @ per_expr[:, q]).tolist()),
                        "phase": PHASES[pa.phases[node]] if node >= 0 else "setup",
                        "step_peaks": {name: int(v[q]) for name, v in step_peaks[best].items()},
                        "workspace_and_context_bytes": extra,
                        "violated_guards": violated,
                        **places[best],
                    },
                    model_version=self.version,
                    paths=[
                        {"conditions": p.conditions, "predicted_peak_bytes": peaks[k]}
                        for k, p in enumerate(enc.paths)
                    ],
                )
            )
        return out

    @staticmethod
    def _sweep(
        pa: _PathArrays, per_expr: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(peak [Q], peak node [Q] (-1: before the step), live [nodes, Q], per_expr)."""
        n_q = per_expr.shape[1]
        initial = per_expr[pa.initial_expr].sum(axis=0)
        if pa.n == 0:
            return initial, np.full(n_q, -1), np.zeros((0, n_q), np.int64), per_expr
        if pa.counts is not None and _exact(pa.count_bound, per_expr):
            live = (pa.counts @ per_expr.astype(np.float64)).astype(np.int64)
            live += initial
        else:
            live = EncodedAnalytic._live_int(pa, per_expr, initial)
        node = np.argmax(live, axis=0)
        top = live[node, np.arange(n_q)]
        before = initial >= top
        return np.where(before, initial, top), np.where(before, -1, node), live, per_expr

    @staticmethod
    def _live_int(pa: _PathArrays, per_expr: np.ndarray, initial: np.ndarray) -> np.ndarray:
        zero = np.zeros((1, per_expr.shape[1]), dtype=np.int64)
        added = np.concatenate([zero, np.cumsum(per_expr[pa.alloc_expr], axis=0)])
        freed = np.concatenate([zero, np.cumsum(per_expr[pa.free_expr], axis=0)])
        live = added[pa.alloc_pos]
        live -= freed[pa.free_pos]
        live += per_expr[pa.scratch_expr]
        live += initial
        return live


def _exact(bound: np.ndarray | None, per_expr: np.ndarray) -> bool:
    """Whether counts @ values stays exact in float64 (every partial sum < 2**52)."""
    if bound is None or per_expr.size == 0:
        return bound is not None
    return float(bound @ np.abs(per_expr).max(axis=1).astype(np.float64)) < EXACT_FLOAT


def _category_counts(pa: _PathArrays, node: int, n_exprs: int) -> np.ndarray:
    """[categories, formulas]: how many storages of each are alive at `node` (-1: before
    the step), as `predictor.memory.analytic` counts them for its breakdown."""
    if node < 0:
        alive = pa.alloc < 0
    else:
        alive = (pa.alloc <= node) & ((pa.free < 0) | (pa.free >= node))
    cells = pa.category[alive] * n_exprs + pa.nbytes_expr[alive]
    counts = np.bincount(cells, minlength=len(CATEGORIES) * n_exprs)
    return counts.reshape(len(CATEGORIES), n_exprs)
