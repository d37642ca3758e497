"""The plan's search space: what a user can change, the valid combinations of it, the
capture each needs, and the relative cost of each (see `predictor.plan.search`)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from memgnn.predictor.ir.vocab import SEARCH_MODES, SHARDINGS
from memgnn.predictor.spec.choices import (
    OFFLOAD_ACTIVATIONS,
    OPTIMIZER_IMPLS,
    PP_SCHEDULES,
    PRECISIONS,
)
from memgnn.predictor.spec.train import TrainSpec

__all__ = [
    "SearchSpace",
    "capture_key",
    "capture_spec",
    "cost",
    "layouts",
    "offload_cost",
    "pp_cost",
    "tp_cost",
    "variants",
    "work_share",
]

log = logging.getLogger(__name__)

# Relative cost of a precision (1.0 = fp32 / AMP, the numerics users start from).
PRECISION_COST = {"fp32": 1.0, "amp-bf16": 1.0, "amp-fp16": 1.05, "bf16": 1.1, "fp16": 1.2}
RECOMPUTE_COST = 1.0 / 3.0  # a full extra forward pass ~ a third of a training step
# Tie-breaking priors, not measurements: the optimizer update is a small share of a step;
# fused is one kernel per group, foreach a few per group, for-loop a few per tensor.
IMPL_COST = {"fused": 0.99, "foreach": 1.0, "auto": 1.0, "for-loop": 1.02}
# Communication volume per step relative to DDP's all-reduce (ZeRO paper, Rajbhandari et
# al. 2020, sec. 7: ZeRO-1/2 move as much as DDP, ZeRO-3 1.5x: an extra parameter
# all-gather in backward; FSDP without resharding after forward skips it), times the
# share of a step that communication is assumed to leave exposed.
COMM_VOLUME = {"none": 0.0, "ddp": 1.0, "zero1": 1.0, "zero2": 1.0, "zero3": 1.5, "fsdp": 1.5,
               "hsdp": 1.5, "fsdp1": 1.5}  # fmt: skip
EXPOSED_COMM = 0.05
# Activation offloading (predictor/emulate/offload.py) moves every offloaded byte over PCIe
# twice: to the host in forward, back in backward. Priors, not measurements of the user's
# machine: pinned host<->device copies reach ~25 GB/s on PCIe 4.0 x16 (32 GB/s per
# direction in theory; what CUDA's bandwidthTest sample shows on A100 PCIe hosts), and a
# training step computes ~6 x parameters x tokens FLOPs (Kaplan et al. 2020, C = 6ND) at
# 40% of an A100's 312 TFLOP/s dense bf16. save_on_cpu copies on the compute stream (the
# copy time adds to the step); torchtune's OffloadActivations copies on a side stream,
# hidden behind compute until the copies take longer than it.
PCIE_BYTES_PER_S = 25e9
TRAIN_FLOPS_PER_S = 0.4 * 312e12
# Tensor parallelism (Megatron's layout, as PyTorch's ColwiseParallel/RowwiseParallel
# plans apply it): per layer and token, two all-reduces of the hidden state in forward and
# two in backward (sequence parallel: all-gathers and reduce-scatters of the same volume),
# each moving 2(t-1)/t x 2H bf16 bytes per rank on a ring, on the critical path (not
# overlapped). Against 72 H^2 / t FLOPs per rank per token and layer (6 x 12 H^2
# parameters), that is (t - 1) x TRAIN_FLOPS_PER_S / (4.5 x H x NVLINK_BYTES_PER_S) of a
# step. Priors, not measurements: 300 GB/s per direction is A100 NVLink 3. `layouts`
# keeps --tp within a node's NVLink domain (`NODE_GPUS`), as torchtitan and Megatron advise.
NVLINK_BYTES_PER_S = 300e9
NODE_GPUS = 8
DEFAULT_HIDDEN = 4096  # where the model's hidden size is unknown


@dataclass(kw_only=True, slots=True)
class SearchSpace:
    sizes: dict[str, int] = field(default_factory=dict)  # other dims, e.g. {"S": 1024}
    max_batch: int = 4096
    grad_accum: list[int] = field(default_factory=lambda: [1])
    checkpointing: list[str] = field(default_factory=lambda: ["none", "full"])
    precision: list[str] = field(default_factory=lambda: ["fp32"])
    effective_batch: int | None = None  # keep B*G at least this (G = ceil(E / B)), per rank
    mode: str = "binsearch"  # power | binsearch
    power_of_two: bool = True  # batch granularity for the result
    optimizer_impl: list[str] = field(default_factory=list)  # [] = the base spec's
    sharding: list[str] = field(default_factory=list)  # [] = the base spec's
    gpus: list[int] = field(default_factory=list)  # [] = the base spec's; 1 pairs with none
    offload_activations: list[str] = field(default_factory=list)  # [] = the base spec's
    # model-parallel layouts, [] = the base spec's: each (gpus, tp, pp) leaves gpus / (tp x
    # pp) data-parallel ranks, which take each sharding (none where there is one)
    tp: list[int] = field(default_factory=list)
    pp: list[int] = field(default_factory=list)
    pp_schedule: list[str] = field(default_factory=list)
    microbatches: list[int] = field(default_factory=list)  # 0: as many as --pp

    def __post_init__(self) -> None:
        if self.max_batch < 1:
            raise ValueError("max_batch must be >= 1")
        if not self.grad_accum or min(self.grad_accum) < 1:
            raise ValueError("grad_accum choices must be >= 1")
        for p in self.precision:
            if p not in PRECISIONS:
                raise ValueError(f"unknown precision {p!r} in search space")
        for c in self.checkpointing:
            TrainSpec.of(checkpointing=c)  # validates the form
        if self.mode not in SEARCH_MODES:
            raise ValueError(f"mode must be power or binsearch, got {self.mode!r}")
        if self.effective_batch is not None and self.effective_batch < 1:
            raise ValueError("effective_batch must be >= 1")
        for impl in self.optimizer_impl:
            if impl not in OPTIMIZER_IMPLS:
                raise ValueError(
                    f"unknown optimizer implementation {impl!r} in search space; expected "
                    f"one of {OPTIMIZER_IMPLS}"
                )
        for sharding in self.sharding:
            if sharding not in SHARDINGS:
                raise ValueError(f"unknown sharding {sharding!r} in search space ({SHARDINGS})")
        if any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in self.gpus):
            raise ValueError(f"gpus choices must be integers >= 1, got {self.gpus}")
        for name, lo in (("tp", 1), ("pp", 1), ("microbatches", 0)):
            values = getattr(self, name)
            if any(isinstance(n, bool) or not isinstance(n, int) or n < lo for n in values):
                raise ValueError(f"{name} choices must be integers >= {lo}, got {values}")
        for schedule in self.pp_schedule:
            if schedule not in PP_SCHEDULES:
                raise ValueError(
                    f"unknown pipeline schedule {schedule!r} in search space ({PP_SCHEDULES})"
                )
        for kind in self.offload_activations:
            if kind not in OFFLOAD_ACTIVATIONS:
                raise ValueError(
                    f"unknown activation offloading {kind!r} in search space; expected one "
                    f"of {OFFLOAD_ACTIVATIONS}"
                )


def tp_cost(tp: int, hidden: int | None) -> float:
    """Relative step cost of tensor parallelism over `tp` ranks (see NVLINK_BYTES_PER_S)."""
    h = hidden or DEFAULT_HIDDEN
    return 1.0 + (tp - 1) * TRAIN_FLOPS_PER_S / (4.5 * h * NVLINK_BYTES_PER_S)


def pp_cost(pp: int, microbatches: int, schedule: str) -> float:
    """Relative step time of a pipeline of `pp` stages: compute plus the bubble, (pp - 1)
    idle slots against `microbatches` busy ones per stage (GPipe and 1F1B; the
    interleaved and looped schedules run 2 stages per rank, halving it: Narayanan et al.
    2021, sec. 2.2). The zero-bubble schedules are given the interleaved figure."""
    if pp == 1:
        return 1.0
    stages = 1 if schedule in ("gpipe", "1f1b") else 2
    return 1.0 + (pp - 1) / (stages * microbatches)


def work_share(train: TrainSpec) -> float:
    """A rank's share of a step's compute per sample of B*G, in whole-model sample passes:
    the --tp ranks of a group split each sample's work, a --pp stage runs 1/pp of the
    model on each of its micro-batches. The plan's objective is B*G x this / cost."""
    p = train.parallel
    return (p.pp_microbatches if p.pp > 1 else 1) / (p.tp * p.pp)


