"""Tensor parallelism (`--tp`): the option, the plan, rank 0's captured state by hand, the
symbolic capture at an odd batch, 2-D with FSDP2, and a real 2-rank gloo run recorded by
memgnn's own recorder against the prediction."""

from __future__ import annotations

import argparse
import fnmatch
import functools
import json
import math
import os
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from gloo_ranks import recorded_graph, spawn_ranks
from memgnn.dataset.cpu_backend import profiler_peak
from memgnn.predictor.capture.capture import CaptureConfig, capture
from memgnn.predictor.emulate.tensor_parallel import tp_plan
from memgnn.predictor.errors import UserError
from memgnn.predictor.ir.vocab import CATEGORIES
from memgnn.predictor.memory.analytic import AnalyticModel
from memgnn.predictor.memory.base import Query
from memgnn.predictor.spec.train import TrainSpec
from torch import nn

from memgnn.cli.options import add_train_args, train_spec

SIZES = {"B": 3, "S": 40}  # an odd batch, not the trace sizes (B=4, S=64)


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"gpus": 2, "tp": 2}, None),
        ({"gpus": 8, "tp": 2, "sharding": "fsdp"}, None),
        ({"gpus": 2, "tp": 0}, "--tp must be an integer >= 1"),
        ({"gpus": 3, "tp": 2}, "--tp 2 must divide --gpus 3"),
        ({"gpus": 4, "tp": 2}, "leaves 2 data-parallel ranks: add --sharding fsdp"),
        ({"gpus": 2, "tp": 2, "sharding": "fsdp"}, "needs --gpus >= 4"),
        ({"gpus": 4, "tp": 2, "sharding": "ddp"}, "--tp 2 with --sharding ddp is not modelled"),
        ({"gpus": 4, "tp": 2, "sharding": "fsdp1"}, "--tp 2 with --sharding fsdp1 is not"),
        ({"gpus": 4}, r"or --tp 4 \(tensor parallel\)"),
        ({"gpus": 2, "tp": 2, "peft": "lora"}, "--tp 2 with --peft lora is not modelled"),
        ({"gpus": 2, "tp": 2, "offload_activations": "save_on_cpu"}, "--offload-activations"),
        ({"gpus": 2, "tp": 2, "offload_optimizer": "torchao"}, "--offload-optimizer torchao"),
    ],
)
def test_tp_combinations(kwargs, needle):
    if needle is None:
        t = TrainSpec.of(**kwargs)
        assert t.parallel.dp * t.parallel.tp == t.parallel.gpus
        assert t.parallel.distributed
        return
    with pytest.raises(ValueError, match=needle):
        TrainSpec.of(**kwargs)


def test_tp_defaults_and_cli_flag():
    assert (TrainSpec().parallel.tp, TrainSpec().parallel.distributed) == (1, False)
    p = argparse.ArgumentParser()
    add_train_args(p)
    t = train_spec(p.parse_args(["--gpus", "4", "--tp", "2", "--sharding", "fsdp"]))
    assert (t.parallel.tp, t.parallel.dp, t.parallel.shard_group_size) == (2, 2, 2)
    assert t.flat()["tp"] == 2
    from memgnn.serving.schemas import TrainIn
    from pydantic import ValidationError

    assert TrainIn(gpus=2, tp=2).to_spec().parallel.tp == 2
    with pytest.raises(ValidationError, match="--tp 2 must divide --gpus 3"):
        TrainIn(gpus=3, tp=2)


# ---- the plan -------------------------------------------------------------------------------


@functools.cache
def _llama():
    from memgnn.predictor.zoo.resolve import resolve

    return resolve("llama")


def _built() -> nn.Module:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        return _llama().build()


def test_plan_is_the_configs_base_model_tp_plan():
    model = _built()
    plan = tp_plan(model, list(model.model.layers), 2)
    assert plan.source == "config.base_model_tp_plan"
    layers = len(model.model.layers)
    want = {"q_proj": "colwise", "k_proj": "colwise", "v_proj": "colwise",
            "o_proj": "rowwise"}  # fmt: skip
    want |= {"gate_proj": "colwise", "up_proj": "colwise", "down_proj": "rowwise"}
    assert plan.styles == {
        f"model.layers.{i}.{'self_attn' if k.endswith(('q_proj', 'k_proj', 'v_proj', 'o_proj')) else 'mlp'}.{k}": s  # noqa: E501
        for i in range(layers)
        for k, s in want.items()
    }


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(8, 8) for _ in range(4))
        self.w1, self.w3, self.w2 = nn.Linear(8, 16), nn.Linear(8, 16), nn.Linear(16, 8)


