"""Pipeline parallelism composed with FSDP2 and tensor parallelism (`--pp P --sharding fsdp
--gpus P x dp`, `--pp P --tp T --gpus P x T`, and 3-D, torchtitan's (pp, dp_shard, tp)
mesh): the options and their refusals, each stage's state sharded over its data-parallel
ranks by hand, and real gloo runs (pp 2 x dp 2, pp 2 x tp 2: 4 ranks; pp 2 x dp 2 x tp 2:
8 ranks) recorded by memgnn's own recorder against the per-stage prediction."""

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
from memgnn.predictor.emulate.pipeline import stage_bundle
from memgnn.predictor.errors import UserError
from memgnn.predictor.ir.vocab import CATEGORIES
from memgnn.predictor.memory.analytic import AnalyticModel
from memgnn.predictor.memory.base import Query
from memgnn.predictor.plan.space import SearchSpace, variants
from memgnn.predictor.spec.train import TrainSpec

from memgnn.cli.predict import _ranks

SIZES = {"B": 3, "S": 40}  # an odd micro-batch, not the trace sizes (B=4, S=64)
MODEL_ARGS = {"layers": 4, "vocab": 64}  # every dim 0 even: both dp ranks hold alike shards
RNG_STATE = 5056  # torch.get_rng_state().numel(): the CPU generator's state, bytes


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"gpus": 4, "pp": 2, "sharding": "fsdp"}, None),
        ({"gpus": 6, "pp": 2, "sharding": "fsdp"}, None),  # dp 3: FSDP2 pads the shards
        ({"gpus": 8, "pp": 4, "sharding": "fsdp", "pp_schedule": "gpipe"}, None),
        ({"gpus": 4, "pp": 2, "sharding": "fsdp", "fsdp_reshard_after_forward": False}, None),
        ({"gpus": 2, "pp": 2, "sharding": "fsdp"}, "needs --gpus a multiple of 2 \\(--pp\\) >= 4"),
        ({"gpus": 5, "pp": 2, "sharding": "fsdp"}, "needs --gpus a multiple of 2 \\(--pp\\) >= 4"),
        ({"gpus": 4, "pp": 2}, "leaves 2 data-parallel ranks per stage: add --sharding fsdp"),
        ({"gpus": 3, "pp": 2}, "--pp 2 needs --gpus 2"),
        ({"gpus": 4, "pp": 2, "sharding": "hsdp"}, "--sharding hsdp is not modelled yet"),
        ({"gpus": 4, "pp": 2, "sharding": "zero3"}, "--sharding zero3 is not modelled yet"),
        ({"gpus": 4, "pp": 2, "sharding": "ddp"}, "--sharding ddp is not modelled yet"),
        ({"gpus": 4, "pp": 2, "sharding": "fsdp1"}, "--sharding fsdp1 is not modelled yet"),
        ({"gpus": 4, "pp": 2, "tp": 2}, None),  # PP x TP
        ({"gpus": 8, "pp": 2, "tp": 2, "sharding": "fsdp"}, None),  # 3-D
        ({"gpus": 8, "pp": 2, "tp": 2}, "--pp 2 x --tp 2 --gpus 8 leaves 2 data-parallel"),
        ({"gpus": 6, "pp": 2, "tp": 2}, "--pp 2 x --tp 2 needs --gpus 4"),
        (
            {"gpus": 4, "pp": 2, "tp": 2, "sharding": "fsdp"},
            "a multiple of 4 \\(--pp x --tp\\) >= 8",
        ),
        (
            {"gpus": 4, "pp": 2, "sharding": "fsdp", "fsdp_cpu_offload": True},
            "--pp 2 with --fsdp-cpu-offload is not modelled yet",
        ),
        (
            {"gpus": 4, "pp": 2, "sharding": "fsdp", "grad_sync": "last"},
            "--grad-sync last with --pp 2",
        ),
    ],
)
def test_pp_fsdp_options_and_refusals(kwargs, needle):
    if needle is None:
        p = TrainSpec.of(**kwargs).parallel
        assert p.dp == kwargs["gpus"] // (kwargs["pp"] * kwargs.get("tp", 1))
        assert (p.dp >= 2) == (p.sharding == "fsdp")
        return
    with pytest.raises(ValueError, match=needle):
        TrainSpec.of(**kwargs)


@functools.cache
def _llama():
    from memgnn.predictor.zoo.resolve import resolve

    return resolve("llama", MODEL_ARGS)


