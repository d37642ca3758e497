"""FSDP1: `torch.distributed.fsdp.FullyShardedDataParallel` as accelerate and the HF Trainer
run it, over the fake process group of `predictor.emulate.parallel`.

`--sharding fsdp1` wraps the model in PyTorch's own `FullyShardedDataParallel` (rank 0 of
`--gpus`), so its flat parameters, all-gathers, reduce-scatters, prefetching and mixed
precision are PyTorch's, recorded node for node:

- units: an auto-wrap policy as accelerate builds it: `blocks` = `transformer_auto_wrap_policy`
  over the repeated block class (`fsdp_transformer_layer_cls_to_wrap`); `peft` = peft's
  `fsdp_auto_wrap_policy` (the same, or every leaf module whose `weight` trains: each LoRA
  `lora_A`/`lora_B` its own unit), what the HF Trainer sets for a peft model and
  Answer.AI's fsdp_qlora uses; `auto` = `peft` under `--peft lora`, else `blocks`. The root
  takes what no unit took (embeddings, final norm, lm_head).
- each unit's parameters are flattened into one `FlatParameter` (one dtype, padded to a
  multiple of the shard group), sharded; rank 0 holds the first shard. With
  `use_orig_params=False` FSDP1 refuses a unit that mixes frozen and trainable weights
  (or dtypes); with `use_orig_params=True` it takes the mix and the flat parameter's
  sharded gradient spans every element, frozen ones included: the LoRA-under-FSDP1 cost.
- `sharding_strategy`, `backward_prefetch`, `forward_prefetch`, `limit_all_gathers` and
  the `MixedPrecision` policy are passed as given. `limit_all_gathers` throttles the CPU
  thread against CUDA events; memgnn records the program order of allocations, which it
  does not change, so the allocated answer is the same either way (on a GPU the flag
  bounds how far all-gather buffers run ahead of their frees: a reserved-memory effect).
- `cpu_offload`: `CPUOffload(offload_params=True)` where `--fsdp1-cpu-offload true`, its
  host shards and copies placed by `predictor.emulate.fsdp_offload`.

Fake tensors have no addresses (`data_ptr()` is 0 plus the offset), and FSDP1 compares
them: its post-backward catch-all reshard skips a unit whose flat parameter "already"
points at its local shard, and its writeback checks compare storages. `fake_addresses`
gives each fake storage its own address (its StorageImpl's), 0 once resized to nothing,
as a real allocation would, for the time FSDP1 runs.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Iterator
from typing import Any

import torch
from memgnn.predictor.emulate.fsdp_offload import fsdp1_offload_places
from memgnn.predictor.spec.train import TrainSpec
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor

__all__ = ["fake_addresses", "flat_handles", "fsdp1_gradients", "fsdp1_wrap", "wrap_policy"]

_STRATEGY = {"HYBRID_SHARD_ZERO2": "_HYBRID_SHARD_ZERO2"}  # accelerate's name -> the enum's
_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@contextlib.contextmanager
def fake_addresses() -> Iterator[None]:
    """`data_ptr()` of fake tensors and their storages: a distinct non-zero address per
    storage (0 when it holds no bytes), the tensor's offset added (see module docstring)."""
    storage_ptr = torch.UntypedStorage.data_ptr

    def untyped_data_ptr(storage: Any) -> int:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Accessing the data pointer of FakeTensor"
            ptr = storage_ptr(storage)
        if ptr or storage.nbytes() == 0:
            return ptr
        return storage._cdata  # a fake storage: its StorageImpl's address

    def tensor_data_ptr(self: torch.Tensor) -> int:
        base = untyped_data_ptr(self.untyped_storage())
        return base + self.storage_offset() * self.element_size() if base else 0

    torch.UntypedStorage.data_ptr = untyped_data_ptr  # type: ignore[method-assign]
    FakeTensor.data_ptr = tensor_data_ptr  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.UntypedStorage.data_ptr = storage_ptr  # type: ignore[method-assign]
        del FakeTensor.data_ptr


def _trainable_leaf(module: nn.Module) -> bool:
    """peft's `fsdp_auto_wrap_policy` lambda: a leaf module whose `weight` trains."""
    weight = getattr(module, "weight", None)
    return (
        len(list(module.named_children())) == 0
        and isinstance(weight, torch.Tensor)
        and weight.requires_grad
    )