def test_without_a_config_plan_torchtitans_llama_names():
    model = nn.Sequential(nn.Linear(8, 8), _Block(), _Block())
    plan = tp_plan(model, [model[1], model[2]], 2)
    assert plan.source.startswith("torchtitan")
    assert plan.styles["1.wq"] == plan.styles["2.w3"] == "colwise"
    assert plan.styles["1.wo"] == plan.styles["2.w2"] == "rowwise"
    assert "0" not in plan.styles  # outside the blocks: whole


def test_refusals_name_what_does_not_fit():
    model = _built()
    blocks = list(model.model.layers)
    with pytest.raises(UserError, match="num_key_value_heads = 2 is not divisible by 4"):
        tp_plan(model, blocks, 4)
    with pytest.raises(UserError, match="no tensor-parallel plan for Sequential"):
        tp_plan(nn.Sequential(nn.Linear(4, 4)), [], 2)
    model.config.base_model_tp_plan = {"layers.*.mlp.gate_proj": "packed_colwise"}
    with pytest.raises(UserError, match="'packed_colwise', which memgnn does not model"):
        tp_plan(model, blocks, 2)
    odd = nn.Sequential(_Block())
    odd[0].w1 = nn.Linear(8, 15)
    with pytest.raises(UserError, match="0.w1 splits 15 output features, not divisible by 2"):
        tp_plan(odd, [odd[0]], 2)


# ---- rank 0's step, captured ----------------------------------------------------------------


@functools.cache
def _captured(symbolic: bool = True, **kwargs: Any) -> Any:
    cfg = CaptureConfig(target="cpu", symbolic=symbolic, sizes=None if symbolic else SIZES)
    return capture(_llama(), TrainSpec.of(**kwargs), cfg)


def _predict(graph, sizes=SIZES):
    return AnalyticModel().predict(graph, [Query(sizes=sizes, device="cpu")])[0]


def _initial(graph, category: str) -> int:
    p = graph.paths[0]
    nbytes = graph.storage_bytes(0, graph.resolve_sizes(graph.symbols))
    code = CATEGORIES.index(category)
    return sum(
        int(nbytes[u])
        for u in range(p.num_storages)
        if p.storages["category"][u] == code and p.storages["alloc"][u] == -1
    )


def _local_shapes(tp: int) -> list[tuple[int, ...]]:
    """Each parameter's shape on rank 0 by hand: colwise rows / tp, rowwise columns / tp
    (the config's plan, read here by module name), everything else whole."""
    model = _built()
    plan = {f"model.{k}": v for k, v in model.config.base_model_tp_plan.items()}
    out = []
    for name, p in model.named_parameters():
        style = next((s for k, s in plan.items() if fnmatch.fnmatch(name, f"{k}.weight")), None)
        shape = list(p.shape)
        if style is not None:
            shape[0 if style == "colwise" else 1] //= tp
        out.append(tuple(shape))
    return out


@pytest.mark.slow  # one capture, ~5 s on a shared core
def test_weights_gradients_and_adamw_state_are_one_tp_shard_by_hand():
    """A steady step with zeroed (kept) gradients: parameters, gradients and AdamW state
    alive before it, each rank 0's shards: the split linears 1/2, the rest whole."""
    graph = _captured(gpus=2, tp=2, steps="steady", set_to_none=False)
    shapes = _local_shapes(2)
    params = sum(math.prod(s) * 4 for s in shapes)
    buffers = sum(b.numel() * b.element_size() for b in _built().buffers())
    assert _initial(graph, "parameter") == params + buffers
    assert _initial(graph, "gradient") == params
    assert _initial(graph, "optimizer_state") == 2 * params + 4 * len(shapes)  # + step
    whole = sum(p.numel() * 4 for p in _built().parameters())
    assert params < whole  # something was split


@pytest.mark.slow  # two captures, ~10 s
def test_symbolic_capture_is_the_concrete_one_at_an_odd_batch():
    """No `B % tp` guard: DTensor's view strategies ask it of unsharded dims
    (`unguarded_propagation`); the concrete capture at B=3 gives the same bytes."""
    sym, conc = _captured(gpus=2, tp=2), _captured(False, gpus=2, tp=2)
    assert sym.guards == []
    comms = [[op for op in g.paths[0].nodes["op"] if "c10d" in op] for g in (sym, conc)]
    assert comms[0] == comms[1]
    a, b = _predict(sym), _predict(conc)
    assert a.predicted_peak_bytes == b.predicted_peak_bytes
    assert a.breakdown["categories"] == b.breakdown["categories"]
    ops = list(sym.paths[0].nodes["op"])
    # per block and step: 2 rowwise outputs in forward, 5 colwise input gradients in backward
    assert ops.count("_c10d_functional.all_reduce.default") == 7 * 2 * 2
    assert a.breakdown["parallel"]["tp"] == 2 and a.breakdown["parallel"]["world_size"] == 2
    assert not dist.is_initialized()


