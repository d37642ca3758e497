"""The governor across ranks: per-rank budgets, one decision every rank takes together.

Data- and model-parallel training runs the same step on every rank: DDP's gradient
all-reduce and FSDP's all-gathers expect each rank to run as many micro-batches of the
same size, so a micro-batch chosen per rank would hang or desynchronise the collectives.
Each rank's governor judges its own device (its capacity, its live measurements, its
corrected predictions: a per-rank budget, threshold x that rank's memory; the graph is
one rank's step, see `predictor.emulate.parallel`), then the ranks agree:

- every rank's decision is gathered (`torch.distributed.all_gather_object`) and all take
  the most constrained one: the smallest micro-batch, ties to the most memory-saving
  (checkpointing, then precision, by the policy's order) - so the agreed choice fits on
  the rank with the least room, and so on every rank with more;
- each rank checks the agreed choice against its own limit and the ranks reduce "fits"
  with MIN (`all_reduce`): a choice that does not fit on one rank does not fit anywhere.

The world size is `torch.distributed.get_world_size()` when a process group is
initialised, else `PolicyConfig.world_size`, else the `TrainSpec`'s `gpus`. Without a
process group there is nothing to reduce over: ranks given the same inputs decide the
same, and the governor says so once in the log.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["World", "WorldChoice", "agree", "resolve_world"]

log = logging.getLogger(__name__)


@dataclass(kw_only=True, slots=True)
class WorldChoice:
    """One rank's view of its decision, as gathered from every rank."""

    rank: int
    micro: int
    checkpointing: str
    precision: str
    bound_bytes: int
    limit_bytes: int
    fits: bool


def agree(choices: list[WorldChoice], ckpt_order: list[str], prec_order: list[str]) -> WorldChoice:
    """The choice every rank takes: the smallest micro-batch; ties to more checkpointing
    (later in `ckpt_order`, "full" last), then to the later precision, then the rank
    nearest its limit. The same on every rank given the same list."""

    def key(c: WorldChoice) -> tuple:
        ck = ckpt_order.index(c.checkpointing) if c.checkpointing in ckpt_order else -1
        pr = prec_order.index(c.precision) if c.precision in prec_order else -1
        return (c.micro, -ck, -pr, -c.bound_bytes / max(c.limit_bytes, 1), c.rank)

    return min(choices, key=key)


class World:
    """The ranks a governor decides with (`size`, `rank`), and the collectives that make
    their decisions one; `active` only with an initialised process group of size > 1."""

    def __init__(self, size: int, rank: int = 0, group: Any = None):
        if size < 1 or not 0 <= rank < size:
            raise ValueError(f"world size {size} and rank {rank}: need 0 <= rank < size")
        self.size, self.rank, self.group = size, rank, group
        self.active = size > 1 and dist.is_available() and dist.is_initialized()
        self.agreements = 0  # decisions reduced across ranks

    def gather(self, choice: WorldChoice) -> list[WorldChoice]:
        if not self.active:
            return [choice]
        out: list[Any] = [None] * self.size
        dist.all_gather_object(out, choice, group=self.group)
        self.agreements += 1
        return out

    def all_fit(self, fits: bool) -> bool:
        if not self.active:
            return fits
        device = "cuda" if dist.get_backend(self.group) == "nccl" else "cpu"
        flag = torch.tensor([int(fits)], dtype=torch.int32, device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self.group)
        return bool(flag.item())


def resolve_world(configured: int | None, train_gpus: int = 1, group: Any = None) -> World:
    """The world of this process: torch.distributed's when initialised (a configured size
    that differs is an error naming both), else the configured size, else `train_gpus`."""
    if dist.is_available() and dist.is_initialized():
        size, rank = dist.get_world_size(group), dist.get_rank(group)
        if configured is not None and configured != size:
            raise ValueError(
                f"PolicyConfig.world_size={configured} but torch.distributed's world size is {size}"
            )
        if train_gpus not in (1, size):
            raise ValueError(f"TrainSpec gpus={train_gpus} but torch.distributed runs {size}")
        return World(size, rank, group)
    size = configured or train_gpus
    if size > 1:
        log.info(
            "world size %d without a process group: no decision is reduced across ranks "
            "(ranks given the same inputs decide the same)",
            size,
        )
    return World(size, 0, group)