def wrap_policy(blocks: list[nn.Module], train: TrainSpec) -> Any:
    """The auto-wrap policy `train.parallel.fsdp1_wrap` names (module docstring)."""
    from torch.distributed.fsdp.wrap import (
        _or_policy,
        lambda_auto_wrap_policy,
        transformer_auto_wrap_policy,
    )

    classes = {type(b) for b in blocks}
    by_class = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls=classes)
    wrap = train.parallel.fsdp1_wrap
    if wrap == "auto":
        wrap = "peft" if train.adapter.method == "lora" else "blocks"
    if wrap == "blocks":
        return by_class
    leaves = functools.partial(lambda_auto_wrap_policy, lambda_fn=_trainable_leaf)
    return functools.partial(_or_policy, policies=[leaves, by_class])


def _mixed_precision(train: TrainSpec) -> Any:
    from torch.distributed.fsdp import MixedPrecision

    p = train.parallel
    dtypes = {
        "param_dtype": _DTYPES.get(p.fsdp_param_dtype),
        "reduce_dtype": _DTYPES.get(p.fsdp_reduce_dtype),
        "buffer_dtype": _DTYPES.get(p.fsdp_buffer_dtype),
    }
    return MixedPrecision(**dtypes) if any(dtypes.values()) else None


def fsdp1_wrap(
    model: nn.Module, blocks: list[nn.Module], train: TrainSpec, world: Any, target: str = "cpu"
) -> nn.Module:
    """`FullyShardedDataParallel(model, ...)` with `train.parallel`'s FSDP1 arguments on
    `world`'s process group (2-D mesh for the HYBRID strategies). FSDP1's own refusals
    (a unit mixing dtypes, or frozen and trainable weights without use_orig_params) come
    back as a ValueError naming the options that change them. With CPU offload, `target`
    ("cpu" or "cuda") says whether the shards' host-device copies are made
    (`emulate.fsdp_offload`)."""
    from torch.distributed.fsdp import BackwardPrefetch, CPUOffload, ShardingStrategy
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    p = train.parallel
    if not blocks and p.fsdp1_wrap != "peft" and train.adapter.method != "lora":
        raise ValueError(
            "--sharding fsdp1: the model has no repeated blocks to wrap "
            "(transformer_auto_wrap_policy wraps each block, the root takes the rest)"
        )
    prefetch = p.fsdp1_backward_prefetch
    kwargs: dict[str, Any] = {
        "auto_wrap_policy": wrap_policy(blocks, train),
        "sharding_strategy": ShardingStrategy[_STRATEGY.get(p.fsdp1_strategy, p.fsdp1_strategy)],
        "backward_prefetch": None if prefetch == "NO_PREFETCH" else BackwardPrefetch[prefetch],
        "forward_prefetch": p.fsdp1_forward_prefetch,
        "limit_all_gathers": p.fsdp1_limit_all_gathers,
        "use_orig_params": p.fsdp1_use_orig_params,
        "mixed_precision": _mixed_precision(train),
        "device_id": torch.device("cpu"),
    }
    if p.hybrid:
        kwargs["device_mesh"] = world.mesh
    if p.fsdp1_cpu_offload:
        kwargs["cpu_offload"] = CPUOffload(offload_params=True)
    try:
        wrapped = FSDP(model, **kwargs)
    except ValueError as exc:
        if "integer dtype" in str(exc):
            hint = "store a 4-bit base's codes in a float dtype: --bnb-quant-storage bf16"
        else:
            hint = (
                "a unit flattens its weights into one parameter of one dtype, with "
                "--fsdp1-use-orig-params false also of one requires_grad: --fsdp1-wrap peft "
                "wraps every trainable leaf on its own, --fsdp1-use-orig-params true takes a "
                "frozen/trainable mix, --lora-dtype model keeps adapters in the model's dtype"
            )
        raise ValueError(
            f"--sharding fsdp1: FullyShardedDataParallel refuses this model: {exc} ({hint})"
        ) from exc
    if p.fsdp1_cpu_offload:
        fsdp1_offload_places(flat_handles(wrapped), target)
    return wrapped


def flat_handles(model: nn.Module) -> list[Any]:
    """Every `FlatParamHandle` of the FSDP1 units in `model`."""
    from torch.distributed.fsdp._traversal_utils import _get_fsdp_handles

    return list(_get_fsdp_handles(model))


def fsdp1_gradients(model: nn.Module) -> list[torch.Tensor]:
    """The gradients FSDP1 holds on its flat parameters: `.grad` (sharded, or unsharded
    under `no_sync`) and the sharded gradient it keeps aside while a synced backward
    accumulates onto an earlier one (`_saved_grad_shard`)."""
    out = []
    for handle in flat_handles(model):
        flat = handle.flat_param
        for g in (flat.grad, getattr(flat, "_saved_grad_shard", None)):
            if isinstance(g, torch.Tensor):
                out.append(g)
    return out
