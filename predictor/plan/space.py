"""The plan's search space: what a user can change, the valid combinations of it, the
capture each needs, and the relative cost of each (see `predictor.plan.search`)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from memgnn.predictor.ir.vocab import SEARCH_MODES, SHARDINGS
from memgnn.predictor.spec.choices import OFFLOAD_ACTIVATIONS, OPTIMIZER_IMPLS, PRECISIONS
from memgnn.predictor.spec.train import TrainSpec

__all__ = ["SearchSpace", "capture_spec", "cost", "offload_cost", "variants"]

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
        for kind in self.offload_activations:
            if kind not in OFFLOAD_ACTIVATIONS:
                raise ValueError(
                    f"unknown activation offloading {kind!r} in search space; expected one "
                    f"of {OFFLOAD_ACTIVATIONS}"
                )


def cost(train: TrainSpec, n_blocks: int | None = None) -> float:
    """Relative step cost of checkpointing, precision, optimizer implementation and
    communication (1.0 = plain fp32 on one GPU, the optimizer PyTorch picks)."""
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
    return (
        (1.0 + recompute)
        * PRECISION_COST[train.numerics.precision]
        * IMPL_COST[train.optim.impl]
        * comm
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


def _parallel_choices(base: TrainSpec, space: SearchSpace) -> list[tuple[int, str]]:
    """(gpus, sharding) pairs: one GPU runs unsharded; several take each sharding but none,
    and none too where they are the --tp or --pp ranks (tensor or pipeline parallelism
    alone)."""
    gpus = space.gpus or [base.parallel.gpus]
    shardings = space.sharding or [base.parallel.sharding]
    pairs = []
    for n in sorted(set(gpus)):
        if n == 1:
            pairs.append((1, "none"))
        else:
            tp_alone = n in (base.parallel.tp, base.parallel.pp)
            pairs += [(n, s) for s in dict.fromkeys(shardings) if s != "none" or tp_alone]
    return pairs


def variants(base: TrainSpec, space: SearchSpace) -> list[TrainSpec]:
    """Every valid training configuration of the space (an invalid combination, e.g. hsdp
    on 2 GPUs, is left out; ValueError naming the first when none is valid)."""
    out: list[TrainSpec] = []
    first_error: ValueError | None = None
    impls = space.optimizer_impl or [base.optim.impl]
    offloads = space.offload_activations or [base.offload.activations]
    for precision, offload in ((p, o) for p in space.precision for o in dict.fromkeys(offloads)):
        for ckpt in space.checkpointing:
            for impl in dict.fromkeys(impls):
                for n, sharding in _parallel_choices(base, space):
                    fsdp_like = sharding in ("fsdp", "hsdp")
                    for g in _accum_choices(space):
                        try:
                            out.append(
                                base.with_options(
                                    precision=precision,
                                    offload_activations=offload,
                                    checkpointing=ckpt,
                                    optimizer_impl=impl,
                                    gpus=n,
                                    sharding=sharding,
                                    fsdp_reshard_after_forward=(
                                        base.parallel.reshard_after_forward or not fsdp_like
                                    ),
                                    hsdp_shard_size=base.parallel.hsdp_shard_size
                                    if n == base.parallel.gpus
                                    else 0,
                                    grad_accum=g,
                                )
                            )
                        except ValueError as exc:
                            log.info("plan: leaving out %s", exc)
                            first_error = first_error or exc
    if not out:
        raise ValueError(f"no valid configuration in the search space: {first_error}")
    return out


def _accum_choices(space: SearchSpace) -> Sequence[int]:
    # G = 1 and G >= 2 are different graphs; with a target effective batch G is derived.
    if space.effective_batch is not None:
        return [1, 2]
    return sorted(set(space.grad_accum))