def cost(train: TrainSpec, n_blocks: int | None = None, hidden: int | None = None) -> float:
    """Relative step cost of checkpointing, precision, optimizer implementation,
    communication and the model-parallel layout (1.0 = plain fp32 on one GPU, the
    optimizer PyTorch picks; `hidden`: the model's hidden size, for --tp)."""
    blocks = train.activations.checkpoint_blocks
    if blocks is None:
        recompute = 0.0
    elif n_blocks:
        recompute = RECOMPUTE_COST * len(train.activations.checkpointed(n_blocks)) / n_blocks
    else:  # every:N without the depth: one block in N
        recompute = RECOMPUTE_COST / (-blocks if blocks < -1 else 1)
    volume = COMM_VOLUME[train.parallel.sharding]
    if train.parallel.sharding in ("fsdp", "hsdp") and not train.parallel.reshard_after_forward:
        volume = 1.0
    keep = ("SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD_ZERO2")  # no all-gather in backward
    if train.parallel.sharding == "fsdp1" and train.parallel.fsdp1_strategy in keep:
        volume = 1.0
    comm = 1.0 + EXPOSED_COMM * volume
    p = train.parallel
    return (
        (1.0 + recompute)
        * PRECISION_COST[train.numerics.precision]
        * IMPL_COST[train.optim.impl]
        * comm
        * tp_cost(p.tp, hidden)
        * pp_cost(p.pp, p.pp_microbatches, p.pp_schedule)
    )


