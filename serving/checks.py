"""What a request must satisfy against a graph, before the model or the store sees it:
sizes that the graph's formulas accept (no negative byte counts), measurements the graph
makes possible, and zoo hparams within the server's bounds. Errors are `RequestError`s
naming the field."""

from __future__ import annotations

from memgnn.predictor.ir.graph import StepGraph
from memgnn.predictor.memory.base import Query
from memgnn.predictor.spec.devices import get_profile
from memgnn.serving.graphs import RequestError


def resident_bytes(graph: StepGraph, query: Query) -> int:
    """The exact bytes the graph holds before its step starts (the storages alive at
    entry: the parameters, and whatever else the capture found resident), at the query's
    sizes, unrounded; the smallest over the control-flow paths. Any measured peak of the
    step includes them."""
    values = graph.table().evaluate_exact(graph.resolve_sizes(query.sizes, query.scenario))
    per_path = []
    for p in graph.paths:
        alive = p.array("storages", "nbytes")[p.array("storages", "alloc") < 0]
        per_path.append(sum(values[i] for i in alive.tolist()))
    return min(per_path, default=0)


def check_measurement(graph: StepGraph, query: Query, measured_bytes: int) -> None:
    """Refuse a measured peak the graph makes impossible: not positive, below the bytes
    the step holds before it starts, or above the device's memory."""
    where = ("body", "measured_peak_bytes")
    if measured_bytes <= 0:
        raise RequestError(f"measured peak must be > 0 bytes, got {measured_bytes}", loc=where)
    floor = resident_bytes(graph, query)
    if measured_bytes < floor:
        raise RequestError(
            f"measured peak {measured_bytes} bytes is below the {floor} bytes this graph "
            f"holds before its step starts at sizes {query.sizes} (its parameters and other "
            "resident storages): not a measurement of this step",
            loc=where,
        )
    total = get_profile(query.device).total_bytes
    if total is not None and measured_bytes > total:
        raise RequestError(
            f"measured peak {measured_bytes} bytes exceeds the {total} bytes of {query.device}",
            loc=where,
        )


__all__ = ["check_measurement", "resident_bytes"]
