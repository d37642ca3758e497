"""What CUDA's kernels allocate where the CPU capture device allocates otherwise.

A CUDA-target capture runs on fake CPU tensors, so every aten op takes its CPU (or meta)
path. Where PyTorch's CUDA kernel allocates differently, this module makes the captured
graph hold what the CUDA kernel allocates (PyTorch v2.13 sources, aten/src/ATen/native;
the full list, with what is and is not modelled: docs/reference/cuda-kernels.md):

- dropout (`F.dropout`, `nn.Dropout`, the math attention's dropout): on CUDA, `at::dropout`
  runs the fused `native_dropout` kernel (native/Dropout.cpp `is_fused_kernel_acceptable`:
  a CUDA input, 0 < p < 1, numel > 0), which allocates its **bool** mask (one byte per
  element, cuda/Dropout.cu `dropout_cuda<bool>`: mask first, then the output) and keeps
  only the mask for backward (`native_dropout_backward`: one output like the gradient).
  The CPU runs `_dropout<false>`: a mask in the input's dtype (`empty_like` +
  `bernoulli_` + `div_`), four times larger in fp32. `cuda_dropout` routes `aten::dropout`
  to `native_dropout` for the capture (a kernel at the AutogradCPU key, gated per thread);
  in-place dropout (`dropout_`) takes `_dropout<true>` on CUDA as well and is unchanged.
- `native_layer_norm`: CUDA keeps mean and rstd in the accumulate type (fp32 for fp16 and
  bf16 inputs, cuda/layer_norm_kernel.cu `layer_norm_cuda`); the CPU in the input's dtype.
- the memory-efficient attention's philox seed and offset are host tensors on CUDA
  (transformers/cuda/attention.cu: `at::empty({}, at::dtype(at::kLong))`): no device bytes.
- kernel scratch (allocated and freed inside one op, `cuda_scratch`): FlashAttention-2's
  and the memory-efficient kernel's backward buffers, and `embedding_dense_backward`'s
  sort and segment buffers.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any

import torch
from torch.fx.experimental.symbolic_shapes import guard_or_true

__all__ = [
    "cuda_dropout",
    "cuda_kernel_hooks",
    "efficient_backward_scratch",
    "embedding_backward_scratch",
    "flash_backward_scratch",
]

log = logging.getLogger(__name__)

aten = torch.ops.aten
_LOW = (torch.float16, torch.bfloat16)
_BLOCK = 512  # the CUDA caching allocator's rounding of small blocks


def _round_up(x: Any, m: int) -> Any:
    return (x + m - 1) // m * m


def _ceil_div(x: Any, m: int) -> Any:
    return (x + m - 1) // m


def _symbolic(*xs: Any) -> bool:
    return any(isinstance(x, torch.SymInt) for x in xs)


def _min(a: Any, b: Any) -> Any:
    """min that stays a formula for SymInts (no guard on the trace sizes)."""
    return torch.sym_min(a, b) if _symbolic(a, b) else min(a, b)


def _max(a: Any, b: Any) -> Any:
    return torch.sym_max(a, b) if _symbolic(a, b) else max(a, b)


# ---- dropout ------------------------------------------------------------------------
_ACTIVE = threading.local()  # .depth > 0 while this thread captures for a CUDA target
_LIB_LOCK = threading.Lock()
_LIB: dict[str, Any] = {"lib": None, "users": 0}


def _dropout(input: torch.Tensor, p: float, train: bool) -> torch.Tensor:
    """aten::dropout at the AutogradCPU key: CUDA's choice while a CUDA capture runs on this
    thread (native/Dropout.cpp `dropout`), else the CPU's `_dropout<false>`, op for op."""
    if not 0 <= p <= 1:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    nonempty = guard_or_true(input.numel() != 0)
    if getattr(_ACTIVE, "depth", 0) and train and 0 < p < 1 and nonempty:
        return aten.native_dropout.default(input, p, train)[0]
    if p == 0 or not train or not nonempty:
        return input
    if p == 1:
        return input.mul(torch.zeros((), dtype=input.dtype, device=input.device))
    noise = torch.empty_like(input)
    noise.bernoulli_(1 - p)
    noise.div_(1 - p)
    return input.mul(noise)


