"""Data/model parallel options: TrainSpec validation, CLI flags, HTTP schema fields."""

from __future__ import annotations

import argparse
import functools
import math
from typing import Any

import pytest
import torch
import torch.distributed as dist
from memgnn.predictor.capture.capture import CaptureConfig, capture
from memgnn.predictor.capture.step import TrainingStep
from memgnn.predictor.emulate.parallel import fake_world
from memgnn.predictor.ir.vocab import CATEGORIES, SHARDINGS
from memgnn.predictor.memory.analytic import AnalyticModel, live_curve
from memgnn.predictor.memory.base import Query
from memgnn.predictor.spec.train import TrainSpec

from memgnn.cli.options import add_train_args, train_spec


def test_defaults_are_one_unsharded_gpu():
    t = TrainSpec()
    assert (t.parallel.gpus, t.parallel.sharding, t.parallel.reshard_after_forward) == (
        1,
        "none",
        True,
    )
    assert t.parallel.shard_group_size == 1
    assert SHARDINGS == ("none", "ddp", "fsdp", "hsdp", "zero1", "zero2", "zero3", "fsdp1")


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"gpus": 0}, "--gpus must be an integer >= 1"),
        ({"gpus": 1, "sharding": "zero3"}, "--sharding zero3 needs --gpus >= 2"),
        ({"gpus": 1, "sharding": "ddp"}, "--sharding ddp needs --gpus >= 2"),
        ({"gpus": 4}, "--gpus 4 needs --sharding"),
        ({"gpus": 2, "sharding": "tp"}, "unknown --sharding 'tp'"),
        ({"gpus": 4, "sharding": "hsdp"}, None),
        ({"gpus": 2, "sharding": "hsdp"}, "needs --gpus split into >= 2 shard groups"),
        ({"gpus": 6, "sharding": "hsdp", "hsdp_shard_size": 4}, "--hsdp-shard-size dividing"),
        ({"gpus": 4, "sharding": "fsdp", "hsdp_shard_size": 2}, "--hsdp-shard-size applies"),
        (
            {"gpus": 2, "sharding": "zero3", "fsdp_reshard_after_forward": False},
            "--fsdp-reshard-after-forward false applies to --sharding fsdp or hsdp",
        ),
        ({"gpus": 2, "sharding": "fsdp", "fsdp_reshard_after_forward": False}, None),
        ({"grad_sync": "last"}, "--grad-sync last applies to several GPUs"),
        ({"gpus": 2, "sharding": "ddp", "grad_sync": "some"}, "unknown --grad-sync"),
        ({"gpus": 2, "sharding": "fsdp", "grad_sync": "last"}, None),
        (
            {"gpus": 2, "sharding": "fsdp1", "fsdp_reshard_after_forward": False},
            "fsdp1: --fsdp1-sharding-strategy SHARD_GRAD_OP",
        ),
        (
            {"gpus": 2, "sharding": "ddp", "fsdp_param_dtype": "bf16"},
            "--fsdp-param-dtype applies to --sharding fsdp1",
        ),
        ({"gpus": 4, "sharding": "fsdp1", "hsdp_shard_size": 2}, "--hsdp-shard-size applies"),
        (
            {
                "gpus": 4,
                "sharding": "fsdp1",
                "hsdp_shard_size": 2,
                "fsdp1_sharding_strategy": "HYBRID_SHARD_ZERO2",
            },
            None,
        ),
    ],
)
def test_bad_combinations_name_the_option(kwargs, needle):
    if needle is None:
        TrainSpec.of(**kwargs)
        return
    with pytest.raises(ValueError, match=needle.replace("(", r"\(")):
        TrainSpec.of(**kwargs)


def test_shard_group_sizes():
    assert TrainSpec.of(gpus=8, sharding="fsdp").parallel.shard_group_size == 8
    assert TrainSpec.of(gpus=8, sharding="ddp").parallel.shard_group_size == 1
    assert TrainSpec.of(gpus=4, sharding="hsdp").parallel.shard_group_size == 2
    assert TrainSpec.of(gpus=16, sharding="hsdp").parallel.shard_group_size == 8
    assert TrainSpec.of(gpus=32, sharding="hsdp", hsdp_shard_size=4).parallel.shard_group_size == 4


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_train_args(p)
    return p.parse_args(argv)


