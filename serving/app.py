"""The HTTP API: `create_app(ServeConfig)` -> FastAPI (OpenAPI at /docs).

The routes live in `serving.routes` (one router per resource), their dependencies in
`serving.deps`, error answers in `serving.errors`; the work is in `serving.engine`,
`serving.predicting` and `serving.planning`, which raise `UserError`s (`RequestError`
carries a status and the field at fault) and never HTTPException.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.concurrency import run_in_threadpool
from fastapi_offline import FastAPIOffline
from memgnn.predictor.memory.base import MemoryModel
from memgnn.serving.config import ServeConfig
from memgnn.serving.engine import Engine
from memgnn.serving.errors import install_error_handlers
from memgnn.serving.metrics import Metrics
from memgnn.serving.middleware import LimitsAndMetrics
from memgnn.serving.models import load_model
from memgnn.serving.ratelimit import RateLimiter
from memgnn.serving.routes import (
    admin,
    explain,
    graphs,
    health,
    plan,
    predict,
    samples,
    snapshots,
)
from memgnn.serving.routing import ReplayWarmup
from memgnn.serving.store import Store
from threadpoolctl import threadpool_limits

log = logging.getLogger(__name__)

# one router per resource; a new resource adds its router here
ROUTERS = [
    graphs.router,
    predict.router,
    plan.router,
    explain.router,
    samples.router,
    snapshots.router,
    admin.router,
    health.router,
]


def _lifespan(config: ServeConfig, load: Callable[[], MemoryModel]) -> Callable:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        blas = threadpool_limits(limits=config.blas_threads, user_api="blas")
        if config.warm_replay:  # compiles in the background; requests are served meanwhile
            app.state.replay.start()
        store = await run_in_threadpool(
            lambda: Store(
                config.db_url,
                window=config.correction_window,
                prior=config.correction_prior,
                max_scale=config.correction_max_scale,
                writer_max_scale=config.correction_writer_max_scale,
            )
        )
        try:
            loaded = await run_in_threadpool(load)
            app.state.engine = Engine(config, store, loaded, app.state.metrics)
            log.info("serving model %s, database %s", loaded.version, store.engine.url)
            yield
        finally:
            if app.state.engine is not None:
                app.state.engine.close()
            app.state.engine = None
            store.close()
            blas.restore_original_limits()

    return lifespan


def create_app(
    config: ServeConfig, *, model: MemoryModel | None = None, replay: ReplayWarmup | None = None
) -> FastAPI:
    """The service. `model`: serve this object instead of loading `config.model` (an
    in-process model, e.g. in a notebook or a test); reloads then keep it. `replay`: the
    replay JIT's warm-up (default: `serving.routing.warm_replay` in a background thread,
    started with the app when `config.warm_replay`)."""

    def load() -> MemoryModel:
        return model if model is not None else load_model(config.model)

    # /docs and /redoc with their JavaScript and CSS served from the package, so they
    # render on a machine without internet access
    app = FastAPIOffline(
        title="memgnn",
        version="1",
        lifespan=_lifespan(config, load),
        summary="Peak-memory predictions for PyTorch training steps (all sizes in bytes)",
    )
    app.state.config, app.state.engine, app.state.load_model = config, None, load
    app.state.metrics = Metrics()
    app.state.replay = replay or ReplayWarmup()
    app.state.snapshot_limiter = RateLimiter(config.snapshot_limit)
    app.add_middleware(
        LimitsAndMetrics, max_bytes=config.max_request_bytes, metrics=app.state.metrics
    )
    install_error_handlers(app)
    for router in ROUTERS:
        app.include_router(router)
    return app


def app_from_env() -> FastAPI:
    """uvicorn factory for worker processes (`memgnn.serving.app:app_from_env`, factory=True)."""
    return create_app(ServeConfig.from_env())


__all__ = ["ROUTERS", "app_from_env", "create_app"]
