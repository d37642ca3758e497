"""FastAPI dependencies of the routes, in one place: the engine, the config, and the
write check every write endpoint declares.

Writes (uploads, samples, reloads) need the server's bearer token when it has one. A
server without a token refuses writes unless it was started with
`allow_anonymous_writes` (`--allow-anonymous-writes`): anyone who can reach a port must
not be able to poison the corrections every client gets.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import HTTPException
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from memgnn.serving.captures import Work
from memgnn.serving.config import ServeConfig
from memgnn.serving.engine import Engine
from memgnn.serving.ratelimit import Limited

_bearer = HTTPBearer(auto_error=False, description="the server's token (write endpoints)")
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


def get_config(request: Request) -> ServeConfig:
    return request.app.state.config


async def get_engine(request: Request) -> Engine:
    eng = request.app.state.engine
    if eng is None:
        raise HTTPException(503, "model not loaded")
    return eng


def _writer(config: ServeConfig, creds: HTTPAuthorizationCredentials | None) -> str | None:
    """The writer whose credential the caller presented, else None."""
    if creds is None or not config.has_writers:
        return None
    return config.writer_of(creds.credentials)


async def require_writer(request: Request, creds: Credentials) -> str:
    """The caller may write: its token is one of the server's writers', or the server
    takes anonymous writes. Returns who wrote (the writer's name: "token" for `--token`,
    or "anonymous"), which samples keep as provenance (`principal`)."""
    config = get_config(request)
    if not config.has_writers:
        if config.allow_anonymous_writes:
            return "anonymous"
        raise HTTPException(
            403,
            "this server accepts no writes: start it with --token T or --writer NAME:TOKEN "
            "(or --allow-anonymous-writes on a trusted network)",
        )
    if creds is None:
        raise HTTPException(401, "bearer token required", {"WWW-Authenticate": "Bearer"})
    writer = _writer(config, creds)
    if writer is None:
        raise HTTPException(403, "invalid token")
    return writer


async def may_persist(request: Request, creds: Credentials) -> bool:
    """Read endpoints that capture or take inline graphs store them only for a caller
    who could have uploaded them (else they stay in this process's memory cache)."""
    config = get_config(request)
    if not config.has_writers:
        return config.allow_anonymous_writes
    return _writer(config, creds) is not None


async def snapshot_slot(request: Request, creds: Credentials) -> Any:
    """A slot for one snapshot replay (`serving.ratelimit`), held for the request: the
    client is its writer name with a valid token, else its address; 429 past the limit."""
    config = get_config(request)
    writer = _writer(config, creds)
    client = f"writer:{writer}" if writer else f"addr:{getattr(request.client, 'host', '?')}"
    limiter = request.app.state.snapshot_limiter
    try:
        limiter.acquire(client)
    except Limited as exc:
        retry = str(max(1, math.ceil(exc.retry_after_s)))
        raise HTTPException(429, f"snapshot replay: {exc.what}", {"Retry-After": retry}) from None
    try:
        yield
    finally:
        limiter.release()


def new_work(request: Request) -> Work:
    """The request's budget for captures (time, count); cancelled when it disconnects."""
    config = get_config(request)
    return Work(
        deadline=time.monotonic() + config.request_timeout_s,
        max_captures=config.max_captures_per_request,
    )


async def run_watched(
    request: Request, work: Work, fn: Callable[..., Any], *args: Any, **kw: Any
) -> Any:
    """`fn(*args, work=work, **kw)` in the thread pool; if the client goes away
    meanwhile, the work is cancelled (a capture in flight is killed) instead of running on
    for nobody."""
    task = asyncio.ensure_future(run_in_threadpool(fn, *args, work=work, **kw))
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=0.25)
            if done:
                return task.result()
            if await request.is_disconnected():
                work.cancelled.set()
    finally:
        if not task.done():  # this handler was cancelled (server stopping): stop the work
            work.cancelled.set()
            task.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved


Config = Annotated[ServeConfig, Depends(get_config)]
Eng = Annotated[Engine, Depends(get_engine)]
Writer = Annotated[str, Depends(require_writer)]
Persist = Annotated[bool, Depends(may_persist)]
NewWork = Annotated[Work, Depends(new_work)]

__all__ = [
    "Config",
    "Eng",
    "NewWork",
    "Persist",
    "Writer",
    "get_config",
    "get_engine",
    "require_writer",
    "snapshot_slot",
    "run_watched",
]
