"""`POST /snapshots/replay`: a `torch.cuda.memory._dump_snapshot()` file through the
allocator simulator (the `memgnn snapshot replay` report, same fields, all bytes).

The body is the snapshot file itself (pickle, plain or gzip), loaded by the data-only
loader (`predictor.snapshot.loader`: no code is ever imported from it). Limits: the body
(the server's `max_request_bytes`), the decompressed pickle (`max_decompressed_bytes`)
and the number of trace events (`MAX_EVENTS`). Nothing is stored, so no token is needed;
instead each client's calls a minute and the replays at once are bounded (`ServeConfig.
snapshot_limit`, `serving.ratelimit`): past them, 429 with Retry-After.
"""

from __future__ import annotations

import logging
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.concurrency import run_in_threadpool
from memgnn.predictor.snapshot.loader import LoadLimits, loads_snapshot
from memgnn.predictor.snapshot.whatif import replay_report
from memgnn.serving.deps import snapshot_slot
from memgnn.serving.graphs import RequestError
from pydantic import BaseModel, ConfigDict

log = logging.getLogger(__name__)

__all__ = ["MAX_EVENTS", "router"]

MAX_EVENTS = 5_000_000  # replay is linear in events (about 10 us each)

router = APIRouter(tags=["snapshots"])

_SNAPSHOT_BODY = {
    "requestBody": {
        "required": True,
        "description": "a torch.cuda.memory._dump_snapshot() pickle (plain or gzip)",
        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
    }
}


class SnapshotReplayOut(BaseModel):
    """The contract fields; the rest of the report (details) passes through."""

    model_config = ConfigDict(extra="allow")

    initial_reserved_bytes: int
    recorded_peak_reserved_bytes: int
    simulated_peak_reserved_bytes: int
    recorded_peak_allocated_bytes: int
    simulated_peak_allocated_bytes: int
    recorded_segment_allocs: int
    simulated_segment_allocs: int
    segment_allocs_matched: int
    first_divergence: dict[str, Any] | None
    fragmentation_at_peak: float
    would_oom: bool | None
    alloc_conf: str


@router.post(
    "/snapshots/replay", response_model=SnapshotReplayOut, openapi_extra=_SNAPSHOT_BODY,
    dependencies=[Depends(snapshot_slot)],
)  # fmt: skip
async def replay_snapshot(
    request: Request,
    alloc_conf: Annotated[
        str | None, Query(max_length=1000, description="what-if PYTORCH_CUDA_ALLOC_CONF")
    ] = None,
    capacity_bytes: Annotated[
        int | None, Query(ge=1, description="device bytes for the allocator (OOM post-mortem)")
    ] = None,
    memory_fraction: Annotated[
        float | None, Query(gt=0, le=1, description="per-process fraction of capacity_bytes")
    ] = None,
    device: Annotated[int | None, Query(ge=0, le=1023)] = None,
) -> Any:
    """Replay the snapshot's requests: recorded vs simulated peaks, segment allocations,
    first divergence; with `alloc_conf` a what-if, with `capacity_bytes` the OOM verdict
    and which settings would avoid it."""
    config = request.app.state.config
    body = await request.body()
    if len(body) > config.max_request_bytes:
        raise RequestError(
            f"snapshot of {len(body)} bytes exceeds {config.max_request_bytes}",
            status=413,
            loc=("body",),
        )
    if not body:
        raise RequestError("empty body: send the snapshot file", status=422, loc=("body",))

    def work() -> dict[str, Any]:
        limits = LoadLimits(max_bytes=config.max_decompressed_bytes)
        snap = loads_snapshot(body, device=device, limits=limits, what="request body")
        if len(snap.trace) > MAX_EVENTS:
            raise RequestError(
                f"{len(snap.trace)} trace events, over the limit of {MAX_EVENTS}",
                status=413,
                loc=("body",),
            )
        return replay_report(
            snap,
            alloc_conf=alloc_conf,
            capacity_bytes=capacity_bytes,
            memory_fraction=memory_fraction,
        )

    return await run_in_threadpool(work)
