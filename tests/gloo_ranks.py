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

__all__ = ["recorded_graph", "set_aside_staged", "spawn_ranks"]


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


def set_aside_staged(rec: Any, registered: int) -> list[int]:
    """gloo's reduce-scatter stages a clone of its input on gloo's worker thread, which no
    dispatch mode there sees (capture counts it as the collective's scratch, `comm_hooks`):
    the recorder meets it first when the main thread splits it into the shards it copies
    back, as if alive from the start. The worker thread may free it after the main thread
    has moved on (a loaded CI run: the free landed on a later node than the copy), so a
    clone is known by being met first as an input, not by the node that freed it. Those
    storages of `rec` (a StepRecorder; past the `registered` state) are zeroed here and
    their bytes returned. (AdamW's step counters, `torch.tensor(0.0)`, are met first too,
    as lifted constants: real, kept.)"""
    first_use: dict[int, str] = {}
    for node in rec.nodes:
        for uid in node.inputs:
            first_use.setdefault(uid, node.op)
    staged = []
    for s in rec.storages[registered:]:
        if s.alloc_node == -1 and first_use.get(s.uid) not in (None, "lift_fresh.default"):
            staged.append(s.nbytes)
            s.nbytes = 0
    return staged


def recorded_graph(rec: Any, bundle: Any, train: Any, sizes: dict[str, int]) -> Any:
    """The StepGraph of what a real rank's StepRecorder `rec` recorded of `bundle`'s step
    under `train` at `sizes` (one path, sizes as its symbols), for the analytic sweep."""
    from memgnn.predictor.ir.graph import StepGraph
    from memgnn.predictor.ir.pathgraph import ExprInterner, path_from_recorder

    interner = ExprInterner()
    path = path_from_recorder(rec, [], interner, {}, None)
    return StepGraph(
        model={"name": bundle.name, "family": bundle.family, "hparams": bundle.hparams},
        train=train.flat(), symbols=dict(sizes), data_symbols={}, guards=[],
        exprs=interner.sources, paths=[path],
    )  # fmt: skip