@pytest.mark.slow  # two captures, ~10 s
def test_tp_lowers_the_peak_and_2d_shards_the_tp_shards():
    single = _predict(_captured()).breakdown["categories"]
    tp = _captured(gpus=2, tp=2, steps="steady")
    two_d = _captured(gpus=4, tp=2, sharding="fsdp", steps="steady")
    assert _predict(tp).breakdown["categories"]["activation"] < single["activation"]
    # FSDP2 over dp=2 on top: dim-0 shards (ceil) of each TP shard
    shard = sum(-(-s[0] // 2) * math.prod(s[1:]) * 4 for s in _local_shapes(2))
    assert _initial(two_d, "optimizer_state") == 2 * shard + 4 * len(_local_shapes(2))
    assert _predict(two_d).breakdown["parallel"]["dp"] == 2


# ---- a real 2-rank gloo run, recorded by memgnn's CPU recorder ------------------------------


def _rank(rank: int, port: int, out: str) -> None:
    """One rank of a real --tp 2 job on CPU over gloo: memgnn's TrainingStep on real
    tensors in a real process group, recorded by the same StepRecorder as capture, and
    torch.profiler's allocator events over the same steps."""
    from memgnn.predictor.capture.step import TrainingStep, step_plan
    from memgnn.predictor.emulate.parallel import ShardedObserver, World, comm_hooks
    from memgnn.predictor.emulate.tensor_parallel import unrecorded_propagation
    from memgnn.predictor.ir.recorder import ModuleTracker, StepRecorder, register_state
    from torch.distributed.device_mesh import init_device_mesh
    from torch.profiler import ProfilerActivity, profile

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    train = TrainSpec.of(gpus=2, tp=2)
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
    world = World(size=2, rank=rank, mesh=None, tp_mesh=mesh)
    bundle = _llama()
    step = TrainingStep(bundle, train, device=torch.device("cpu"), target="cpu", world=world)
    with ModuleTracker(step.model) as tracker:
        rec = StepRecorder(hooks=comm_hooks(gloo=True), module_stack=tracker.stack,
                           track_resize=True)  # fmt: skip
        register_state(rec, step.state_tensors())
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            with rec, unrecorded_propagation():  # DTensor's fake shape runs, as capture
                step.run(SIZES, ShardedObserver(rec, step.model), steps=step_plan(train)[1])
        rec.close()
    graph = recorded_graph(rec, bundle, train, SIZES)
    delta = profiler_peak(prof)
    answer = _predict(graph)
    Path(out, f"rank{rank}.json").write_text(json.dumps({
        "recorded": answer.predicted_peak_bytes,
        "before": _initial(graph, "parameter"),
        "profiler_delta": delta,
    }))  # fmt: skip
    dist.destroy_process_group()


@pytest.mark.slow  # two spawned ranks, ~20 s a run on 2 shared cores
def test_rank_peak_matches_a_real_gloo_run(tmp_path):
    """memgnn's rank-0 prediction (one symbolic capture over a fake process group, at an
    odd batch) against a real 2-rank gloo run of the same step. memgnn's CPU recorder on
    each real rank: the same peak as the prediction, to the byte, bar late frees.
    torch.profiler's allocator events (state before + the step's delta) cross-check it:
    gloo's worker thread sometimes frees an all-reduced activation (B x S x hidden fp32)
    after the main thread's next allocations, on either rank, at random (on a loaded
    2-core machine every rank of three runs in a row once had it). So each rank's profiler
    reading is the prediction plus a whole number of such late buffers (up to 3 seen),
    within 1 KB (memgnn counts ~1 KB more than the profiler in the DDP/FSDP checks,
    benchmarks/results/sharding.md; here it was 0); any other excess fails."""
    ours = _predict(_captured(gpus=2, tp=2)).predicted_peak_bytes
    late = SIZES["B"] * SIZES["S"] * _llama().hparams["hidden"] * 4
    for real in spawn_ranks(_rank, tmp_path):
        # the recorder sees a late free too when gloo's thread lets go of the buffer after
        # the main thread's next op (once, on a machine loaded by two other jobs): only a
        # whole number of such buffers may separate it from the prediction
        k = (real["recorded"] - ours) // late
        assert k >= 0 and real["recorded"] == ours + k * late, (real, ours, late)
        excess = real["before"] + real["profiler_delta"] - ours
        # late frees only add, a whole number of buffers (3 seen in a loaded CI run)
        k = round(excess / late)
        assert k >= 0 and abs(excess - k * late) <= 1024, (ours, excess, late)


@pytest.mark.slow  # one capture, ~5 s
def test_tp_alone_with_a_foreach_optimizer_is_refused_as_a_real_job_fails():
    """CUDA's default AdamW is foreach: it refuses DTensor and plain weights in one call."""
    train = TrainSpec.of(gpus=2, tp=2)
    with pytest.raises(UserError, match="--optimizer-impl for-loop, or --sharding fsdp"):
        capture(_llama(), train, CaptureConfig(target="cuda"))
    assert not dist.is_initialized()