def test_cli_flags_reach_the_spec():
    args = _parse(["--gpus", "8", "--sharding", "fsdp", "--fsdp-reshard-after-forward", "false"])
    t = train_spec(args)
    assert (t.parallel.gpus, t.parallel.sharding, t.parallel.reshard_after_forward) == (
        8,
        "fsdp",
        False,
    )
    assert train_spec(_parse([])) == TrainSpec()
    t = train_spec(_parse(["--gpus", "2", "--sharding", "ddp", "--grad-sync", "last"]))
    assert t.parallel.grad_sync == "last"
    with pytest.raises(SystemExit):
        _parse(["--fsdp-reshard-after-forward", "maybe"])


def test_http_schema_fields():
    from memgnn.serving.schemas import PlanRequest, PredictRequest, TrainIn
    from pydantic import ValidationError

    t = TrainIn(gpus=4, sharding="zero2", grad_sync="last").to_spec()
    assert (t.parallel.gpus, t.parallel.sharding, t.parallel.grad_sync) == (4, "zero2", "last")
    with pytest.raises(ValidationError, match="--grad-sync last applies"):
        TrainIn(grad_sync="last")
    with pytest.raises(ValidationError, match="--sharding zero3 needs --gpus >= 2"):
        TrainIn(sharding="zero3")
    req = PredictRequest.model_validate(
        {"model": {"spec": "mlp", "train": {"gpus": 2, "sharding": "ddp"}}, "configs": [{}]}
    )
    assert req.model.train.to_spec().parallel.sharding == "ddp"
    plan = PlanRequest.model_validate(
        {
            "model": {"spec": "mlp", "train": {"gpus": 2, "sharding": "fsdp",
                                               "fsdp_reshard_after_forward": False}},
            "budget_bytes": 1 << 30,
        }
    )  # fmt: skip
    assert plan.model.train.to_spec().parallel.reshard_after_forward is False


# ---- the sharded step, captured over a fake process group ---------------------------------

SIZES = {"B": 3, "S": 40}  # not the trace sizes (B=4, S=64): the symbolic graph answers


@functools.cache
def _llama():
    from memgnn.predictor.zoo.resolve import resolve

    return resolve("llama")


@functools.cache
def _captured(**kwargs) -> Any:
    return capture(_llama(), TrainSpec.of(**kwargs), CaptureConfig(target="cpu"))


def _predict(graph, sizes=SIZES):
    return AnalyticModel().predict(graph, [Query(sizes=sizes, device="cpu")])[0]