@functools.cache
def _captured(**kwargs: Any) -> Any:
    return capture(_llama(), _spec(**kwargs), CaptureConfig(target="cpu"))


def _spec(**kwargs: Any) -> TrainSpec:
    """--pp 2, 4 micro-batches; --sharding fsdp over 4 GPUs unless `kwargs` say."""
    return TrainSpec.of(**({"gpus": 4, "pp": 2, "sharding": "fsdp", "microbatches": 4} | kwargs))


def _predict(graph, sizes=SIZES):
    return AnalyticModel().predict(graph, [Query(sizes=sizes, device="cpu")])[0]


def _stage_peaks(graph) -> list[int]:
    return [p["predicted_peak_bytes"] for p in _predict(graph).paths]


def _initial(graph, path: int, category: str) -> int:
    """Bytes of `category` alive before the recorded steps on `path` (a stage's rank)."""
    p = graph.paths[path]
    nbytes = graph.storage_bytes(path, graph.resolve_sizes(graph.symbols))
    code = CATEGORIES.index(category)
    return sum(
        int(nbytes[u])
        for u in range(p.num_storages)
        if p.storages["category"][u] == code and p.storages["alloc"][u] == -1
    )


@pytest.mark.slow  # two stages captured, ~15 s on a shared core
def test_each_stage_holds_its_own_fsdp_shards_by_hand():
    """A steady step (kept gradients): before it, stage k's rank holds AdamW's state for
    dim-0 halves (dp 2) of stage k's own parameters only (2 x fp32 each, + a step counter
    per parameter), not the whole model's; the answer names the worst stage and its
    global rank (stage x dp)."""
    graph = _captured(steps="steady", set_to_none=False)
    assert graph.guards == []
    for stage in (0, 1):
        with torch.device("meta"):
            model = stage_bundle(_llama(), 2, stage).build()
        shapes = [tuple(p.shape) for p in model.parameters()]
        shard = sum(-(-s[0] // 2) * math.prod(s[1:]) * 4 for s in shapes)
        assert _initial(graph, stage, "optimizer_state") == 2 * shard + 4 * len(shapes)
        assert _initial(graph, stage, "gradient") == shard
    answer = _predict(graph)
    par = answer.breakdown["parallel"]
    assert par["world_size"] == 4 and par["sharding"] == "fsdp" and par["dp"] == 2
    worst = par["worst_stage"]
    assert par["rank"] == 2 * worst and answer.predicted_peak_bytes == max(_stage_peaks(graph))
    assert [p["conditions"][-1]["rank"] for p in answer.paths] == [0, 2]
    assert _ranks(par) == "pp 2 x fsdp dp 2: 1f1b, 4 micro-batches"
    assert _ranks(par | {"tp": 2}) == "pp 2 x fsdp dp 2 x tp 2: 1f1b, 4 micro-batches"
    assert not dist.is_initialized()


# ---- real 4-rank gloo runs (pp 2 x dp 2), recorded by memgnn's CPU recorder ------------------


def _rank(rank: int, port: int, out: str, options: dict[str, Any]) -> None:
    """One rank of a real --pp 2 job composed with --sharding fsdp and/or --tp on CPU over
    gloo, laid out as torchtitan's mesh (pp, dp_shard, tp): memgnn's PipelineStep (the
    rank's stage, its linears split over tp, fully_shard per block and on the stage over
    dp_shard, PyTorch's PipelineStage and schedule over pp) on real tensors, recorded by the
    same StepRecorder as capture, and torch.profiler's allocator events over the same
    steps."""
    from memgnn.predictor.capture.pipeline_step import PipelineStep
    from memgnn.predictor.capture.step import step_plan
    from memgnn.predictor.emulate.parallel import ShardedObserver, World, comm_hooks
    from memgnn.predictor.emulate.tensor_parallel import unrecorded_propagation
    from memgnn.predictor.ir.recorder import ModuleTracker, StepRecorder, register_state
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule
    from torch.profiler import ProfilerActivity, profile

    train = _spec(**options)
    par = train.parallel
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=par.gpus)
    torch.set_num_threads(1)
    dims = [(n, k) for n, k in (("pp", par.pp), ("dp_shard", par.dp), ("tp", par.tp)) if k > 1]
    mesh = init_device_mesh("cpu", tuple(k for _, k in dims),
                            mesh_dim_names=tuple(n for n, _ in dims))  # fmt: skip
    world = World(
        size=par.gpus, rank=rank, mesh=mesh["dp_shard"] if par.dp > 1 else None,
        pp_mesh=mesh["pp"], tp_mesh=mesh["tp"] if par.tp > 1 else None,
    )  # fmt: skip
    bundle = _llama()
    step = PipelineStep(bundle, train, device=torch.device("cpu"), target="cpu", world=world)
    fsdp = sum(isinstance(m, FSDPModule) for m in step.model.modules())
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
    graph = recorded_graph(rec, bundle, train, SIZES)
    Path(out, f"rank{rank}.json").write_text(json.dumps({
        "recorded": _predict(graph).predicted_peak_bytes,
        "staged": sorted(staged),
        "before": _initial(graph, 0, "parameter"),
        "profiler_delta": profiler_peak(prof),
        "stage": world.pp_rank, "fsdp_modules": fsdp,
        "params": sorted({str(p.dtype) for p in step.model.parameters()}),
    }))  # fmt: skip
    dist.destroy_process_group()


@pytest.mark.slow  # four (eight: 3-D) spawned ranks per run, ~1 min on 2 shared cores
@pytest.mark.parametrize(
    "options",
    [
        {"pp_schedule": "1f1b"},
        {"pp_schedule": "gpipe"},
        {"pp_schedule": "interleaved1f1b"},  # two model parts per rank, each its own root
        {"pp_schedule": "1f1b", "fsdp_reshard_after_forward": False},  # torchtitan's default
        {"pp_schedule": "1f1b", "fsdp_param_dtype": "bf16", "fsdp_reduce_dtype": "fp32"},
        {"pp_schedule": "1f1b", "checkpointing": "full"},
        {"pp_schedule": "1f1b", "sharding": "none", "tp": 2},  # PP x TP
        {"pp_schedule": "gpipe", "sharding": "none", "tp": 2},
        {"pp_schedule": "1f1b", "gpus": 8, "tp": 2},  # 3-D: (pp, dp_shard, tp)
    ],
    ids=lambda o: "-".join(str(v) for v in o.values()),
)
def test_stage_peaks_match_a_real_gloo_run(tmp_path, options):
    """memgnn's per-stage prediction (one symbolic capture per stage over the fake process
    group, rank stage x dp x tp of a (pp, dp_shard, tp) mesh, at an odd micro-batch)
    against a real gloo run of the same step: memgnn's CPU recorder on every real rank gives
    its stage's predicted peak to the byte (every dim split evenly: a stage's ranks hold
    alike shards), once gloo's reduce-scatter staging clones are set aside (capture counts
    them as the collective's scratch). torch.profiler's allocator events (parameters before
    + the step's peak delta) cross-check it within 2 KB, plus what gloo's worker thread may
    free late (up to the staging copies' sum), as the FSDP2 checks bound theirs.
    Measured (stage 0, stage 1 peaks; every rank equal to its stage's, profiler excess 0 B
    on all four): 1F1B 4,166,540 / 2,928,804 B; GPipe 6,309,772 / 6,605,008; interleaved
    1F1B 5,238,284 / 4,071,364; 1F1B without reshard after forward 4,166,284 / 2,912,164;
    1F1B with MixedPrecisionPolicy(bf16, fp32) 2,736,140 / 2,076,964; 1F1B with
    --checkpointing full 2,430,284 / 2,333,604 (the profiler: + 4 x 5,056 B of RNG state,
    one rank + a 181,760 B staging copy freed late). PP x TP (pp 2 x tp 2):
    1F1B 2,700,044 / 1,941,892 (one rank read 30,712 B more: a late buffer), GPipe
    4,154,124 / 4,498,512; 3-D (pp 2 x dp 2 x tp 2, 8 ranks) 1F1B 2,600,716 / 1,780,996 on
    all 8 ranks."""
    ours = _stage_peaks(_captured(**options))
    par = _spec(**options).parallel
    per = par.gpus // par.pp
    # under --tp gloo's worker thread may free an all-reduced activation (micro-batch x S x
    # hidden, fp32) after the main thread's next allocations, at random (as in
    # tests/predictor/emulate/test_tensor_parallel.py): only a whole number of such buffers
    # may separate a reading from the prediction, and only under --tp
    # (the peak then lands on another node: a few bytes off, measured -8 B once; within
    # 1 KB)
    late = SIZES["B"] * SIZES["S"] * _llama().hparams["hidden"] * 4 if par.tp > 1 else 0
    slack = 1024 if late else 0

    def exact(r: dict) -> bool:
        ours_r = ours[r["stage"]]
        k = max(round((r["recorded"] - ours_r) / late), 0) if late else 0
        return abs(r["recorded"] - ours_r - k * late) <= slack

    # a staging copy gloo's worker thread frees late can reach the recorder now and then
    # (interleaved 1F1B read +16,640 B once in a whole-suite run): up to three runs
    for _attempt in range(3):
        real = spawn_ranks(_rank, tmp_path, options, world=par.gpus)
        if all(exact(r) for r in real):
            break
    assert [r["stage"] for r in real] == [r // per for r in range(par.gpus)]
    blocks = 2 if par.sharding == "fsdp" else 0  # + each model part's root
    assert all(r["fsdp_modules"] == blocks + (blocks > 0) * par.pp_stages_per_rank for r in real)
    for r in real:
        ours_r = ours[r["stage"]]
        k = max(round((r["recorded"] - ours_r) / late), 0) if late else 0
        assert abs(r["recorded"] - ours_r - k * late) <= slack, (ours, r)
        # the profiler: late all-reduce buffers (whole ones, up to 8) and late staging
        # copies (any of them) on top of the prediction, within 2 KB (4 KB under --tp)
        excess = r["before"] + r["profiler_delta"] - ours_r
        bound = 2048 + 2 * slack
        # checkpointing: the CPU generator's state per block and micro-batch in flight
        # (torch.get_rng_state(), made outside any aten op; as test_pipeline.py)
        top = sum(r["staged"]) + bound + (8 * RNG_STATE if "checkpointing" in options else 0)
        fits = [-bound <= excess - k * late <= top for k in range(9)]
        assert any(fits if late else fits[:1]), (ours, r)


@pytest.mark.slow  # one stage captured before the refusal, ~10 s
def test_pp_tp_with_a_foreach_optimizer_is_refused_as_a_real_job_fails():
    """--pp x --tp alone on CUDA: the default AdamW is foreach, which refuses the split
    linears' DTensors next to the stage's plain weights (as --tp alone)."""
    train = _spec(gpus=4, sharding="none", tp=2)
    with pytest.raises(UserError, match="--optimizer-impl for-loop, or --sharding fsdp"):
        capture(_llama(), train, CaptureConfig(target="cuda"))
    assert not dist.is_initialized()


def test_plan_keeps_pp_x_fsdp_and_leaves_out_what_it_refuses():
    """`plan` over shardings: --pp 2 --gpus 4 runs under fsdp only (none leaves 2 ranks per
    stage, hsdp is refused under --pp)."""
    space = SearchSpace(sharding=["none", "fsdp", "hsdp"])
    got = {(t.parallel.gpus, t.parallel.sharding) for t in variants(_spec(), space)}
    assert got == {(4, "fsdp")}


@pytest.mark.slow  # six spawned ranks, ~1 min on 2 shared cores
def test_dp_3_pads_and_the_first_rank_of_each_stage_holds_the_most(tmp_path):
    """--gpus 6 --pp 2 --sharding fsdp: dp 3 does not divide the tiny Llama's dims (64 rows
    split 22 / 22 / 20): FSDP2 pads. memgnn answers each stage's first rank; a real 6-rank
    gloo run: ranks 0 and 3 read the prediction to the byte, the middle dp rank the same,
    the last dp rank (smaller unpadded shards: its gradients and AdamW state) 16,832 /
    16,848 B less. gloo's worker thread may free one staging copy late on any rank (one
    run read +185,712 B on rank 1): a reading above the prediction must be that."""
    options = {"pp_schedule": "1f1b", "gpus": 6}
    ours = _stage_peaks(_captured(**options))
    real = spawn_ranks(_rank, tmp_path, options, world=6)
    for rank, r in enumerate(real):
        d = r["recorded"] - ours[rank // 3]
        late = [0, *r["staged"]]  # none, or one staging copy freed late (185,712 B: a block's)
        if rank % 3 == 2:  # the last dp rank: less, by its smaller shards (< 1%)
            assert any(-0.01 * ours[rank // 3] < d - c < 0 for c in late), (ours, r)
        else:
            assert d in late, (ours, r)
