"""Errors as HTTP answers. A caller's mistake is a `UserError` (`RequestError` adds the
status and the field at fault) or a pydantic validation error: 4xx naming the field.
Anything else escaping a route is the server's fault: 500, with the traceback logged.
A bare `ValueError` from numpy or json inside a request is therefore a 500, not 422.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from memgnn.predictor.errors import LimitExceeded, UserError
from memgnn.serving.graphs import RequestError

log = logging.getLogger(__name__)

_KINDS = {404: "not_found", 403: "forbidden", 413: "too_large", 503: "unavailable"}


def error_response(status: int, loc: tuple, msg: str, kind: str = "value_error") -> JSONResponse:
    """The body FastAPI uses for validation errors: {"detail": [{loc, msg, type}]}."""
    return JSONResponse({"detail": [{"loc": list(loc), "msg": msg, "type": kind}]}, status)


async def _request_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestError)
    log.info("%s %s: %d: %s", request.method, request.url.path, exc.status, exc)
    return error_response(exc.status, exc.loc, str(exc), _KINDS.get(exc.status, "value_error"))


async def _user_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, UserError)
    status, kind = (413, "too_large") if isinstance(exc, LimitExceeded) else (422, "value_error")
    log.info("%s %s: %d: %s", request.method, request.url.path, status, exc)
    return error_response(status, ("body", *exc.loc), str(exc), kind)


def _finite(value: Any) -> Any:
    """`value` with every NaN or infinity spelled as JSON cannot: "NaN", "Infinity"..."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value).replace("nan", "NaN").replace("inf", "Infinity")
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    """FastAPI's 422 body, encodable whatever the input held: a request body may carry
    `NaN` or `Infinity` (Python's json parser reads them), and the error echoes the input;
    each such number is named as a non-finite value of its field."""
    assert isinstance(exc, RequestValidationError)
    detail = []
    for err in _finite(jsonable_encoder(exc.errors())):
        if isinstance(err.get("input"), str) and err["input"] in _NON_FINITE:
            err["msg"] = f"{err['input']} is not a finite number; {err.get('msg', '')}".strip()
        detail.append(err)
    log.info("%s %s: 422: %d validation errors", request.method, request.url.path, len(detail))
    return JSONResponse({"detail": detail}, 422)


_NON_FINITE = {"NaN", "Infinity", "-Infinity"}


async def _internal_error(request: Request, exc: Exception) -> JSONResponse:
    log.error("%s %s: internal error", request.method, request.url.path, exc_info=exc)
    return JSONResponse(
        {"detail": f"internal error ({type(exc).__name__}); the server log has the traceback"},
        500,
    )


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(RequestError, _request_error)
    app.add_exception_handler(UserError, _user_error)
    app.add_exception_handler(Exception, _internal_error)


__all__ = ["error_response", "install_error_handlers"]
