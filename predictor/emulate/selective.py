"""torchtitan's op-level selective activation checkpointing (`--checkpointing selective-op`).

torchtitan (`activation_checkpoint.mode = "selective"`, `selective_ac_option = "op"`) wraps
each transformer block in `torch.utils.checkpoint` with `context_fn =
create_selective_checkpoint_contexts(policy)`: PyTorch's own selective checkpointing (SAC),
whose forward dispatch mode keeps the output of every op the policy marks MUST_SAVE and
whose recomputation in backward replays the rest. memgnn runs the same: `checkpoint(block,
use_reentrant=False, context_fn=...)` around each block's forward, with torchtitan's policy
(pytorch/torchtitan @ cfb9326 torchtitan/distributed/activation_checkpoint.py `_apply_op_sac`
and torchtitan/models/llama3/infra/parallelize.py `_op_sac_save_list`):

- save the outputs of the ops in `SAVE_LIST` (matmuls, the SDPA kernels, `max`, the
  functional reduce-scatter and all-to-all, flex attention),
- except every second `aten.mm` of a block's forward (a counter per checkpointed call,
  restarted by each `context_fn()`; the recomputation counts its own): a Llama block's
  q, v, gate and down projections are saved, k, o and up recomputed,
- device-to-host copies (`_to_copy` to the CPU of a CUDA tensor) always saved,
- everything else recomputed in backward.

The saved outputs live in SAC's cache from the block's forward until its recomputation in
backward hands them back; recorded node for node as any other storage. Not modelled:
`per_op_sac_force_recompute_mm_shapes_by_fqns` (torchtitan's default names only MoE routers,
`moe.router.gate`, which dense models do not have).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["SAVE_LIST", "op_sac_context_fn"]

_NAMES = (  # torchtitan's _op_sac_save_list, as op names (a torch without one skips it)
    "aten.mm.default",
    "aten._scaled_dot_product_efficient_attention.default",
    "aten._scaled_dot_product_flash_attention.default",
    "aten._scaled_dot_product_cudnn_attention.default",
    "aten._scaled_dot_product_attention_math.default",
    "aten._scaled_dot_product_fused_attention_overrideable.default",
    "_c10d_functional.reduce_scatter_tensor.default",
    "_c10d_functional.all_to_all_single.default",
    "aten.max.default",  # float8's amax: its scale is computed from it
)


def _resolve(name: str) -> Any:
    ns, op, overload = name.split(".")
    packet = getattr(getattr(torch.ops, ns), op, None)
    return getattr(packet, overload, None) if packet is not None else None


def _save_list() -> frozenset[Any]:
    ops = {_resolve(n) for n in _NAMES}
    hop = getattr(torch._higher_order_ops, "flex_attention", None)
    return frozenset(o for o in (*ops, hop) if o is not None)


SAVE_LIST: frozenset[Any] = _save_list()
_MM = torch.ops.aten.mm.default
_TO_COPY = torch.ops.aten._to_copy.default


def _policy(meta: dict[str, int]) -> Callable[..., Any]:
    from torch.utils.checkpoint import CheckpointPolicy

    def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
        if (
            func == _TO_COPY
            and "cuda" in str(args[0].device)
            and str(kwargs.get("device")) == "cpu"
        ):
            return CheckpointPolicy.MUST_SAVE
        key = "recompute_mm_count" if ctx.is_recompute else "forward_mm_count"
        if func == _MM:
            meta[key] += 1
        save = func in SAVE_LIST and not (func == _MM and meta[key] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if save else CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def op_sac_context_fn() -> Any:
    """A `context_fn` for `torch.utils.checkpoint.checkpoint`: a fresh mm counter and
    PyTorch's selective-checkpoint contexts around torchtitan's policy, per call."""
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    return create_selective_checkpoint_contexts(_policy(defaultdict(int)))
