"""FSDP2's MixedPrecisionPolicy (`--sharding fsdp|hsdp --fsdp-param-dtype bf16
--fsdp-reduce-dtype fp32`, torchtitan's default): rank 0's state by hand, the gathered
parameters in bf16, and a real 2-rank gloo run recorded by memgnn's own recorder against the
prediction."""

from __future__ import annotations

import functools
import json
import math
import os
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from gloo_ranks import recorded_graph, set_aside_staged, spawn_ranks
from memgnn.dataset.cpu_backend import profiler_peak
from memgnn.predictor.capture.capture import CaptureConfig, capture
from memgnn.predictor.ir.vocab import CATEGORIES
from memgnn.predictor.memory.analytic import AnalyticModel
from memgnn.predictor.memory.base import Query
from memgnn.predictor.spec.train import TrainSpec

SIZES = {"B": 3, "S": 40}  # an odd batch, not the trace sizes
MP = {"fsdp_param_dtype": "bf16", "fsdp_reduce_dtype": "fp32"}


@functools.cache
def _llama():
    from memgnn.predictor.zoo.resolve import resolve

    return resolve("llama")


@functools.cache
def _captured(**kwargs: Any) -> Any:
    return capture(_llama(), TrainSpec.of(**kwargs), CaptureConfig(target="cpu"))


def _predict(graph, sizes=SIZES):
    return AnalyticModel().predict(graph, [Query(sizes=sizes, device="cpu")])[0]


def _storages(graph, category: str, initial: bool) -> list[int]:
    """Bytes of the storages of `category` alive before the steps (`initial`) or made in them."""
    p = graph.paths[0]
    nbytes = graph.storage_bytes(0, graph.resolve_sizes(graph.symbols))
    code = CATEGORIES.index(category)
    return [
        int(nbytes[u])
        for u in range(p.num_storages)
        if p.storages["category"][u] == code and (p.storages["alloc"][u] == -1) == initial
    ]


def _shapes() -> list[tuple[int, ...]]:
    return [tuple(p.shape) for p in _llama().build().parameters()]


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"gpus": 2, "sharding": "fsdp", **MP}, None),
        ({"gpus": 4, "sharding": "hsdp", "fsdp_param_dtype": "bf16"}, None),
        ({"gpus": 2, "sharding": "ddp", **MP}, "--fsdp-param-dtype applies to --sharding fsdp1"),
        ({"gpus": 2, "sharding": "zero2", "fsdp_reduce_dtype": "fp32"}, "or fsdp/hsdp"),
        ({"gpus": 2, "sharding": "fsdp", "fsdp_buffer_dtype": "bf16"}, "--fsdp-buffer-dtype"),
    ],
)
def test_the_policy_options_apply_to_fsdp2(kwargs, needle):
    if needle is None:
        TrainSpec.of(**kwargs)
    else:
        with pytest.raises(ValueError, match=needle):
            TrainSpec.of(**kwargs)


