"""Real multi-process gloo runs for the sharding checks: spawn the ranks, read their answers.

Each check's rank function runs as `target(rank, port, out, *args)` in a fresh spawned
process (MASTER_PORT = `port`) and writes its answer as JSON to `out/rank{rank}.json`.
"""

from __future__ import annotations

import json
import multiprocessing as mp
from collections.abc import Callable
from pathlib import Path
from typing import Any

from memgnn.serving.client import free_port

__all__ = ["spawn_ranks"]


def spawn_ranks(
    target: Callable[..., None], tmp: Path, *args: Any, world: int = 2, timeout: int = 600
) -> list[Any]:
    """Run `target` on `world` spawned ranks; each rank's JSON answer, by rank."""
    ctx = mp.get_context("spawn")
    port = free_port()
    procs = [ctx.Process(target=target, args=(r, port, str(tmp), *args)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout)
    for r, p in enumerate(procs):
        if p.is_alive():
            p.kill()
        assert p.exitcode == 0, f"rank {r} exited with {p.exitcode} (timeout {timeout} s)"
    return [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(world)]
