"""The flash-attn package's FlashAttention-2 (HF `attn_implementation="flash_attention_2"`)
as sizes only, for captures on fake tensors.

flash-attn is a CUDA-only package that cannot be installed on a CPU machine, so a capture
for a CUDA target runs transformers' own flash path (`_flash_attention_forward`: dtype casts,
the (B, S, H, D) layout, dense or varlen dispatch) with the package's two entry points,
`flash_attn_func` and `flash_attn_varlen_func`, replaced by stand-ins here. Each runs
custom ops (`memgnn::flash_attn_fwd` / `_bwd` and their varlen twins) whose fake-tensor
rules give what flash-attn v2's kernels allocate (csrc/flash_attn/flash_api.cpp,
flash_attn/flash_attn_interface.py of Dao-AILab/flash-attention):

- forward: `out` like q (head dim padded to a multiple of 8 first, as the package does),
  `softmax_lse` fp32 (B, H, S_q) dense / (H, total_q) varlen, the 16-byte `rng_state`;
  all three and q, k, v are what the backward keeps;
- backward: dq, dk, dv like q, k, v, plus scratch freed inside the kernel: `softmax_d`
  fp32 (B, H, round128(S_q)) [varlen: (H, total_q + 128 B)], the fp32 `dq_accum`
  (B, round128(S_q), H, hd) [varlen: (total_q + 128 B, H, hd)] with hd the head dim
  rounded to 32 (<= 128) or 64, and for grouped-query attention dk/dv expanded to all H
  heads in q's dtype (`flash_scratch`).

Not modelled: the split-KV forward accumulators (used only when B x H x ceil(S/64) blocks
fill less than 80% of two per SM, i.e. tiny inference-sized batches), deterministic mode
(`FLASH_ATTENTION_DETERMINISTIC=1`: a ValueError), and flash-attn's own `unpad_input`
(the stand-in keeps transformers' `_unpad_input`, which the varlen path of padded batches
uses; memgnn's input makers pass no padding mask, so training batches take the dense path).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import torch

__all__ = ["flash_attn_func", "flash_attn_varlen_func", "flash_scratch", "hf_flash_kernels"]

log = logging.getLogger(__name__)

_LOW = (torch.float16, torch.bfloat16)


def _round_up(x: Any, m: int) -> Any:
    return (x + m - 1) // m * m


def _head_rounded(d: int) -> int:
    return _round_up(d, 32 if d <= 128 else 64)


def _no_kernel(name: str):
    raise NotImplementedError(
        f"{name} is memgnn's size-only stand-in for flash-attn (fake tensors); "
        "real runs need the flash-attn package"
    )


@torch.library.custom_op("memgnn::flash_attn_fwd", mutates_args=())
def _fwd(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, return_softmax: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    _no_kernel("memgnn::flash_attn_fwd")


@_fwd.register_fake
def _fwd_fake(q, k, v, return_softmax):
    b, s_q, h, _ = q.shape
    s_k = k.shape[1]
    lse = q.new_empty((b, h, s_q), dtype=torch.float32)
    p_shape = (b, h, _round_up(s_q, 128), _round_up(s_k, 128)) if return_softmax else (0,)
    return torch.empty_like(q), lse, q.new_empty(p_shape), q.new_empty((2,), dtype=torch.int64)


@torch.library.custom_op("memgnn::flash_attn_bwd", mutates_args=("dq", "dk", "dv"))
def _bwd(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    dq: torch.Tensor,
    dk: torch.Tensor,
    dv: torch.Tensor,
) -> None:
    _no_kernel("memgnn::flash_attn_bwd")


@_bwd.register_fake
def _bwd_fake(dout, q, k, v, out, lse, dq, dk, dv):
    return None


@torch.library.custom_op("memgnn::flash_attn_varlen_fwd", mutates_args=())
def _vfwd(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: int, return_softmax: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    _no_kernel("memgnn::flash_attn_varlen_fwd")


@_vfwd.register_fake
def _vfwd_fake(q, k, v, batch, return_softmax):
    total_q, h, _ = q.shape
    lse = q.new_empty((h, total_q), dtype=torch.float32)
    return torch.empty_like(q), lse, q.new_empty((2,), dtype=torch.int64)


@torch.library.custom_op("memgnn::flash_attn_varlen_bwd", mutates_args=("dq", "dk", "dv"))
def _vbwd(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    dq: torch.Tensor,
    dk: torch.Tensor,
    dv: torch.Tensor,
    batch: int,
) -> None:
    _no_kernel("memgnn::flash_attn_varlen_bwd")


@_vbwd.register_fake
def _vbwd_fake(dout, q, k, v, out, lse, dq, dk, dv, batch):
    return None


def flash_scratch(func: Any, args: tuple) -> Any:
    """Bytes the flash-attn backward kernel allocates and frees inside the op (else 0)."""
    if func is torch.ops.memgnn.flash_attn_bwd.default:
        q, k = args[1], args[2]
        b, s_q, h, d = q.shape
        s_q_r = _round_up(s_q, 128)
        nbytes = b * h * s_q_r * 4 + b * s_q_r * h * _head_rounded(d) * 4
        if k.shape[2] != h:  # GQA/MQA: dk, dv expanded to every query head, then summed
            nbytes += 2 * b * k.shape[1] * h * d * q.element_size()
        return nbytes
    if func is torch.ops.memgnn.flash_attn_varlen_bwd.default:
        q, k, batch = args[1], args[2], args[9]
        total_q, h, d = q.shape
        rows = total_q + 128 * batch
        nbytes = h * rows * 4 + rows * h * _head_rounded(d) * 4
        if k.shape[1] != h:
            nbytes += 2 * k.shape[0] * h * d * q.element_size()
        return nbytes
    return 0


def _pad8(t: torch.Tensor) -> torch.Tensor:
    d = t.shape[-1]
    return t if d % 8 == 0 else torch.nn.functional.pad(t, [0, 8 - d % 8])


def _last_dim_dense(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


class _FlashFunc(torch.autograd.Function):
    """flash-attn's FlashAttnFunc / FlashAttnVarlenFunc: pad, kernel, keep for backward."""

    @staticmethod
    def forward(ctx, q, k, v, batch, return_softmax):
        d = q.shape[-1]
        q, k, v = (_last_dim_dense(_pad8(t)) for t in (q, k, v))
        if batch is None:
            out, lse, p, rng = torch.ops.memgnn.flash_attn_fwd(q, k, v, return_softmax)
        else:
            out, lse, rng = torch.ops.memgnn.flash_attn_varlen_fwd(q, k, v, batch, return_softmax)
            p = None
        ctx.save_for_backward(q, k, v, out, lse, rng)
        ctx.batch, ctx.d = batch, d
        del p  # the softmax tensor is returned only with dropout > 0 and return_softmax
        return out[..., :d]

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, _rng = ctx.saved_tensors
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        dout = _last_dim_dense(_pad8(dout))
        if ctx.batch is None:
            torch.ops.memgnn.flash_attn_bwd(dout, q, k, v, out, lse, dq, dk, dv)
        else:
            torch.ops.memgnn.flash_attn_varlen_bwd(dout, q, k, v, out, lse, dq, dk, dv, ctx.batch)
        d = ctx.d
        return dq[..., :d], dk[..., :d], dv[..., :d], None, None