@pytest.mark.slow  # two captures, ~10 s on a shared core
def test_fp32_shards_bf16_gathers_by_hand():
    """A steady step (gradients zeroed, kept) with MixedPrecisionPolicy(bf16, fp32) over
    fp32 parameters, rank 0 of 2. By hand, FSDP2 shards dim 0 of each parameter: rank 0
    holds ceil(d0 / 2) x the rest elements of each. Parameters, gradients (reduce-scattered
    in fp32 into fp32 shards) and AdamW's two moments are fp32 shards: 4 bytes an element,
    the moments twice that, plus a 4-byte step counter per parameter; the same bytes as
    without the policy. The parameters all-gathered for forward and backward are bf16: the
    unsharded copies are half the fp32 ones (2 bytes an element of each padded tensor)."""
    plain = _captured(gpus=2, sharding="fsdp", steps="steady", set_to_none=False)
    mixed = _captured(gpus=2, sharding="fsdp", steps="steady", set_to_none=False, **MP)
    shard = sum(-(-s[0] // 2) * math.prod(s[1:]) for s in _shapes())
    buffers = sum(b.numel() * b.element_size() for b in _llama().build().buffers())
    for graph in (plain, mixed):
        assert sum(_storages(graph, "parameter", True)) == shard * 4 + buffers
        assert sum(_storages(graph, "gradient", True)) == shard * 4
        assert sum(_storages(graph, "optimizer_state", True)) == shard * 8 + 4 * len(_shapes())
    whole = {-(-s[0] // 2) * 2 * math.prod(s[1:]) for s in _shapes()}
    assert {b // 4 for b in _storages(plain, "parameter", False)} >= whole
    assert {b // 2 for b in _storages(mixed, "parameter", False)} >= whole
    assert max(_storages(mixed, "parameter", False)) * 2 == max(
        _storages(plain, "parameter", False)
    )
    ours = _predict(mixed)
    assert ours.predicted_peak_bytes < _predict(plain).predicted_peak_bytes  # bf16 activations
    assert ours.breakdown["parallel"]["fsdp_param_dtype"] == "bf16"
    assert ours.breakdown["parallel"]["fsdp_reduce_dtype"] == "fp32"


# ---- a real 2-rank gloo run, recorded by memgnn's CPU recorder ------------------------------


def _rank(rank: int, port: int, out: str, options: dict[str, str]) -> None:
    """One rank of a real FSDP2 job with MixedPrecisionPolicy(bf16, fp32) on CPU over gloo:
    memgnn's TrainingStep on real tensors in a real process group (fully_shard per block,
    then the root, mp_policy passed), recorded by the same StepRecorder as capture, and
    torch.profiler's allocator events over the same steps."""
    from memgnn.predictor.capture.step import TrainingStep, step_plan
    from memgnn.predictor.emulate.parallel import ShardedObserver, World, comm_hooks
    from memgnn.predictor.emulate.tensor_parallel import unrecorded_propagation
    from memgnn.predictor.ir.recorder import ModuleTracker, StepRecorder, register_state
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule
    from torch.profiler import ProfilerActivity, profile

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    train = TrainSpec.of(gpus=2, sharding="fsdp", **options)
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("dp",))
    world = World(size=2, rank=rank, mesh=mesh)
    bundle = _llama()
    step = TrainingStep(bundle, train, device=torch.device("cpu"), target="cpu", world=world)
    policies = {
        (str(m._get_fsdp_state()._mp_policy.param_dtype),
         str(m._get_fsdp_state()._mp_policy.reduce_dtype))
        for m in step.model.modules()
        if isinstance(m, FSDPModule)
    }  # fmt: skip
    with ModuleTracker(step.model) as tracker:
        rec = StepRecorder(hooks=comm_hooks(gloo=True), module_stack=tracker.stack,
                           track_resize=True)  # fmt: skip
        register_state(rec, step.state_tensors())
        registered = len(rec.storages)
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            with rec, unrecorded_propagation():
                step.run(SIZES, ShardedObserver(rec, step.model), steps=step_plan(train)[1])
        rec.close()
    staged = set_aside_staged(rec, registered)  # gloo's staging clones
    params = {str(p.dtype) for p in step.model.parameters()}
    graph = recorded_graph(rec, bundle, train, SIZES)
    delta = profiler_peak(prof)
    Path(out, f"rank{rank}.json").write_text(json.dumps({
        "recorded": _predict(graph).predicted_peak_bytes,
        "staged": sorted(staged),
        "before": sum(_storages(graph, "parameter", True)),
        "profiler_delta": delta,
        "policies": sorted(map(list, policies)), "params": sorted(params),
    }))  # fmt: skip
    dist.destroy_process_group()


@pytest.mark.slow  # two spawned ranks, ~1 min on 2 shared cores
def test_rank_peak_matches_a_real_gloo_run(tmp_path):
    """memgnn's rank-0 prediction (one symbolic capture over a fake process group, at an
    odd batch) against a real 2-rank gloo run of the same two steps under FSDP2 with
    MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32) (every dim 0 of the tiny
    llama is even: both ranks hold alike shards). memgnn's CPU recorder on each real rank:
    the prediction to the byte (2,638,716 B), once gloo's staging clones it meets are set
    aside: fp32 copies of reduce-scatter inputs (a block's 45,440 elements, the root's
    65,600: 181,760 and 262,400 B; measured: all six of two steps, or four), which
    capture counts as the collective's scratch. torch.profiler's allocator events
    (parameters before + the steps' peak delta) cross-check it: 313,024 + 2,325,692 = the
    prediction, within 2 KB (memgnn counts ~1 KB more than the profiler in the DDP/FSDP
    checks, benchmarks/results/sharding.md), plus what gloo's worker thread frees late (up to
    the staging copies' sum; one loaded run read +131,200 B). The real run's parameters are
    fp32 shards, every FSDP module carries the policy. Measured: profiler excess 0 B on
    both ranks."""
    ours = _predict(_captured(gpus=2, sharding="fsdp", **MP)).predicted_peak_bytes
    rs = sorted([181_760, 181_760, 262_400] * 2)
    for real in spawn_ranks(_rank, tmp_path, MP):
        assert real["recorded"] == ours, (real, ours)
        assert real["staged"] and set(real["staged"]) <= set(rs)
        excess = real["before"] + real["profiler_delta"] - ours
        # gloo's worker thread frees staging copies (and, on a loaded machine, once a
        # 131,200 B buffer) after the main thread's next allocations, at random: the
        # profiler may read more than the prediction by late frees, never less
        assert -2048 <= excess <= sum(rs), (ours, excess)
        assert real["params"] == ["torch.float32"]
        assert real["policies"] == [["torch.bfloat16", "torch.float32"]]
