"""Pure ASGI middleware: request-body limits and per-route request metrics."""

from __future__ import annotations

import time

from fastapi.exceptions import HTTPException
from memgnn.serving.metrics import Metrics
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class LimitsAndMetrics:
    """Pure ASGI middleware: 413 for bodies over the limit (by Content-Length, or while
    reading a chunked body), and request counts / latencies per route template."""

    def __init__(self, app: ASGIApp, *, max_bytes: int, metrics: Metrics):
        self.app, self.max_bytes, self.metrics = app, max_bytes, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500
        for name, value in scope["headers"]:
            if name == b"content-length":
                if not value.isdigit() or int(value) > self.max_bytes:
                    status = 413 if value.isdigit() else 400
                    await self._reject(send, status)
                    self._observe(scope, status, start)
                    return
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:
                raise HTTPException(413, f"request body exceeds {self.max_bytes} bytes")
            return message

        async def watch(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, limited, watch)
        finally:
            self._observe(scope, status, start)

    async def _reject(self, send: Send, status: int) -> None:
        msg = (
            f"request body exceeds {self.max_bytes} bytes"
            if status == 413
            else "bad Content-Length"
        ).encode()
        body = b'{"detail":"' + msg + b'"}'
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    def _observe(self, scope: Scope, status: int, start: float) -> None:
        route = scope.get("route")
        endpoint = getattr(route, "path", None) or "unmatched"
        self.metrics.observe(endpoint, scope["method"], status, time.perf_counter() - start)


__all__ = ["LimitsAndMetrics"]
