"""`--attention eager|sdpa|flash`: the attention kernel a Hugging Face model runs.

This is transformers' `attn_implementation`, set on the built model before its step runs
(transformers' attention layers and mask builders read `config._attn_implementation` at
every forward, so switching after `from_config` is the same as building with it):

- `eager`: transformers' own `eager_attention_forward`, which materialises the
  B x H x S x S scores, their fp32 softmax (kept for backward) and, with attention
  dropout, the dropout mask;
- `sdpa`: `F.scaled_dot_product_attention`; for a CUDA target capture routes it to the
  kernel PyTorch's dispatcher picks there (`predictor.emulate.kernels.cuda_sdpa`);
- `flash`: `flash_attention_2`, the flash-attn package, modelled by its kernels' outputs
  (`predictor.emulate.flash_attn`); CUDA targets of compute capability 8.0+ and fp16/bf16 compute.
- `auto`: what the model class builds with (sdpa where the class supports it).

Errors name the option: a model class without the kernel (`_supports_sdpa`,
`_supports_flash_attn`), a model that is not a transformers model, flash on a CPU target,
on a GPU before sm80, or in fp32.
"""

from __future__ import annotations

import contextlib
import logging

from memgnn.predictor.spec.train import TrainSpec
from torch import nn

__all__ = ["HF_NAMES", "apply_attention", "check_attention", "unpacked_positions"]

log = logging.getLogger(__name__)

HF_NAMES = {"eager": "eager", "sdpa": "sdpa", "flash": "flash_attention_2"}
_SUPPORT_FLAG = {"sdpa": "_supports_sdpa", "flash": "_supports_flash_attn"}


def check_attention(train: TrainSpec, target: str, sm: int | None = None) -> None:
    """ValueError naming --attention when the choice cannot run on the target."""
    if train.kernels.attention != "flash":
        return
    if target != "cuda":
        raise ValueError(
            "--attention flash (flash-attn's FlashAttention-2) runs on CUDA GPUs only; "
            "on a CPU target use --attention eager or sdpa"
        )
    if sm is not None and sm < 80:
        raise ValueError(
            f"--attention flash needs compute capability 8.0 or newer (FlashAttention-2); "
            f"the target has sm_{sm}: use --attention sdpa or eager"
        )
    if train.numerics.precision == "fp32":
        raise ValueError(
            "--attention flash runs fp16/bf16 only: use --precision bf16, fp16, amp-bf16 or "
            "amp-fp16 (in fp32 transformers passes fp32 tensors and flash-attn refuses them)"
        )


def _pretrained_models(model: nn.Module) -> list[nn.Module]:
    from transformers import PreTrainedModel

    return [m for m in model.modules() if isinstance(m, PreTrainedModel)]


def apply_attention(model: nn.Module, train: TrainSpec, *, fake: bool) -> str | None:
    """Set the model's attention implementation for `train.kernels.attention`; return the HF name
    in effect (None for a model without one). `fake`: the step runs on fake tensors, where
    flash-attn need not be installed (its kernels are stood in for by sizes)."""
    choice = train.kernels.attention
    config = getattr(model, "config", None)
    current = getattr(config, "_attn_implementation", None)
    if choice == "auto":
        return current
    if current is None:
        raise ValueError(
            f"--attention {choice}: {type(model).__name__} is not a Hugging Face transformers "
            "model (it has no attn_implementation); leave --attention at auto"
        )
    top = _pretrained_models(model)
    if not top:
        raise ValueError(f"--attention {choice}: {type(model).__name__} is not a PreTrainedModel")
    root = top[0]
    flag = _SUPPORT_FLAG.get(choice)
    if flag is not None and not getattr(root, flag, False):
        raise ValueError(
            f"--attention {choice}: {type(root).__name__} does not support "
            f"{HF_NAMES[choice]} in transformers ({flag} is False); choose another --attention"
        )
    if not type(root)._can_set_attn_implementation():
        raise ValueError(
            f"--attention {choice}: {type(root).__name__} cannot switch its attention "
            "implementation (it does not use transformers' AttentionInterface)"
        )
    wanted = HF_NAMES[choice]
    if choice == "flash" and fake:
        # transformers' checks import flash-attn and look for a GPU; under fake tensors the
        # kernels are `predictor.emulate.flash_attn`'s stand-ins, so set what those checks would
        for m in top:
            m.config._attn_implementation_internal = wanted
    else:
        root.set_attn_implementation(wanted)
    got = [m.config._attn_implementation for m in top]
    if any(g != wanted for g in got):
        raise ValueError(
            f"--attention {choice}: {type(root).__name__} kept attention {sorted(set(got))} "
            f"instead of {wanted}"
        )
    log.debug("%s: attention %s", type(root).__name__, wanted)
    return wanted


@contextlib.contextmanager
def unpacked_positions():
    """While active (a capture on fake tensors), transformers' packed-sequence check answers
    as it does on a real batch whose position ids are one arange per row.

    Without a KV cache (`use_cache=False`, or HF's gradient checkpointing, which turns it
    off) transformers' mask builders call `find_packed_sequence_indices(position_ids)`,
    which on real tensors returns None unless a row restarts its positions, but on fake
    tensors (`is_tracing`) returns the per-token sequence ids, so a fake run builds a full
    4-D mask a real step never builds (and SDPA then takes a masked kernel). memgnn's
    input makers never pack sequences (the model makes its own position ids), so the
    stand-in runs the real check's ops on the fake values and returns None."""
    try:
        from transformers import masking_utils
    except ImportError:  # pragma: no cover - depends on the environment
        yield
        return
    original = masking_utils.find_packed_sequence_indices

    def find_packed_sequence_indices(position_ids):
        seq_ids = original(position_ids)
        if seq_ids is not None:
            (seq_ids[:, -1] == 0).all()  # what the real check reads before returning None
        return None

    masking_utils.find_packed_sequence_indices = find_packed_sequence_indices
    try:
        yield
    finally:
        masking_utils.find_packed_sequence_indices = original
