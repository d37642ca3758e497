"""The uvicorn server memgnn runs: on SIGINT/SIGTERM it also stops the capture in flight.

`memgnn serve` (`memgnn.cli.serve`) and `serving.client.local_server` start it.
"""

from __future__ import annotations

import logging
from typing import Any

import uvicorn

log = logging.getLogger(__name__)

GRACEFUL_S = 10  # uvicorn cancels requests still running this long after a SIGTERM


class Server(uvicorn.Server):
    """uvicorn's server that, on SIGINT/SIGTERM, also stops the capture in flight at
    once: requests waiting on it answer 503 and shutdown does not wait for a capture."""

    def __init__(self, config: uvicorn.Config, app: Any):
        super().__init__(config)
        self.memgnn_app = app

    def handle_exit(self, sig: int, frame: Any) -> None:
        engine = getattr(self.memgnn_app.state, "engine", None)
        if engine is not None:
            engine.close()
        super().handle_exit(sig, frame)
