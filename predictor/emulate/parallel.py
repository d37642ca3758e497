"""One rank of a data/model-parallel training step, run by PyTorch's own machinery.

A `TrainSpec` with `gpus=N, sharding=...` runs rank 0 of an N-rank job in this one process
over a fake process group (`torch.testing._internal.distributed.fake_pg`: collectives move
no data, but every buffer they take is allocated as in a real job). The model is wrapped by
what a user runs, so the all-gather and reduce-scatter buffers, DDP's gradient buckets and
FSDP2's prefetching are PyTorch's, recorded node for node by the same `StepRecorder`:

- `ddp`: `DistributedDataParallel` (default `bucket_cap_mb`, `gradient_as_bucket_view=False`):
  parameters, gradients and optimizer state replicated, plus the gradient buckets (`comm`).
- `fsdp`: FSDP2 `fully_shard` on every repeated block, then on the root (as torchtitan does),
  `reshard_after_forward` from the spec, and `mp_policy=MixedPrecisionPolicy(param_dtype,
  reduce_dtype)` from `--fsdp-param-dtype` / `--fsdp-reduce-dtype` where given (torchtitan's
  bf16 / fp32 over fp32 shards: the all-gathered unsharded parameters and the compute in
  bf16, the bf16 unsharded gradients cast to fp32 for the reduce-scatter into fp32 sharded
  gradients, the optimizer on the fp32 shards). Parameters, gradients and optimizer state are
  sharded (rank 0 holds the largest, padded shard); unsharded groups live between their
  all-gather and their reshard. A 4-bit base's codes in uint8 storage stay whole on every
  rank (`ignored_params`, as accelerate's fully_shard path leaves them); in a float
  `--bnb-quant-storage` they are sharded with the rest (FSDP-QLoRA).
  `--fsdp-cpu-offload true`: `CPUOffloadPolicy()`, shards on the host
  (`predictor.emulate.fsdp_offload`).
- `zero3`: the same as `fsdp` with `reshard_after_forward=True` (ZeRO-3 = full sharding).
- `hsdp`: `fully_shard` over a 2-D mesh (replicate x shard, `TrainSpec.shard_group_size`
  ranks per shard group): sharded within a group, gradients all-reduced across groups.
- `fsdp1`: FSDP1 `FullyShardedDataParallel` with flat parameters, its ShardingStrategy,
  prefetching, use_orig_params and MixedPrecision from the spec (`predictor.emulate.fsdp1`).
- `zero1`: DDP + `torch.distributed.optim.ZeroRedundancyOptimizer`: optimizer state sharded
  (rank 0's partition), parameters and gradients replicated (with DDP's buckets).
- `zero2`: gradients and optimizer state sharded, parameters kept whole on every rank.
  PyTorch has no ZeRO-2 wrapper; `fully_shard(reshard_after_forward=False)` alone is not it
  (it reshards after backward, so parameters are sharded at rest and all-gathered every
  step). We run `fully_shard(reshard_after_forward=False)` and `set_reshard_after_backward
  (False)`: after the first step the unsharded parameters stay allocated (no more
  all-gathers), gradients are reduce-scattered to shards, the optimizer steps on shards.
  Per rank that is full parameters + a parameter shard (DeepSpeed ZeRO-2's fp32 master
  partition) + gradient shards + optimizer-state shards.

`--tp N` (`predictor.emulate.tensor_parallel`) splits each block's linears over N ranks with
DTensor's `parallelize_module` first: alone (`--sharding none`, `--gpus N`) over a 1-D `tp`
mesh, or 2-D under `fsdp` (`--gpus dp x N`: a (dp, tp) mesh, FSDP2 over `dp`).

`--pp N` (`predictor.emulate.pipeline`) runs pipeline rank k as stage k, PyTorch's
`PipelineStage` and schedule over it (`capture.pipeline_step.PipelineStep`); each stage's
rank is captured, not only rank 0. Alone (`--gpus N`, a 1-D `pp` mesh) the stage is whole
on its rank; composed as torchtitan does, over a (pp, dp_shard, tp) mesh (the dimensions
> 1), each model part of the rank is split by `--tp` first, then sharded by `fully_shard`
(per block, then the part as its own root) over `dp_shard` (`--sharding fsdp`, `--gpus =
N x dp x tp`); stage k's first rank, k x dp x tp, is the one captured.

Gradient accumulation (`TrainSpec.grad_sync`): `every` syncs on every micro-step (FSDP2's
default: each backward reduce-scatters into the sharded gradients); `last` runs every
micro-step but the last without sync, as users accumulate without communication: DDP's
`no_sync()` (gradients accumulate in `.grad`, no all-reduce until the last backward) and
FSDP1's `no_sync()` (the unsharded flat gradient kept on each flat parameter) and
FSDP2's `set_requires_gradient_sync(False)` ("the equivalence of `no_sync` in FSDP1",
which is what Lightning's `no_backward_sync` calls under its FSDPStrategy): each group's
post-backward still reshards its parameters but keeps the unsharded gradient of every
parameter on the rank (`FSDPParam._unsharded_param.grad`) until the last micro-step
reduce-scatters the sum. Per rank that is one whole unsharded copy of the gradients.

Under fake tensors two things differ from a real job, neither in bytes: DDP's
parameter-shape check across ranks is skipped (it reads tensor data) and DDP's one-time
bucket rebuild after the first iteration is not run (it reads data too); the buckets keep
their construction layout (reverse parameter order, same total bytes). DDP's all-reduce runs
through a comm hook equal to the built-in one (divide in place, all-reduce in place).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from unittest import mock

import torch
import torch.distributed as dist
from memgnn.predictor.emulate.fsdp1 import fake_addresses, fsdp1_gradients, fsdp1_wrap
from memgnn.predictor.emulate.fsdp_offload import cpu_stream_sync, fsdp2_offload_places
from memgnn.predictor.emulate.pipeline import StageParts, pp_note
from memgnn.predictor.emulate.quant import Linear4bitSim
from memgnn.predictor.emulate.tensor_parallel import (
    apply_tp,
    real_mesh_concatenation,
    tp_note,
    unguarded_propagation,
    unrecorded_propagation,
)
from memgnn.predictor.ir.recorder import RecorderObserver, StepRecorder
from memgnn.predictor.spec.train import BY_NAME, MP_POLICY_OPTIONS, OPTIONS_FSDP1, TrainSpec
from torch import nn

log = logging.getLogger(__name__)
_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

__all__ = [
    "World",
    "annotate",
    "rank_note",
    "comm_hooks",
    "fake_world",
    "gradient_sync",
    "mp_policy",
    "unsharded_gradients",
    "parallelize",
    "resident_tensors",
    "ShardedObserver",
    "worst_stage",
    "zero_optimizer",
]


@dataclass(kw_only=True, slots=True)
class World:
    """The fake job one rank runs in: world size, rank and the device mesh (FSDP2)."""

    size: int
    rank: int
    mesh: Any  # torch.distributed.device_mesh.DeviceMesh (1-D, or 2-D for hsdp): data-parallel
    tp_mesh: Any = None  # --tp > 1: the tensor-parallel mesh dimension (emulate.tensor_parallel)
    pp_mesh: Any = None  # --pp > 1: the pipeline mesh dimension (emulate.pipeline)

    @property
    def pp_rank(self) -> int:
        """The rank's coordinate along the pipeline mesh dimension: its stage (0 without
        --pp)."""
        return self.pp_mesh.get_local_rank() if self.pp_mesh is not None else 0


@contextlib.contextmanager
def fake_world(train: TrainSpec, rank: int = 0) -> Iterator[World]:
    """Rank `rank` of a `train.parallel.gpus`-rank fake process group, destroyed on exit.

    Enter it outside any FakeTensorMode (the device mesh is a real tensor). Refuses to
    run inside an already initialised process group (it would replace the user's)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if not train.parallel.distributed:
        raise ValueError(
            "fake_world needs a sharded or tensor-parallel TrainSpec (--sharding ddp|fsdp|..., "
            "--tp N)"
        )
    if not 0 <= rank < train.parallel.gpus:
        raise ValueError(f"rank must be in [0, {train.parallel.gpus}), got {rank}")
    if dist.is_initialized():
        raise RuntimeError(
            "a torch.distributed process group is already initialised in this process; "
            "memgnn's sharded capture runs its own fake one"
        )
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=train.parallel.gpus)
    addresses = fake_addresses() if train.parallel.sharding == "fsdp1" else contextlib.nullcontext()
    try:
        shard, tp, dp = train.parallel.shard_group_size, train.parallel.tp, train.parallel.dp
        if train.parallel.pp > 1:  # torchtitan's (pp, dp_shard, tp), the dims > 1 kept
            dims = [("pp", train.parallel.pp), ("dp_shard", dp), ("tp", tp)]
            kept = [(n, k) for n, k in dims if k > 1 or n == "pp"]
            names, shape = tuple(n for n, _ in kept), tuple(k for _, k in kept)
        elif tp > 1:  # dp x tp (torchtitan's mesh order), or tp alone
            shape, names = ((dp, tp), ("dp", "tp")) if dp > 1 else ((tp,), ("tp",))
        elif train.parallel.hybrid:
            shape, names = (train.parallel.gpus // shard, shard), ("replicate", "shard")
        else:
            shape, names = (train.parallel.gpus,), ("dp",)
        mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
        world = World(size=train.parallel.gpus, rank=rank, mesh=mesh)
        if train.parallel.pp > 1:
            world.mesh = mesh["dp_shard"] if dp > 1 else None
            world.pp_mesh = mesh["pp"] if len(shape) > 1 else mesh
            world.tp_mesh = mesh["tp"] if tp > 1 else None
        elif tp > 1:
            world.mesh = mesh["dp"] if dp > 1 else None
            world.tp_mesh = mesh["tp"]
        with contextlib.ExitStack() as stack:
            stack.enter_context(unrecorded_propagation())
            stack.enter_context(addresses)
            if train.parallel.fsdp1_cpu_offload:
                stack.enter_context(cpu_stream_sync())
            if tp > 1:  # DTensor under the capture's shape env (emulate.tensor_parallel)
                stack.enter_context(unguarded_propagation())
                stack.enter_context(real_mesh_concatenation())
            yield world
    finally:
        dist.destroy_process_group()


def parallelize(
    model: nn.Module, blocks: list[nn.Module], train: TrainSpec, world: World, target: str = "cpu"
) -> nn.Module:
    """Wrap `model` as `train.parallel.sharding` says (module docstring), its linears split
    first where `--tp` > 1 (`emulate.tensor_parallel`); returns what to call. `target`
    ("cpu"/"cuda"): where CPU offload's host-device copies are made (`emulate.fsdp_offload`)."""
    if train.parallel.pp > 1:  # the rank's stage(s) (emulate.pipeline)
        # TP, then FSDP2 over the stage's data-parallel ranks, on each model part (its own
        # root), as torchtitan's parallelize runs on every model part of a pipeline rank
        for part in model if isinstance(model, StageParts) else [model]:
            inside = {id(m) for m in part.modules()}
            own = [b for b in blocks if id(b) in inside]
            if train.parallel.tp > 1:
                apply_tp(part, own, world.tp_mesh, train.parallel.tp)
            if train.parallel.sharding == "fsdp":
                _fsdp2(part, own, train, world, target)
        return model
    if train.parallel.tp > 1:
        apply_tp(model, blocks, world.tp_mesh, train.parallel.tp)
        if train.parallel.sharding == "none":
            return model
    if train.parallel.sharding in ("ddp", "zero1"):
        return _ddp(model, world)
    if train.parallel.sharding == "fsdp1":
        return fsdp1_wrap(model, blocks, train, world, target)
    return _fsdp2(model, blocks, train, world, target)


def _fsdp2(
    model: nn.Module, blocks: list[nn.Module], train: TrainSpec, world: World, target: str
) -> nn.Module:
    """FSDP2's `fully_shard` on every block, then on `model` (module docstring)."""
    from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

    if not blocks:
        raise ValueError(
            f"--sharding {train.parallel.sharding}: the model has no repeated blocks to shard "
            "(fully_shard is applied per block, then to the root)"
        )
    reshard = train.parallel.reshard_after_forward and train.parallel.sharding != "zero2"
    # accelerate leaves 4-bit codes in uint8 storage out of fully_shard (they would lose
    # their quant state): every rank keeps them whole; a float storage is sharded
    ignored = {
        m.weight
        for m in model.modules()
        if isinstance(m, Linear4bitSim) and not m.weight.is_floating_point()
    }
    kw: dict[str, Any] = {"ignored_params": ignored} if ignored else {}
    policy = mp_policy(train)
    if policy is not None:
        kw["mp_policy"] = policy
    if train.parallel.fsdp_cpu_offload:  # pinned: marked below (no accelerator needed)
        kw["offload_policy"] = CPUOffloadPolicy(pin_memory=False)
    for block in blocks:
        fully_shard(block, mesh=world.mesh, reshard_after_forward=reshard, **kw)
    fully_shard(model, mesh=world.mesh, reshard_after_forward=reshard, **kw)
    if train.parallel.sharding == "zero2":
        model.set_reshard_after_backward(False)  # parameters stay whole (see docstring)
    if train.parallel.fsdp_cpu_offload:
        fsdp2_offload_places(model, target)
    return model


def mp_policy(train: TrainSpec) -> Any:
    """FSDP2's `MixedPrecisionPolicy(param_dtype, reduce_dtype)` from `--fsdp-param-dtype`
    / `--fsdp-reduce-dtype` (None where both are none: the parameters' own dtype)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    p = train.parallel
    param, reduce = _DTYPES.get(p.fsdp_param_dtype), _DTYPES.get(p.fsdp_reduce_dtype)
    if param is None and reduce is None:
        return None
    return MixedPrecisionPolicy(param_dtype=param, reduce_dtype=reduce)


class _NoBucketRebuild:
    """DDP's reducer, except that its one-time bucket rebuild reports 'not rebuilt'."""

    def __init__(self, reducer: Any):
        self._reducer = reducer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._reducer, name)

    def _rebuild_buckets(self) -> bool:
        return False


