"""What a query must satisfy against a graph before any model answers it."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from memgnn.predictor.errors import UserError
from memgnn.predictor.ir.graph import StepGraph
from memgnn.predictor.memory.base import Query

__all__ = ["check_sizes"]


def check_sizes(graph: StepGraph, queries: Sequence[Query]) -> None:
    """The caller's sizes against the graph: every symbol given, and no size formula
    (a byte count) negative at them. UserError names the config."""
    resolved = []
    for i, q in enumerate(queries):
        try:
            resolved.append(graph.resolve_sizes(q.sizes, q.scenario))
        except (ValueError, ArithmeticError) as exc:
            raise UserError(str(exc), loc=("configs", i, "sizes")) from None
    if not resolved or not graph.exprs:
        return
    columns = {s: np.array([r[s] for r in resolved], dtype=np.int64) for s in graph.all_symbols}
    try:
        values = graph.table().evaluate(columns).reshape(len(graph.exprs), -1)
    except (UserError, ArithmeticError):
        return  # too large for int64: the model's own checks locate and name it
    negative = values < 0
    if negative.any():
        i = int(np.flatnonzero(negative.any(axis=0))[0])  # the first failing config
        expr = int(np.flatnonzero(negative[:, i])[0])
        raise UserError(
            f"size formula {graph.exprs[expr][:80]!r} is negative ({int(values[expr, i])}) "
            "at these sizes: the graph does not hold there",
            loc=("configs", i if values.shape[1] > 1 else 0, "sizes"),
        )
