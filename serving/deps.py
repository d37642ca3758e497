"""FastAPI dependencies of the routes, in one place: the engine, the config, and the
write check every write endpoint declares.

Writes (uploads, samples, reloads) need the server's bearer token when it has one. A
server without a token refuses writes unless it was started with
`allow_anonymous_writes` (`--allow-anonymous-writes`): anyone who can reach a port must
not be able to poison the corrections every client gets.
"""

from __future__ import annotations

import secrets
from typing import Annotated

from fastapi import Depends, Request
from fastapi.exceptions import HTTPException
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from serving.config import ServeConfig
from serving.engine import Engine

_bearer = HTTPBearer(auto_error=False, description="the server's token (write endpoints)")
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


def get_config(request: Request) -> ServeConfig:
    return request.app.state.config


async def get_engine(request: Request) -> Engine:
    eng = request.app.state.engine
    if eng is None:
        raise HTTPException(503, "model not loaded")
    return eng


def _token_ok(config: ServeConfig, creds: HTTPAuthorizationCredentials | None) -> bool:
    return (
        config.token is not None
        and creds is not None
        and secrets.compare_digest(creds.credentials.encode(), config.token.encode())
    )


async def require_writer(request: Request, creds: Credentials) -> str:
    """The caller may write: the token matches, or the server takes anonymous writes.
    Returns who wrote ("token" or "anonymous"), which samples keep as provenance."""
    config = get_config(request)
    if config.token is None:
        if config.allow_anonymous_writes:
            return "anonymous"
        raise HTTPException(
            403,
            "this server accepts no writes: start it with --token T "
            "(or --allow-anonymous-writes on a trusted network)",
        )
    if creds is None:
        raise HTTPException(401, "bearer token required", {"WWW-Authenticate": "Bearer"})
    if not _token_ok(config, creds):
        raise HTTPException(403, "invalid token")
    return "token"


async def may_persist(request: Request, creds: Credentials) -> bool:
    """Read endpoints that capture or take inline graphs store them only for a caller
    who could have uploaded them (else they stay in this process's memory cache)."""
    config = get_config(request)
    if config.token is None:
        return config.allow_anonymous_writes
    return _token_ok(config, creds)


Config = Annotated[ServeConfig, Depends(get_config)]
Eng = Annotated[Engine, Depends(get_engine)]
Writer = Annotated[str, Depends(require_writer)]
Persist = Annotated[bool, Depends(may_persist)]

__all__ = ["Config", "Eng", "Persist", "Writer", "get_config", "get_engine", "require_writer"]