def _tracker_peak(train: TrainSpec, sizes) -> int:
    """PyTorch's FSDPMemTracker over the same step (fake tensors, fake process group)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

    with fake_world(train) as world, FakeTensorMode(allow_non_fake_inputs=True):
        step = TrainingStep(
            _llama(), train, device=torch.device("cpu"), target="cpu", fake=True, world=world
        )
        tracker = FSDPMemTracker(step.model, step.optimizer)
        with tracker:
            step.run(sizes, steps=(0,))
            tracker.reset_mod_stats()  # the tracker takes one iteration at a time
            step.run(sizes, steps=(1,))
        peak = tracker.get_tracker_snapshot("peak")
    return max(dev["Total"] for dev in peak.values())


def _fake_pg_peak(graph, sizes) -> int:
    """The schedule's peak without gloo's staging copies inside collectives (the fake
    process group stages nothing): what FSDPMemTracker sees on the fake run."""
    resolved = graph.resolve_sizes(sizes)
    ops = graph.paths[0].nodes["op"]
    scratch = graph.scratch_bytes(0, resolved).copy()
    scratch[[k for k, op in enumerate(ops) if op.startswith("c10d.")]] = 0
    initial, live = live_curve(graph, 0, graph.storage_bytes(0, resolved), scratch)
    return max(initial, int(live.max()))


@pytest.mark.parametrize("gpus", [2, 8])
def test_fsdp_peak_matches_pytorchs_fsdp2_mem_tracker(gpus):
    graph = _captured(gpus=gpus, sharding="fsdp")
    theirs = _tracker_peak(TrainSpec.of(gpus=gpus, sharding="fsdp"), SIZES)
    ours = _fake_pg_peak(graph, SIZES)
    assert abs(ours - theirs) <= 0.01 * theirs
    answer = _predict(graph)  # a CPU (gloo) run: + gloo's staging inside one collective
    assert theirs <= answer.predicted_peak_bytes <= theirs + answer.breakdown["categories"]["comm"]
    assert answer.breakdown["categories"]["comm"] > 0  # all-gather buffers at the peak
    assert answer.breakdown["parallel"] == {
        "per_rank": True, "rank": 0, "world_size": gpus, "sharding": "fsdp",
        "shard_group_size": gpus, "fsdp_reshard_after_forward": True,
        "fsdp_param_dtype": "none", "fsdp_reduce_dtype": "none",
    }  # fmt: skip
    assert not dist.is_initialized()  # the fake process group is gone


def _initial_bytes(graph, category: str) -> int:
    """Bytes of `category` alive before the measured step (registered state)."""
    p = graph.paths[0]
    nbytes = graph.storage_bytes(0, graph.resolve_sizes(graph.symbols))
    code = CATEGORIES.index(category)
    return sum(
        int(nbytes[u])
        for u in range(p.num_storages)
        if p.storages["category"][u] == code and p.storages["alloc"][u] == -1
    )


def _param_shapes() -> list[tuple[int, ...]]:
    return [tuple(p.shape) for p in _llama().build().parameters()]


def test_fsdp_parameter_shards_are_ceil_p_over_n():
    gpus = 8
    graph = _captured(gpus=gpus, sharding="fsdp")
    buffers = sum(b.numel() * b.element_size() for b in _llama().build().buffers())
    # fully_shard pads dim 0 to a multiple of N; rank 0 holds ceil(dim0 / N) rows
    shards = sum(-(-s[0] // gpus) * math.prod(s[1:]) * 4 for s in _param_shapes())
    assert _initial_bytes(graph, "parameter") == shards + buffers
    whole = sum(math.prod(s) * 4 for s in _param_shapes())
    assert shards < whole / gpus + 4 * 4096  # close to P / N


def test_ddp_and_zero1_buckets_and_optimizer_partition():
    whole = sum(math.prod(s) * 4 for s in _param_shapes())
    single = _predict(_captured())
    ddp = _predict(_captured(gpus=2, sharding="ddp"))
    assert ddp.breakdown["categories"]["comm"] == whole  # every gradient has a bucket slot
    assert (
        ddp.breakdown["categories"]["optimizer_state"]
        == (single.breakdown["categories"]["optimizer_state"])
    )
    zero1 = _predict(_captured(gpus=2, sharding="zero1"))
    opt1 = zero1.breakdown["categories"]["optimizer_state"]
    assert opt1 < 0.6 * single.breakdown["categories"]["optimizer_state"]  # rank 0's part
    assert zero1.breakdown["categories"]["parameter"] == ddp.breakdown["categories"]["parameter"]


def test_zero2_keeps_parameters_whole_and_gradients_sharded():
    whole = sum(math.prod(s) * 4 for s in _param_shapes())
    zero2 = _captured(gpus=2, sharding="zero2")
    zero3 = _captured(gpus=2, sharding="zero3")
    cats2 = _predict(zero2).breakdown["categories"]
    cats3 = _predict(zero3).breakdown["categories"]
    assert cats2["parameter"] >= whole  # whole parameters + shard
    assert cats3["parameter"] < cats2["parameter"]
    assert cats2["optimizer_state"] == cats3["optimizer_state"]  # both sharded


def _tracker_accum_peak(train: TrainSpec, sizes) -> int:
    """FSDPMemTracker over both steps, its module stats reset before each micro-step (it
    takes one forward per module at a time; its peak survives the reset)."""
    from memgnn.predictor.capture.step import NullObserver
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

    class Reset(NullObserver):
        def on_phase(self, phase: str, step: int, micro: int) -> None:
            if phase == "input":
                tracker.reset_mod_stats()

    with fake_world(train) as world, FakeTensorMode(allow_non_fake_inputs=True):
        step = TrainingStep(
            _llama(), train, device=torch.device("cpu"), target="cpu", fake=True, world=world
        )
        tracker = FSDPMemTracker(step.model, step.optimizer)
        with tracker:
            step.run(sizes, Reset())
        peak = tracker.get_tracker_snapshot("peak")
    return max(dev["Total"] for dev in peak.values())


def test_fsdp_accumulation_without_sync_keeps_unsharded_gradients():
    """--grad-sync last (FSDP2 set_requires_gradient_sync(False) before the last micro-step,
    FSDP1's no_sync): every rank holds the whole model's gradients, unsharded, through the
    accumulation; syncing every micro-step holds the shard. By hand, 2 ranks, fp32: the
    difference is the whole gradient less its shard, P x 4 / 2 bytes; and the fake run's
    peak is PyTorch's FSDPMemTracker's on the same steady step."""
    whole = sum(math.prod(s) * 4 for s in _param_shapes())
    every = _predict(_captured(gpus=2, sharding="fsdp", grad_accum=2))
    last_graph = _captured(gpus=2, sharding="fsdp", grad_accum=2, grad_sync="last")
    last = _predict(last_graph)
    assert last.breakdown["categories"]["gradient"] == whole
    assert every.breakdown["categories"]["gradient"] == whole // 2
    assert last.predicted_peak_bytes - every.predicted_peak_bytes == whole // 2
    ops = list(last_graph.paths[0].nodes["op"])
    every_ops = list(_captured(gpus=2, sharding="fsdp", grad_accum=2).paths[0].nodes["op"])
    reduce = lambda o: sum("reduce_scatter" in op for op in o)  # noqa: E731
    assert reduce(ops) * 2 == reduce(every_ops)  # one reduce-scatter per group per step
    train = TrainSpec.of(gpus=2, sharding="fsdp", grad_accum=2, grad_sync="last")
    theirs = _tracker_accum_peak(train, SIZES)
    ours = _fake_pg_peak(last_graph, SIZES)
    assert abs(ours - theirs) <= 0.01 * theirs


def test_ddp_accumulation_without_sync_skips_the_all_reduce():
    """DDP no_sync(): no all-reduce on the unsynced micro-step; gradients accumulate in
    .grad as they do synced (DDP's buckets exist either way): the same bytes."""
    every = _captured(gpus=2, sharding="ddp", grad_accum=2)
    last = _captured(gpus=2, sharding="ddp", grad_accum=2, grad_sync="last")
    count = lambda g: sum("allreduce" in op for op in g.paths[0].nodes["op"])  # noqa: E731
    assert count(last) * 2 == count(every) > 0
    assert _predict(last).predicted_peak_bytes == _predict(every).predicted_peak_bytes


def test_fake_process_group_is_isolated():
    t = TrainSpec.of(gpus=2, sharding="fsdp")
    for _ in range(2):  # repeatable in one process
        with fake_world(t) as world:
            assert dist.get_world_size() == 2 and world.rank == 0
        assert not dist.is_initialized()
    with fake_world(t), pytest.raises(RuntimeError, match="already initialised"):
        with fake_world(t):
            pass
    assert not dist.is_initialized()
    with pytest.raises(ValueError, match="inside predictor.emulate.parallel.fake_world"):
        TrainingStep(_llama(), t, device=torch.device("cpu"), target="cpu")


def test_single_gpu_answers_are_unchanged():
    """gpus=1, sharding=none: the answers main gave before sharding existed (recorded with
    the same code on the main branch: AnalyticModel and the allocator simulation), moved
    once since by CAPTURE_VERSION 10 (predictor.emulate.cuda_kernels): the zoo llama's fp32
    grouped-query attention runs CUDA's math kernel, not the CPU's flash kernel. Live at
    the peak, 2 layers: + fp32 softmax 2 x 3*4*40*40*4 = 153,600, + q * sqrt(scale)
    2 x 30,720, + k, v repeated to 4 heads and the output's contiguous copy 6 x 30,720,
    - the CPU kernel's output + logsumexp 2 x 32,768 (512-rounded), - rotary outputs it
    kept (add/cat, 184,320 + 62,464 - 122,880 - 1,024): +210,944 activation bytes."""
    from memgnn.predictor.sim.simulate import simulate
    from memgnn.predictor.spec.devices import get_profile

    graph = capture(_llama(), TrainSpec(), CaptureConfig(target="cuda"))
    p = AnalyticModel().predict(graph, [Query(sizes=SIZES, device="a100-80gb")])[0]
    assert p.predicted_peak_bytes == 21194240  # 20983296 before CAPTURE_VERSION 10
    assert p.breakdown["categories"] == {
        "parameter": 628224, "gradient": 0, "optimizer_state": 1254400, "input": 2048,
        "activation": 1777664, "temporary": 492544,
    }  # fmt: skip
    assert list(p.breakdown["categories"]) == list(CATEGORIES[:6])  # no "comm" key
    r = simulate(graph, SIZES, get_profile("a100-80gb"))
    assert (r.peak_allocated_bytes, r.peak_reserved_bytes) == (21194240, 27262976)
    assert r.breakdown["categories"] == {
        "parameter": 625984, "gradient": 0, "optimizer_state": 1251840, "input": 1920,
        "activation": 1773924, "temporary": 491528,
    }  # fmt: skip


def test_hsdp_shards_within_groups_and_replicates_across():
    hsdp = _predict(_captured(gpus=4, sharding="hsdp")).breakdown  # 2 groups of 2 ranks
    fsdp2 = _predict(_captured(gpus=2, sharding="fsdp")).breakdown
    assert hsdp["parallel"]["shard_group_size"] == 2
    assert hsdp["categories"]["optimizer_state"] == fsdp2["categories"]["optimizer_state"]
    assert _initial_bytes(_captured(gpus=4, sharding="hsdp"), "parameter") == _initial_bytes(
        _captured(gpus=2, sharding="fsdp"), "parameter"
    )


def _optimizer_temporaries(graph, sizes, step: int) -> int:
    from memgnn.predictor.ir.graph import PHASES

    p = graph.paths[0]
    nbytes = graph.storage_bytes(0, graph.resolve_sizes(sizes))
    phase, steps = p.nodes["phase"], p.nodes["step"]
    temporary = CATEGORIES.index("temporary")
    return sum(
        int(nbytes[i])
        for i, (alloc, cat) in enumerate(zip(p.storages["alloc"], p.storages["category"]))
        if alloc >= 0 and cat == temporary
        and PHASES[phase[alloc]] == "optimizer" and steps[alloc] == step
    )  # fmt: skip


def test_dtensor_shape_propagation_allocates_nothing():
    # DTensor learns an op's output shape by running it on global-shape fake inputs, once
    # per op signature (the first step); a real job does that on its own fake tensors. On
    # a CUDA target (foreach AdamW) that once showed as 3 x the whole model's bytes of
    # optimizer temporaries in the first step, 13 x the rank's shard.
    graph = capture(_llama(), TrainSpec.of(gpus=4, sharding="fsdp"), CaptureConfig(target="cuda"))
    first, steady = (_optimizer_temporaries(graph, SIZES, s) for s in (0, 1))
    shard = _initial_bytes(graph, "parameter")
    assert first == steady  # the same foreach temporaries in both steps
    assert 0 < steady <= shard  # one parameter-shard-sized list (sqrt of exp_avg_sq)