def offload_cost(kind: str, host_bytes: int, parameters: int, tokens: int) -> float:
    """Relative step cost of offloading `host_bytes` of activations (1.0 = none): copy time
    over compute time (see PCIE_BYTES_PER_S), added (save_on_cpu) or overlapped
    (torchtune). A step without parameters or tokens to compute costs what it copies."""
    if kind == "none" or host_bytes <= 0:
        return 1.0
    copy = 2 * host_bytes / PCIE_BYTES_PER_S
    compute = 6 * max(parameters, 1) * max(tokens, 1) / TRAIN_FLOPS_PER_S
    ratio = copy / compute
    return max(1.0, ratio) if kind == "torchtune" else 1.0 + ratio


def capture_spec(train: TrainSpec) -> TrainSpec:
    """The spec whose captured graph answers `train`: G >= 2 as G = 2 (the same graph)."""
    return train.with_options(grad_accum=min(train.loop.grad_accum, 2))


def capture_key(train: TrainSpec) -> str:
    """The key of the captured graph that answers `train` (its `capture_spec`'s options):
    configurations with the same key share one capture."""
    return repr(capture_spec(train).flat())


def _layouts(base: TrainSpec, space: SearchSpace) -> list[dict[str, Any]]:
    """The parallel options of each layout: the GPU count, --tp and --pp degrees (their
    product dividing the GPU count), the pipeline schedule and micro-batches, and the
    sharding of the data-parallel ranks left: none where there is one (one GPU, or all of
    them --tp x --pp ranks), each other sharding where there are several. Layouts the
    spec refuses (e.g. --pp with hsdp, not modelled) are left out by `variants`."""
    p = base.parallel
    out = []
    for n in sorted(set(space.gpus or [p.gpus])):
        for tp in sorted(set(space.tp or [p.tp])):
            for pp in sorted(set(space.pp or [p.pp])):
                if n % (tp * pp):
                    continue
                dp = n // (tp * pp)
                shardings = ["none"] if dp == 1 else [
                    s for s in dict.fromkeys(space.sharding or [p.sharding]) if s != "none"
                ]  # fmt: skip
                schedules = (space.pp_schedule or [p.pp_schedule]) if pp > 1 else [p.pp_schedule]
                micro = (space.microbatches or [p.microbatches]) if pp > 1 else [0]
                for sharding in shardings:
                    for schedule in dict.fromkeys(schedules):
                        for m in dict.fromkeys(micro):
                            out.append({"gpus": n, "tp": tp, "pp": pp, "sharding": sharding,
                                        "pp_schedule": schedule, "microbatches": m})  # fmt: skip
    return out