@contextlib.contextmanager
def cuda_dropout():
    """While active, `aten::dropout` on this thread runs CUDA's fused `native_dropout`."""
    with _LIB_LOCK:
        if _LIB["users"] == 0:
            lib = torch.library.Library("aten", "IMPL")  # destroyed by the last user
            lib.impl("dropout", _dropout, "AutogradCPU")
            _LIB["lib"] = lib
        _LIB["users"] += 1
    _ACTIVE.depth = getattr(_ACTIVE, "depth", 0) + 1
    try:
        yield
    finally:
        _ACTIVE.depth -= 1
        with _LIB_LOCK:
            _LIB["users"] -= 1
            if _LIB["users"] == 0:
                _LIB["lib"]._destroy()
                _LIB["lib"] = None


def _native_dropout(rec: Any, func: Any, args: tuple, kwargs: dict) -> Any:
    # dropout_cuda<bool> allocates the mask before the output: record them in that order
    out = func(*args, **kwargs)
    rec.record_op("native_dropout.default", (args, kwargs), (out[1], out[0]))
    return out


# ---- layer norm ---------------------------------------------------------------------
def _native_layer_norm(rec: Any, func: Any, args: tuple, kwargs: dict) -> Any:
    out, mean, rstd = func(*args, **kwargs)
    if args[0].dtype in _LOW:  # layer_norm_cuda: mean, rstd in the accumulate type
        mean = torch.empty(mean.shape, dtype=torch.float32, device=mean.device)
        rstd = torch.empty(rstd.shape, dtype=torch.float32, device=rstd.device)
    rec.record_op("native_layer_norm.default", (args, kwargs), (out, mean, rstd))
    return out, mean, rstd


# ---- memory-efficient attention: host seed and offset -------------------------------
def _efficient_attention(rec: Any, func: Any, args: tuple, kwargs: dict) -> Any:
    out = func(*args, **kwargs)
    rec.record_op("_scaled_dot_product_efficient_attention.default", (args, kwargs), out)
    for t in out[2:4]:  # philox seed, offset: CPU tensors on a CUDA device's run
        uid = rec.uid_of(t)
        if uid is not None:
            rec.storages[uid].nbytes = 0
    return out


def cuda_kernel_hooks() -> dict[Any, Any]:
    """Dispatch hooks (see `StepRecorder`) for ops whose CUDA kernel allocates otherwise."""
    return {
        aten.native_dropout.default: _native_dropout,
        aten.native_layer_norm.default: _native_layer_norm,
        aten._scaled_dot_product_efficient_attention.default: _efficient_attention,
    }


# ---- kernel scratch -----------------------------------------------------------------
def _head_rounded(d: int) -> int:
    return _round_up(d, 32 if d <= 128 else 64)


def flash_backward_scratch(q: Any, k: Any) -> Any:
    """`_scaled_dot_product_flash_attention_backward`'s own buffers (flash_api.cpp
    `mha_bwd`, `q`, `k` as (B, H, S, D)): fp32 softmax_d (B, H, round128(S_q)) and dq_accum
    (B, round128(S_q), H, D rounded to 32, or 64 above 128), and for grouped-query
    attention dk and dv expanded to every query head in q's dtype, summed afterwards."""
    b, h, s_q, d = q.shape
    s_q_r = _round_up(s_q, 128)
    nbytes = b * h * s_q_r * 4 + b * s_q_r * h * _head_rounded(_round_up(d, 8)) * 4
    if k.shape[1] != h:
        nbytes += 2 * b * k.shape[2] * h * d * q.element_size()
    return nbytes


# the memory-efficient backward's cutlass kernels, in dispatch_cutlassB's order for sm80 up
# to sm99 (mem_eff_attention/kernels/cutlassB.h): (BI, BJ, max head dim, for fp32)
_EFF_KERNELS_HALF = ((64, 64, 32), (64, 64, 64), (128, 128, 128), (64, 64, 128), (128, 64, 1 << 16))
_EFF_KERNELS_HALF_86 = ((64, 64, 32), (64, 64, 64), (128, 64, 96), (128, 128, 128),
                        (64, 64, 128), (128, 64, 1 << 16))  # fmt: skip
_EFF_KERNELS_F32 = ((64, 64, 32), (64, 64, 64), (128, 64, 128), (64, 64, 128), (128, 64, 1 << 16))


