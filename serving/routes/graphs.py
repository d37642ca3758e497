"""`POST /graphs`: upload a StepGraph once, then refer to it by id."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from memgnn.serving import schemas as s
from memgnn.serving.deps import Config, Eng, require_writer
from memgnn.serving.graphs import build_graph, decode_body, parse_json

router = APIRouter(tags=["graphs"])

_GRAPH_BODY = {
    "requestBody": {
        "required": True,
        "description": "a StepGraph: the `StepGraph.save` file (gzip JSON, or send "
        "`Content-Encoding: gzip`) or plain JSON",
        "content": {
            "application/json": {"schema": {"type": "object"}},
            "application/gzip": {"schema": {"type": "string", "format": "binary"}},
        },
    }
}


@router.post(
    "/graphs",
    response_model=s.GraphOut,
    status_code=201,
    openapi_extra=_GRAPH_BODY,
    responses={200: {"model": s.GraphOut, "description": "already stored"}},
    dependencies=[Depends(require_writer)],
)
async def upload_graph(request: Request, eng: Eng, config: Config) -> Any:
    """Upload a StepGraph once; its id (content hash) is what /predict and /samples take.
    The encoder output is cached by id."""
    body = await request.body()

    def work() -> tuple[Any, bool]:
        raw = decode_body(
            body, request.headers.get("content-encoding"), max_bytes=config.max_decompressed_bytes
        )
        graph = build_graph(parse_json(raw), max_nodes=config.max_nodes)
        return eng.register(graph, body)

    entry, stored = await run_in_threadpool(work)
    out = {
        "graph_id": entry.graph_id,
        "stored": stored,
        "nodes": entry.n_nodes,
        "paths": len(entry.graph.paths),
        "symbols": entry.graph.symbols,
        "unknown_ops": entry.unknown_ops,
        "has_unknown_ops": bool(entry.unknown_ops),
    }
    return JSONResponse(out, 201 if stored else 200)