def layouts(gpus: int, blocks: int | None = None) -> dict[str, list[int]]:
    """The --tp and --pp degrees worth searching on `gpus` GPUs (`plan --layouts`): powers
    of two dividing it, --tp up to a node (`NODE_GPUS`), --pp up to the model's blocks
    (a stage holds one at least) and 16 stages. The micro-batches stay the base's (--pp
    where not given): more of them is more samples per step, which the user's global
    batch decides, not the memory."""
    twos = [1 << k for k in range(gpus.bit_length()) if gpus % (1 << k) == 0]
    most = min(16, blocks or 16)
    return {"tp": [t for t in twos if t <= NODE_GPUS], "pp": [p for p in twos if p <= most]}


def variants(
    base: TrainSpec, space: SearchSpace, refused: dict[str, str] | None = None
) -> list[TrainSpec]:
    """Every valid training configuration of the space (an invalid combination, e.g. hsdp
    on 2 GPUs, is left out; ValueError naming the first when none is valid). `refused`,
    where given, gets each reason the spec gave, with the first layout it refused."""
    out: list[TrainSpec] = []
    first_error: ValueError | None = None
    impls = space.optimizer_impl or [base.optim.impl]
    offloads = space.offload_activations or [base.offload.activations]
    for precision, offload in ((p, o) for p in space.precision for o in dict.fromkeys(offloads)):
        for ckpt in space.checkpointing:
            for impl in dict.fromkeys(impls):
                for layout in _layouts(base, space):
                    fsdp_like = layout["sharding"] in ("fsdp", "hsdp")
                    same = layout["gpus"] == base.parallel.gpus
                    for g in _accum_choices(space):
                        try:
                            out.append(
                                base.with_options(
                                    precision=precision,
                                    offload_activations=offload,
                                    checkpointing=ckpt,
                                    optimizer_impl=impl,
                                    **layout,
                                    fsdp_reshard_after_forward=(
                                        base.parallel.reshard_after_forward or not fsdp_like
                                    ),
                                    hsdp_shard_size=base.parallel.hsdp_shard_size if same else 0,
                                    grad_accum=g,
                                )
                            )
                        except ValueError as exc:
                            log.info("plan: leaving out %s", exc)
                            if refused is not None:
                                where = " ".join(f"{k}={v}" for k, v in layout.items())
                                refused.setdefault(str(exc).splitlines()[0], where)
                            first_error = first_error or exc
    if not out:
        raise ValueError(f"no valid configuration in the search space: {first_error}")
    return out


def _accum_choices(space: SearchSpace) -> Sequence[int]:
    # G = 1 and G >= 2 are different graphs; with a target effective batch G is derived.
    if space.effective_batch is not None:
        return [1, 2]
    return sorted(set(space.grad_accum))