def _efficient_kernel(dtype: torch.dtype, d: int, sm: int, dropout: bool) -> tuple[int, int, int]:
    if dtype in _LOW:  # sm86/89 add a 128 x 64 tile for head dims <= 96, without dropout
        table = _EFF_KERNELS_HALF_86 if sm in (86, 89) and not dropout else _EFF_KERNELS_HALF
    else:
        table = _EFF_KERNELS_F32
    return next(k for k in table if k[2] >= d)


def efficient_backward_scratch(q: Any, v: Any, *, dropout: bool = False, sm: int = 80) -> Any:
    """`_scaled_dot_product_efficient_attention_backward`'s own buffers (attention_backward
    .cu `_efficient_attention_backward`, kernel_backward.h; `q`, `v` as (B, H, S, D)), for
    sm80 and newer, the peak of:

    - delta, fp32 (B, H, S_q): an empty buffer the fp16/bf16 kernels fill; for fp32 it is
      `(grad_out.float() * out.float()).sum(-1).transpose(-2, -1).contiguous()`, whose
      (B, S_q, H, Dv) product and (B, S_q, H) sum live until the copy is made;
    - the fp32 workspace of the kernel dispatch_cutlassB picks (first whose max head dim
      fits; tiles BI x BJ): per (batch, head) the dq accumulator, ceil(S_q / BI) x
      ceil(D / BJ) tiles of BI x BJ floats plus a 16-byte lock each, and where dk/dv do
      not stay in registers (fp16/bf16 with D > BI) a dk and a dv accumulator of
      splits x BJ x align(D, BI) floats, splits = max(1, min(ceil(S_k / BJ), 200 // (B H))).
    """
    b, h, s_q, d = q.shape
    s_k, dv = v.shape[2], v.shape[3]
    kd = max(int(d), int(dv))
    bi, bj, kmax = _efficient_kernel(q.dtype, kd, sm, dropout)
    half = q.dtype in _LOW
    delta = b * h * s_q * 4
    gq = _ceil_div(s_q, bi) * _ceil_div(d, bj) * (4 + bi * bj)  # floats, GradQTempStorage
    gkv = 0
    if half and kmax > bi:  # kNeedsAccumGradK/V: dk, dv not kept in registers
        splits = _max(1, _min(_ceil_div(s_k, bj), 200 // (b * h)))
        gkv = splits * bj * (_round_up(d, bi) + _round_up(dv, bi))
    workspace = b * h * _round_up(gq + gkv, 4) * 4
    if half:
        return delta + workspace
    product = b * s_q * h * dv * 4 + b * s_q * h * 4  # grad_out * out, and its sum
    return _max(product + delta, delta + workspace)


def embedding_backward_scratch(grad: Any, indices: Any, scale_grad_by_freq: bool) -> Any:
    """`embedding_dense_backward`'s buffers on CUDA (cuda/Embedding.cu,
    EmbeddingBackwardKernel.cu), none for at most 3072 indices without scale_grad_by_freq
    (a direct kernel). Else, with N indices, the most alive at once: sorted and original
    indices, segment offsets, partials per segment and their offsets, partial segment
    offsets (six N-long index buffers), two 1-element int64 counters, and the
    partial sums, N x D in the accumulate type (fp32 for fp16/bf16), each rounded to the
    allocator's 512-byte blocks; with scale_grad_by_freq also the N-long counts."""
    n = indices.numel()
    dim = grad.shape[-1]
    acc = 4 if grad.dtype in _LOW else grad.element_size()
    k = 7 if scale_grad_by_freq else 6
    nbytes = k * _round_up(n * indices.element_size(), _BLOCK) + 2 * _BLOCK
    nbytes = nbytes + _round_up(n * dim * acc, _BLOCK)
    if scale_grad_by_freq:
        return nbytes
    # 0 up to 3072 indices (the direct kernel), else nbytes: clamp a ramp that exceeds
    # nbytes from 3073 on (nbytes <= slope * n + (k + 3) * 512), so the formula has no
    # product of two size terms (a bounded magnitude: `predictor.ir.expr.magnitude`)
    slope = k * indices.element_size() + dim * acc
    ramp = (slope * 3073 + (k + 3) * _BLOCK) * (n - 3072)
    return _max(0, _min(nbytes, ramp))
