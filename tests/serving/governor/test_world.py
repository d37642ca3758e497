"""The governor across ranks: per-rank budgets and one decision, over a real 2-process gloo
group on CPU. The stub says a step at micro-batch B, length S = 10 needs 10,000 + 100 x B x
S bytes; at threshold 0.5 a rank with 100,000 bytes fits B = 40, one with 60,000 B = 20."""

from __future__ import annotations

import multiprocessing as mp

import pytest
import torch.distributed as dist
from memgnn.serving.client import free_port
from memgnn.serving.governor.policy import Policy, PolicyConfig
from memgnn.serving.governor.world import World, WorldChoice, agree, resolve_world

from tests.serving.governor.stub_policy import stub_policy

S = 10


def make_policy(capacity: int, world: World | None = None, **cfg) -> Policy:
    config = PolicyConfig(threshold=0.5, checkpointing=["none"], mode="binsearch",
                          power_of_two=False, **cfg)  # fmt: skip
    return stub_policy(capacity, config, world=world)


def _rank(rank: int, port: int, capacities: list[int], n: int | None, out) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=len(capacities))  # fmt: skip
    try:
        pol = make_policy(capacities[rank])  # the world comes from torch.distributed
        decisions = [pol.decide(S, n, step) for step in range(3)]
        out.put((rank, pol.world.size, pol.world.active, pol.world.agreements,
                 [(d.micro, d.grad_accum, d.fits, d.bound_bytes) for d in decisions]))  # fmt: skip
    finally:
        dist.destroy_process_group()


def _run_ranks(capacities: list[int], n: int | None = None) -> dict[int, tuple]:
    port = free_port()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, port, capacities, n, out))
             for r in range(len(capacities))]  # fmt: skip
    for p in procs:
        p.start()
    got = {}
    for _ in procs:
        rank, *rest = out.get(timeout=120)
        got[rank] = rest
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    return got


def test_alone_each_rank_would_choose_its_own_batch():
    assert make_policy(100_000).decide(S, None, 0).micro == 40
    assert make_policy(60_000).decide(S, None, 0).micro == 20


def test_two_gloo_ranks_take_the_smaller_rank_s_batch_together():
    got = _run_ranks([100_000, 60_000])
    for rank in (0, 1):
        size, active, agreements, decisions = got[rank]
        assert size == 2 and active and agreements == 3  # one agreement per step
        assert [d[0] for d in decisions] == [20, 20, 20]  # B = 20 on both, every step
        assert all(d[2] for d in decisions)  # fits on both
    assert got[0][3][0][3] == got[1][3][0][3] == 10_000 + 100 * 20 * S  # each rank's bound


def test_a_rank_where_nothing_fits_makes_every_rank_say_so():
    # rank 1: limit 10,000 is below B = 1's 11,000; rank 0 fits B = 1 on its own
    got = _run_ranks([100_000, 20_000], n=8)
    for rank in (0, 1):
        decisions = got[rank][3]
        assert [(d[0], d[1], d[2]) for d in decisions] == [(1, 8, False)] * 3


def test_agree_takes_the_smallest_batch_then_the_most_saving_config():
    def c(rank, micro, ckpt="none", prec="fp32"):
        return WorldChoice(rank=rank, micro=micro, checkpointing=ckpt, precision=prec,
                           bound_bytes=1, limit_bytes=2, fits=True)  # fmt: skip

    order, precs = ["none", "blocks:2", "full"], ["fp32", "amp-bf16"]
    assert agree([c(0, 8), c(1, 4), c(2, 6)], order, precs).rank == 1
    assert agree([c(0, 4, "none"), c(1, 4, "full")], order, precs).checkpointing == "full"
    assert agree([c(0, 4, prec="fp32"), c(1, 4, prec="amp-bf16")], order, precs).rank == 1


def test_world_size_from_the_config_or_the_train_spec_without_a_group():
    assert not dist.is_initialized()
    assert resolve_world(None, 1).size == 1
    world = resolve_world(4, 1)
    assert world.size == 4 and not world.active  # nothing to reduce over
    assert resolve_world(None, 8).size == 8
    with pytest.raises(ValueError, match="world_size must be an integer >= 1"):
        PolicyConfig(world_size=0)
    with pytest.raises(ValueError, match="rank 2"):
        World(2, 2)
