"""FSDP's CPU offload of parameters, as a CUDA job places its tensors, on any tensors.

FSDP1 `CPUOffload(offload_params=True)` (`--fsdp1-cpu-offload true`) and FSDP2
`CPUOffloadPolicy()` (`--fsdp-cpu-offload true`) keep each rank's parameter shards, their
gradient shards and so the optimizer and its state on the host; the GPU holds the
all-gathered unsharded parameters of the units in use, their unsharded gradients until
reduce-scattered, and the activations. memgnn runs the real wrappers (`emulate.fsdp1`,
`emulate.parallel`) with these settings; capture's tensors all sit on one (fake) CPU device,
so this module says where each storage lives (`recorder.placed` / `mark_place`):

- host, pinned: FSDP1's `flat_param._local_shard` and `_cpu_grad` (made at wrap time,
  `.pin_memory()`); FSDP2's `_sharded_param_data` and the sharded gradient it copies to the
  CPU after each reduce-scatter (`CPUOffloadPolicy(pin_memory=True)`, its default);
- host, pageable: the optimizer's state and its step's temporaries (`HostOptimizer`: the
  step runs on the host shards, with what PyTorch picks for CPU tensors: the for-loop
  implementation of torch.optim's Adam/AdamW/SGD);
- device: everything else (unsharded parameters, FSDP1's device gradient shard kept until
  backward ends, reduce-scatter buffers, activations).

On a CUDA target the copies a GPU run makes between the two, which are no-ops on a CPU
device (`tensor.to(device)` returns the tensor itself), are made explicitly on the device:
FSDP1's pre-unshard H2D copy of the shard (`flat_param_to(device)`, or the full-precision
staging copy of `_use_low_precision_shard` under MixedPrecision) and FSDP2's H2D copy of
each shard in its all-gather inputs; FSDP2's D2H copy of each gradient shard gets a pinned
host tensor of its own (the device reduce-scatter output is freed with it). A real CPU run
cannot pin memory without an accelerator: `unpinned()` makes `pin_memory()` the identity
while the wrapper is built (the bytes are the same), and `cpu_stream_sync()` gives
torch.cpu.Stream the `synchronize()` FSDP1's offload path calls.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import torch
from memgnn.predictor.ir.recorder import mark_place, placed
from torch import nn

__all__ = [
    "HostOptimizer",
    "cpu_stream_sync",
    "fsdp1_offload_places",
    "fsdp2_offload_places",
    "offload_warnings",
    "offloads_params",
    "unpinned",
]


def offloads_params(train: Any) -> bool:
    """Whether `train` (a TrainSpec) keeps the sharded parameters on the host."""
    p = train.parallel
    return (p.sharding == "fsdp1" and p.fsdp1_cpu_offload) or (
        p.sharding == "fsdp" and p.fsdp_cpu_offload
    )


def offload_warnings(train: Any) -> list[str]:
    """What an answer under FSDP CPU offload assumes (`train`: a TrainSpec, or None)."""
    if train is None or not offloads_params(train):
        return []
    flag = "--fsdp1-cpu-offload" if train.parallel.sharding == "fsdp1" else "--fsdp-cpu-offload"
    return [
        f"{flag}: the predicted peak is the GPU's; each rank's parameter shards and their "
        "gradients (pinned) and the optimizer state (pageable) are host memory, given apart "
        "in the breakdown (host_pinned_peak_bytes, host_pageable_peak_bytes, host_peak_bytes) "
        "by --method replay or analytic (the learned route gives the device figure only)",
        f"{flag}: the optimizer steps the host shards on the CPU with what PyTorch picks for "
        "CPU tensors; each unit's shard is copied to the GPU for its all-gather (freed once "
        "gathered) and each gradient shard copied to the host after its reduce-scatter, as "
        "issued (the copies' stream timing is not modelled)",
    ]


@contextlib.contextmanager
def unpinned() -> Iterator[None]:
    """`Tensor.pin_memory()` returns the tensor itself (same bytes, no accelerator needed;
    the storage is marked pinned by the caller)."""
    original = torch.Tensor.pin_memory
    torch.Tensor.pin_memory = lambda self, *a, **k: self  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.Tensor.pin_memory = original  # type: ignore[method-assign]


@contextlib.contextmanager
def cpu_stream_sync() -> Iterator[None]:
    """`torch.cpu.Stream.synchronize()` as a no-op (CPU work is synchronous): FSDP1's
    post-backward callback calls it on its compute device's stream under CPU offload, and
    torch.cpu.Stream has none (a real CPU run fails there too)."""
    cls = torch.cpu.Stream
    added = not hasattr(cls, "synchronize")
    if added:
        cls.synchronize = lambda self: None  # type: ignore[attr-defined]
    try:
        yield
    finally:
        if added:
            del cls.synchronize  # type: ignore[attr-defined]


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage()._cdata == b.untyped_storage()._cdata


def fsdp1_offload_places(handles: list[Any], target: str) -> None:
    """Mark FSDP1's host shards pinned once it makes them (its lazy initialisation, in the
    first forward); on a CUDA target make each handle copy its shard to the device before
    the all-gather, as `pre_unshard` does on a GPU (module docstring)."""
    for handle in handles:
        handle.init_flat_param_attributes = functools.partial(
            _init_attributes, handle, handle.init_flat_param_attributes
        )
        if target == "cuda":
            handle.pre_unshard = functools.partial(_pre_unshard, handle, handle.pre_unshard)
            handle._use_low_precision_shard = functools.partial(
                _low_precision_shard, handle, handle._use_low_precision_shard
            )


def _init_attributes(handle: Any, original: Any) -> None:
    """`FlatParamHandle.init_flat_param_attributes` with offload: `_local_shard` and
    `_cpu_grad` are pinned host tensors."""
    with unpinned():
        original()
    flat = handle.flat_param
    mark_place([flat._local_shard, flat._cpu_grad], "pinned")


def _pre_unshard(handle: Any, original: Any) -> bool:
    """`FlatParamHandle.pre_unshard` with offload: `flat_param_to(device)` copies the host
    shard to the GPU (a new tensor; freed once the all-gather has used it)."""
    flat = handle.flat_param
    on_host = _same_storage(flat, flat._local_shard)
    ran = original()
    if on_host and _same_storage(flat, flat._local_shard):
        flat.data = flat.data.clone()  # the H2D copy
        if handle._use_orig_params:
            handle._use_sharded_views()
        ran = True
    return ran


def _low_precision_shard(handle: Any, original: Any) -> None:
    """`_use_low_precision_shard` with offload: `_local_shard.to(device)` stages a
    full-precision device copy of the host shard for the cast into `_mp_shard`."""
    staged = handle.flat_param._local_shard.clone()
    original()
    del staged


def fsdp2_offload_places(model: nn.Module, target: str) -> None:
    """Mark FSDP2's host shards pinned; on a CUDA target copy each shard to the device for
    its all-gather and each reduce-scattered gradient to a pinned host tensor."""
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if not isinstance(module, FSDPModule):
            continue
        group = module._get_fsdp_state()._fsdp_param_group
        if group is None:
            continue
        for fp in group.fsdp_params:
            mark_place([fp._sharded_param_data], "pinned")
        if target == "cuda":
            group.post_backward = functools.partial(_post_backward, group, group.post_backward)


def _post_backward(group: Any, original: Any, *args: Any, **kwargs: Any) -> Any:
    """FSDP2's post-backward with offload: each new gradient shard (a view of the device
    reduce-scatter output on a CPU device) becomes a pinned host copy, as
    `new_sharded_grad.to("cpu")` makes on a GPU; the device output goes with its views."""
    before = {id(fp): fp.sharded_param.grad for fp in group.fsdp_params}
    out = original(*args, **kwargs)
    for fp in group.fsdp_params:
        grad = fp.sharded_param.grad
        if grad is None or grad is before[id(fp)]:  # none, or accumulated into the host one
            continue
        with placed("pinned"):
            host = grad._local_tensor.clone()
        fp.sharded_param.grad = fp.to_sharded_dtensor(host)
    return out


class HostOptimizer:
    """An optimizer over host-resident parameter shards: its step runs on the CPU (state
    and temporaries pageable host memory). `optim` is the wrapped torch.optim optimizer."""

    def __init__(self, optim: torch.optim.Optimizer):
        self.optim = optim

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        with placed("pageable"):
            out = self.optim.step(closure)
        state = [v for s in self.optim.state.values() for v in s.values()]
        mark_place([v for v in state if isinstance(v, torch.Tensor)], "pageable")
        return out

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optim.zero_grad(set_to_none=set_to_none)

    @property
    def param_groups(self) -> list[dict]:
        return self.optim.param_groups

    @property
    def state(self) -> Any:
        return self.optim.state