def _ddp(model: nn.Module, world: World) -> nn.Module:
    from torch.nn.parallel import DistributedDataParallel

    skip = "torch.nn.parallel.distributed._verify_param_shape_across_processes"
    with mock.patch(skip, lambda *a, **k: None):
        ddp = DistributedDataParallel(model)
    size = world.size

    def allreduce(state, bucket):  # unannotated: DDP checks annotations it cannot read here
        buf = bucket.buffer()
        buf.div_(size)
        return dist.all_reduce(buf, async_op=True).get_future().then(lambda _: buf)

    ddp.register_comm_hook(None, allreduce)
    ddp.reducer = _NoBucketRebuild(ddp.reducer)
    return ddp


def zero_optimizer(params: list[nn.Parameter], make: Callable[..., Any]) -> Any:
    """ZeRO-1: `ZeroRedundancyOptimizer` over `make`'s optimizer class and flags."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    probe = make([torch.nn.Parameter(torch.empty(0))])
    cls, flags = type(probe), dict(probe.defaults)
    for key in ("differentiable", "decoupled_weight_decay"):
        flags.pop(key, None)
    return ZeroRedundancyOptimizer(params, optimizer_class=cls, **flags)


def _fsdp_params(model: nn.Module) -> Iterator[Any]:
    """Every `FSDPParam` of the FSDP2 modules in `model`."""
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            group = module._get_fsdp_state()._fsdp_param_group
            yield from group.fsdp_params if group is not None else ()


@contextlib.contextmanager
def gradient_sync(model: nn.Module, train: TrainSpec, last: bool) -> Iterator[None]:
    """One micro-step's forward and backward, synced or not (see the module docstring):
    unsynced where `train.parallel.grad_sync == "last"` and this is not the last micro-step."""
    sync = last or train.parallel.grad_sync == "every" or train.parallel.sharding == "none"
    if train.parallel.sharding in ("ddp", "zero1", "fsdp1"):
        with contextlib.nullcontext() if sync else model.no_sync():
            yield
        return
    if train.parallel.sharding != "none" and train.parallel.grad_sync != "every":
        model.set_requires_gradient_sync(sync)
    yield


def unsharded_gradients(model: nn.Module) -> list[torch.Tensor]:
    """The unsharded gradients FSDP2 keeps between unsynced micro-steps."""
    out = []
    for fp in _fsdp_params(model):
        unsharded = getattr(fp, "_unsharded_param", None)
        for g in (
            getattr(fp, "unsharded_accumulated_grad", None),
            getattr(unsharded, "grad", None),
        ):
            if g is not None:
                out.append(g)
    return out


def resident_tensors(model: nn.Module) -> list[torch.Tensor]:
    """Unsharded FSDP2 parameters still allocated between steps (zero2 keeps them)."""
    from torch.distributed.fsdp import FSDPModule

    out = []
    for module in model.modules():
        if not isinstance(module, FSDPModule):
            continue
        group = module._get_fsdp_state()._fsdp_param_group
        for fp in group.fsdp_params if group is not None else ():
            for t in getattr(fp, "all_gather_outputs", ()):
                if t.untyped_storage().nbytes() > 0:
                    out.append(t)
    return out


def _buffers(args: tuple, index: int) -> list[torch.Tensor]:
    """The tensor(s) at `args[index]` of a c10d op (a tensor or a list of them)."""
    got = args[index]
    return list(got) if isinstance(got, (list, tuple)) else [got]


def comm_hooks(gloo: bool = False) -> dict[Any, Callable]:
    """Recorder hooks that run c10d collectives and mark their buffers `comm`: all-gather
    outputs, reduce-scatter inputs, all-reduce buffers (DDP buckets; HSDP's all-reduce of
    gradient shards is re-marked `gradient` when backward ends), and the outputs of the
    functional collectives DTensor runs under `--tp` (a rowwise linear's all-reduced
    output, a colwise linear's all-reduced input gradient).

    `gloo` (a CPU target): the gloo backend stages a copy of the buffer inside the op (its
    all-gather gathers into a temporary of the output's size, its reduce-scatter clones
    the input and all-reduces it), allocated and freed within the collective: the node's
    scratch. NCCL keeps its staging outside PyTorch's allocator: none on a CUDA target."""
    c10d, funcol = torch.ops.c10d, torch.ops._c10d_functional
    staged = {c10d._allgather_base_.default, c10d._reduce_scatter_base_.default}
    functional = (  # out of place (DTensor's redistributions under --tp): the output
        funcol.all_reduce.default,
        funcol.all_gather_into_tensor.default,
        funcol.reduce_scatter_tensor.default,
    )
    which = {  # op -> the argument holding its buffer(s)
        c10d._allgather_base_.default: 0,  # output
        c10d.allgather_into_tensor_coalesced_.default: 0,
        c10d._reduce_scatter_base_.default: 1,  # input
        c10d.reduce_scatter_tensor_coalesced_.default: 1,
        c10d.allreduce_.default: 0,  # in place
    }

    def make(part: int) -> Callable:
        def hook(rec: StepRecorder, func: Any, args: tuple, kwargs: dict) -> Any:
            out = func(*args, **kwargs)
            node = rec.record_op(str(func).removeprefix("aten."), (args, kwargs), out)
            rec.categorize(_buffers(args, part), "comm")
            if gloo and func in staged:
                node.scratch = sum(t.numel() * t.element_size() for t in _buffers(args, part))
            return out

        return hook

    def output(rec: StepRecorder, func: Any, args: tuple, kwargs: dict) -> Any:
        out = func(*args, **kwargs)
        rec.record_op(str(func).removeprefix("aten."), (args, kwargs), out)
        rec.categorize([out], "comm")
        return out

    return {op: make(part) for op, part in which.items()} | dict.fromkeys(functional, output)


class ShardedObserver(RecorderObserver):
    """A `RecorderObserver` for one rank: unsharded FSDP parameters are `parameter` (not
    `activation`, though forward allocates them); gradients are the local shards of DTensor
    grads, and `gradient` even where a collective ran on them (HSDP all-reduce)."""

    def __init__(self, recorder: StepRecorder, model: nn.Module, **kwargs: Any):
        super().__init__(recorder, **kwargs)
        self.model = model

    def on_phase(self, phase: str, step: int, micro: int) -> None:
        self.rec.categorize(resident_tensors(self.model), "parameter")
        super().on_phase(phase, step, micro)

    def on_backward_end(self, model: nn.Module, step: int, micro: int) -> None:
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        grads += [*unsharded_gradients(model), *fsdp1_gradients(model)]
        self.rec.categorize(grads, "gradient", force=True)

    def on_optimizer_end(self, optimizer: Any, step: int) -> None:
        super().on_optimizer_end(getattr(optimizer, "optim", optimizer), step)


def rank_note(train: Mapping[str, Any]) -> dict[str, Any] | None:
    """What a sharded answer is: one rank's peak (rank 0 of `world_size`); None for a
    single-GPU step (`train` is a graph's `train` dict)."""
    sharding = train.get("sharding", "none")
    if sharding == "none" and train.get("tp", 1) == 1 and train.get("pp", 1) == 1:
        return None
    spec = TrainSpec.of(**{k: v for k, v in train.items() if k in BY_NAME})
    return (
        {
            "per_rank": True,
            "rank": 0,
            "world_size": spec.parallel.gpus,
            "sharding": sharding,
            "shard_group_size": spec.parallel.shard_group_size,
            "fsdp_reshard_after_forward": spec.parallel.reshard_after_forward,
        }
        | ({"fsdp_cpu_offload": True} if spec.parallel.fsdp_cpu_offload else {})
        | (_fsdp1_note(spec) if sharding == "fsdp1" else {})
        | (
            {n: getattr(spec.parallel, BY_NAME[n].field) for n in MP_POLICY_OPTIONS}
            if sharding in ("fsdp", "hsdp")
            else {}
        )
        | (tp_note(spec) if spec.parallel.tp > 1 else {})
        | (pp_note(spec) if spec.parallel.pp > 1 else {})
    )


def _fsdp1_note(spec: TrainSpec) -> dict[str, Any]:
    """FSDP1's arguments as the answer ran them (`fsdp1_*`, `fsdp_*_dtype` options)."""
    return {o.name: getattr(spec.parallel, o.field) for o in OPTIONS_FSDP1}


def annotate(
    breakdown: dict[str, Any], train: Mapping[str, Any], paths: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """`breakdown` with `parallel` (see `rank_note`) where the step is sharded; under `--pp`
    with the answer's `paths` (one per stage): every stage's peak and the worst stage, the
    rank the answer is about."""
    note = rank_note(train)
    if note is not None:
        note |= _stage_peaks(paths or [])
        breakdown["parallel"] = note
    return breakdown


def worst_stage(peaks: list[int]) -> int:
    """The stage with the largest peak (the first of equals), of peaks by stage."""
    return max(range(len(peaks)), key=lambda k: (peaks[k], -k))


def _stage_peaks(paths: list[dict[str, Any]]) -> dict[str, Any]:
    """{stage_peak_bytes, worst_stage, rank, rank_stages} from the per-rank paths of a
    pipeline (`emulate.pipeline`): path k is pipeline rank k (global rank k x dp x tp
    composed with fsdp / tp: `rank` is the worst's), holding stage k (or stages k, k + pp,
    ... under an interleaved schedule)."""
    peaks: dict[int, int] = {}
    held: dict[int, list[int]] = {}
    ranks: dict[int, int] = {}
    for p in paths:
        cond = next((c for c in p["conditions"] if c.get("kind") == "pipeline_stage"), None)
        value = p.get("predicted_peak_bytes", p.get("tensor_peak_bytes"))
        if cond is None or value is None:
            return {}
        peaks[cond["stage"]] = int(value)
        held[cond["stage"]] = list(cond.get("stages", [cond["stage"]]))
        ranks[cond["stage"]] = int(cond.get("rank", cond["stage"]))
    if not peaks:
        return {}
    stages = sorted(peaks)
    by_stage = [peaks[k] for k in stages]
    worst = stages[worst_stage(by_stage)]
    return {"stage_peak_bytes": by_stage, "worst_stage": worst,
            "rank": ranks[worst], "rank_stages": [held[k] for k in sorted(held)]}  # fmt: skip
