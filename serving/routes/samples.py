"""`/samples`: live measurements in, residual corrections out."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from memgnn.predictor.memory.base import Query as PredictQuery
from memgnn.serving import schemas as s
from memgnn.serving.deps import Eng, Writer

router = APIRouter(tags=["samples"])


@router.post("/samples", response_model=s.SampleOut)
def add_sample(req: s.SampleIn, eng: Eng, writer: Writer, request: Request) -> Any:
    """Store a live measurement (committed before the reply); returns the residual
    correction /predict applies from now on for this graph, device and metric."""
    query = PredictQuery(
        sizes=req.sizes, device=req.device, metric=req.metric, scenario=req.scenario
    )
    row, created, raw, corr = eng.add_sample(
        graph_id=req.graph_id,
        query=query,
        measured_bytes=req.measured_peak_bytes,
        key=req.key,
        provenance={
            "principal": writer,
            "client": request.client.host if request.client else None,
            "source": req.source,
        },
    )
    return {
        "stored": created,
        "sample_id": row,
        "graph_id": req.graph_id,
        "device": req.device,
        "metric": raw.metric,
        "model_version": raw.model_version,
        "predicted_peak_bytes": raw.predicted_peak_bytes,
        "upper_bound_bytes": raw.upper_bound_bytes,
        "correction": corr.to_dict(),
    }


@router.get("/samples", response_model=s.SamplesOut)
def list_samples(
    eng: Eng,
    graph_id: Annotated[str, Query(pattern=r"^[0-9a-f]{8,64}$")],
    device: Annotated[s.Device | None, Query()] = None,
    metric: Annotated[s.Metric | None, Query()] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> Any:
    """The most recent samples of a graph, and the correction for (device, metric)."""
    corr = None
    if device is not None and metric is not None:
        corr = eng.store.correction(graph_id, device, metric, eng.version).to_dict()
    return {
        "graph_id": graph_id,
        "device": device,
        "metric": metric,
        "correction": corr,
        "samples": eng.store.samples(graph_id, device, metric, limit),
    }