def _check(q: torch.Tensor, deterministic: bool, alibi_slopes: Any) -> None:
    if q.dtype not in _LOW:
        raise ValueError(
            f"FlashAttention-2 runs fp16/bf16 only, got {q.dtype}: use --precision "
            "bf16|fp16|amp-bf16|amp-fp16 with --attention flash"
        )
    if q.shape[-1] > 256:
        raise ValueError(f"FlashAttention-2 supports head dims <= 256, got {q.shape[-1]}")
    if deterministic:
        raise ValueError(
            "deterministic flash-attn (FLASH_ATTENTION_DETERMINISTIC=1) is not modelled"
        )
    if alibi_slopes is not None:
        log.debug("alibi slopes: an input of the kernel, no extra memory")


def flash_attn_func(
    q,
    k,
    v,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
):
    """flash-attn's dense entry point: q (B, S_q, H, D), k, v (B, S_k, H_k, D)."""
    _check(q, deterministic, alibi_slopes)
    return _FlashFunc.apply(q, k, v, None, bool(return_attn_probs and dropout_p > 0))


def flash_attn_varlen_func(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    block_table=None,
):
    """flash-attn's unpadded entry point: q (total_q, H, D) with cumulative lengths."""
    _check(q, deterministic, alibi_slopes)
    if block_table is not None:
        raise ValueError("paged flash attention (block_table) is inference-only; not modelled")
    batch = cu_seqlens_q.shape[0] - 1
    return _FlashFunc.apply(q, k, v, batch, bool(return_attn_probs and dropout_p > 0))


_GLOBALS = (
    "_loaded_implementation",
    "_flash_fn",
    "_flash_varlen_fn",
    "_flash_with_kvcache_fn",
    "_pad_fn",
    "_unpad_fn",
    "_process_flash_kwargs_fn",
    "_process_with_kvcache_kwargs_fn",
)


@contextlib.contextmanager
def hf_flash_kernels():
    """While active, transformers' `flash_attention_2` path calls the stand-ins above.

    transformers resolves flash-attn lazily (`lazy_import_flash_attention`) and caches the
    functions in module globals; this sets them as an installed flash-attn would, and
    restores them afterwards."""
    from transformers import modeling_flash_attention_utils as fa

    saved = {name: getattr(fa, name) for name in _GLOBALS}
    fa._loaded_implementation = "flash_attention_2"
    fa._flash_fn, fa._flash_varlen_fn = flash_attn_func, flash_attn_varlen_func
    fa._flash_with_kvcache_fn = None
    fa._pad_fn, fa._unpad_fn = fa._pad_input, fa._unpad_input
    fa._process_flash_kwargs_fn = fa._lazy_define_process_function(flash_attn_varlen_func)
    fa._process_with_kvcache_kwargs_fn = dict
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(fa, name, value)
