"""CUDA kernel choices that change memory, applied while capturing on fake CPU tensors.

Capture runs on the CPU device, whose kernels differ from CUDA's where memory differs most:
scaled dot-product attention. On CUDA, `F.scaled_dot_product_attention` picks
FlashAttention-2 (sm80+, fp16/bf16, no explicit mask, grouped-query attention included),
else the memory-efficient kernel (masks and fp32 too, equal head counts), else the math
path that materialises the S x S attention matrix; the CPU picks differently (its own
flash kernel, math whenever dropout is on). For a CUDA target we route the call to the
CUDA op itself (`aten._scaled_dot_product_flash_attention` / `_efficient_attention` /
`_scaled_dot_product_attention_math`), whose fake-tensor rules give CUDA's output sizes,
and record the scratch their backward kernels allocate inside the op (invisible to a
dispatch mode; `predictor.emulate.cuda_kernels` has the formulas and the other CUDA-only kernels).

The CPU has one kernel whose fake-tensor rule gets memory wrong: oneDNN's LSTM
(`aten.mkldnn_rnn_layer`, what nn.LSTM runs per layer and direction when training on the
CPU) returns a workspace the backward reads, which the meta kernel makes empty.
`cpu_kernel_hooks` gives it its real size (`mkldnn_rnn_workspace_bytes`). Not modelled
for a CPU target: on CPUs with AVX512-BF16 or AMX, oneDNN's bf16 GEMMs allocate packing
scratchpads inside the kernel (freed before it returns; up to the weight's size and more,
e.g. 1,052,288 B for a 1 MiB bf16 lm_head weight); CPUs without bf16 support, and
`torch.backends.mkldnn.flags(enabled=False)`, run the reference GEMM, which allocates none.
CUDA targets are not affected (cuBLAS workspaces are the sim's, `cublas_workspace_bytes`).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import torch
import torch.nn.functional as F
from memgnn.predictor.emulate.cuda_kernels import (
    efficient_backward_scratch,
    embedding_backward_scratch,
    flash_backward_scratch,
)
from torch._prims_common import suggest_memory_format

log = logging.getLogger(__name__)

aten = torch.ops.aten
_LOW = (torch.float16, torch.bfloat16)


def choose_sdpa(q, k, v, attn_mask, sm: int, enable_gqa: bool = False) -> str:
    """'flash', 'efficient' or 'math': the CUDA backend PyTorch's dispatcher would pick.

    Grouped-query attention (`enable_gqa`, fewer key/value heads than query heads, as
    transformers passes for an unmasked causal LM) runs on FlashAttention-2 or the math
    kernel only (torch 2.13's `scaled_dot_product_attention` documentation). Head dims as
    `sdp_utils.cpp` checks them: flash needs q, k and v alike (`check_head_dim_size_flash`);
    the memory-efficient kernel needs q and k alike and both q's and v's aligned, so a value
    head dim of its own (DeepSeek's multi-head latent attention: 192 for q/k, 128 for v)
    runs there (`check_head_dim_size_mem_efficient`)."""
    if q.dim() != 4 or not q.dtype == k.dtype == v.dtype:
        return "math"
    h, hk = q.shape[-3], k.shape[-3]
    if hk != h and not (enable_gqa and hk == v.shape[-3] and h % hk == 0):
        return "math"
    d, dv = q.shape[-1], v.shape[-1]
    if k.shape[-1] != d:
        return "math"
    if sm >= 80 and q.dtype in _LOW and attn_mask is None and d <= 256 and d % 8 == 0 and dv == d:
        return "flash"
    if hk != h:
        return "math"
    align = 4 if q.dtype == torch.float32 else 8
    if q.dtype in (torch.float32, *_LOW) and d % align == 0 and dv % align == 0:
        if q.dtype == torch.bfloat16 and sm < 80:
            return "math"
        return "efficient"
    return "math"


@contextlib.contextmanager
def cuda_sdpa(sm: int):
    """Route `F.scaled_dot_product_attention` to the CUDA kernel PyTorch would choose."""
    original = F.scaled_dot_product_attention

    def sdpa(
        query,
        key,
        value,
        attn_mask=None,
        dropout_p=0.0,
        is_causal=False,
        scale=None,
        enable_gqa=False,
    ):
        dtype = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None
        if dtype is not None:  # CUDA autocast runs attention in the low-precision dtype
            query, key, value = (t.to(dtype) for t in (query, key, value))
        choice = choose_sdpa(query, key, value, attn_mask, sm, enable_gqa)
        if choice == "flash":
            return aten._scaled_dot_product_flash_attention(
                query, key, value, dropout_p, is_causal, False, scale=scale
            )[0]
        if choice == "efficient":
            if attn_mask is not None and attn_mask.dtype == torch.bool:
                attn_mask = torch.zeros_like(attn_mask, dtype=query.dtype).masked_fill(
                    attn_mask.logical_not(), float("-inf")
                )
            need_lse = query.requires_grad or key.requires_grad or value.requires_grad
            return aten._scaled_dot_product_efficient_attention(
                query, key, value, attn_mask, need_lse, dropout_p, is_causal, scale=scale
            )[0]
        if attn_mask is not None and attn_mask.dtype == torch.bool:
            attn_mask = torch.zeros_like(attn_mask, dtype=query.dtype).masked_fill(
                attn_mask.logical_not(), float("-inf")
            )
        # the math kernel itself: on the CPU device F.scaled_dot_product_attention would
        # pick the CPU's flash kernel, which CUDA does not run
        return aten._scaled_dot_product_attention_math(
            query,
            key,
            value,
            attn_mask,
            dropout_p,
            is_causal,
            scale=scale,
            enable_gqa=enable_gqa,
        )[0]

    F.scaled_dot_product_attention = sdpa
    torch.nn.functional.scaled_dot_product_attention = sdpa
    try:
        yield
    finally:
        F.scaled_dot_product_attention = original


def _round_up(x: Any, m: int) -> Any:
    return (x + m - 1) // m * m


def cuda_scratch(func: Any, args: tuple, sm: int = 80) -> Any:
    """Bytes a CUDA kernel allocates and frees inside the op (0 when none is known);
    the formulas are `predictor.emulate.cuda_kernels`'."""
    if func is aten._scaled_dot_product_flash_attention_backward.default:
        return flash_backward_scratch(args[1], args[2])
    if func is aten._scaled_dot_product_efficient_attention_backward.default:
        return efficient_backward_scratch(args[1], args[3], dropout=args[9] > 0, sm=sm)
    if func is aten.embedding_dense_backward.default:
        return embedding_backward_scratch(args[0], args[1], bool(args[4]))
    return 0


_PAGE = 4096  # oneDNN starts each workspace part on a page


def _good_ld(d: int, elem: int) -> int:
    """oneDNN's leading dimension: `d` rounded up to 64 bytes, plus 64 bytes more where
    the result is a multiple of 256 elements (to avoid cache-set aliasing)."""
    step = 64 // elem
    ld = _round_up(d, step)
    return ld + step if ld % 256 == 0 else ld


def mkldnn_rnn_workspace_bytes(
    t: Any, b: Any, i: int, h: int, *, elem: int, c_elem: int | None = None
) -> Any:
    """Bytes of the workspace one `aten.mkldnn_rnn_layer` call returns with grad enabled:
    seven parts (gates, hidden states, layer states, cell states, and the fp32 gradient
    states for layer, iteration and cell), each rounded up to a 4096-byte page. `t`, `b`
    may be SymInts; `elem` is the data dtype's size, `c_elem` that of the cell state.
    Exact on torch 2.13's oneDNN (fp32 and bf16) against the real op; see
    tests/predictor/test_kernels.py."""
    c_elem = elem if c_elem is None else c_elem
    s = max(i, h)
    rows = 2 * (t + 1) * b  # (layers + 1) x (time steps + 1) state rows, one layer
    parts = [
        t * b * _good_ld(4 * h, elem) * elem,  # gates
        t * b * _good_ld(h, elem) * elem,  # hidden states
        rows * _good_ld(s, elem) * elem,  # layer states
        rows * h * c_elem,  # cell states
        rows * _good_ld(s, 4) * 4,  # d(layer states), fp32
        rows * _good_ld(s, 4) * 4,  # d(iteration states), fp32
        rows * h * 4,  # d(cell states), fp32
    ]
    return sum(_round_up(p, _PAGE) for p in parts)


def _mkldnn_rnn_layer(rec: Any, func: Any, args: tuple, kwargs: dict) -> Any:
    out = func(*args, **kwargs)
    x, hx, cx = args[0], args[5], args[6]
    if torch.is_grad_enabled() and out[3] is not None:
        t, b, i = x.shape
        nbytes = mkldnn_rnn_workspace_bytes(
            t, b, i, hx.shape[-1], elem=x.element_size(), c_elem=cx.element_size()
        )
        out = (*out[:3], x.new_empty((nbytes,), dtype=torch.uint8))
    rec.record_op("mkldnn_rnn_layer.default", (args, kwargs), out)
    return out


def cpu_kernel_hooks() -> dict[Any, Any]:
    """Dispatch hooks (see `StepRecorder`) for CPU kernels whose fake rule misstates memory."""
    return {aten.mkldnn_rnn_layer.default: _mkldnn_rnn_layer}


_NO_END = (1 << 63) - 1  # the end aten.slice gets for an open slice (`x[a:]`, `x[:]`)


def _full_slice(start: Any, end: Any, step: Any) -> bool:
    return (
        (start is None or (isinstance(start, int) and start == 0))
        and (end is None or (isinstance(end, int) and end >= _NO_END))
        and step == 1
    )


def _slice(rec: Any, func: Any, args: tuple, kwargs: dict) -> Any:
    # aten.slice.Tensor(self, dim=0, start=None, end=None, step=1): trailing defaults omitted
    x, _dim, start, end, step = (*args, *(None, 0, None, None, 1)[len(args) :])
    if not _full_slice(start, end, step):
        out = func(*args, **kwargs)
        rec.record_op("slice.Tensor", (args, kwargs), out)
        return out
    out = aten.alias.default(x)
    rec.record_op("alias.default", ((x,), {}), out)
    return out


def _slice_backward(rec: Any, func: Any, args: tuple, kwargs: dict) -> Any:
    grad, _sizes, _dim, start, end, step = args
    if _full_slice(start, end, step):
        return grad  # the forward slice was no slice: its grad passes through
    out = func(*args, **kwargs)
    rec.record_op("slice_backward.default", (args, kwargs), out)
    return out


def _grouped_mm(rec: Any, func: Any, args: tuple, kwargs: dict) -> Any:
    """`aten._grouped_mm` (MoE experts: transformers' `grouped_mm` experts) in any dtype.

    The fake rule (`meta_grouped_mm`) refuses inputs other than bf16, as CUDA's fast
    (CUTLASS, sm90+) path does; but `_grouped_mm_cuda` runs every other case by
    `_grouped_mm_fallback` (a loop of mm into the output) and the CPU kernel takes fp32 too
    (PyTorch v2.13 native/cuda/GroupedBlas.cpp, native/GroupedMMUtils.h), so an fp32 MoE
    trains where its capture failed. Its output is what `create_grouped_gemm_output_tensor`
    makes in either case: the fake rule's sizes, the last dimension's stride padded to 16
    bytes, in `out_dtype` (default: the inputs')."""
    a, b = args[0], args[1]
    if a.dtype == torch.bfloat16 and b.dtype == torch.bfloat16:
        out = func(*args, **kwargs)
    else:
        rest = dict(zip(("offs", "bias", "out_dtype"), args[2:])) | kwargs
        dtype = rest.get("out_dtype") or a.dtype
        bias = rest.get("bias")
        sized = func(
            a.to(torch.bfloat16), b.to(torch.bfloat16), offs=rest.get("offs"),
            bias=None if bias is None else bias.to(torch.bfloat16),
        )  # fmt: skip
        align = max(16 // torch.empty((), dtype=dtype).element_size(), 1)
        shape = list(sized.shape)
        padded = (shape[-1] + align - 1) // align * align
        stride = [padded, 1] if len(shape) == 2 else [shape[1] * padded, padded, 1]
        out = torch.empty_strided(shape, stride, dtype=dtype, device=a.device)
    rec.record_op("_grouped_mm.default", (args, kwargs), out)
    return out


def eager_hooks() -> dict[Any, Any]:
    """Dispatch hooks for both targets: `_grouped_mm` in every dtype its kernels take, and
    what eager indexing skips kept out of a symbolic capture.

    Python indexing with an open slice (`x[:, :]`, `x[:, 0:]`) returns the tensor itself in
    eager mode when the sizes are concrete: no slice op, no SliceBackward, so no gradient
    buffer in the backward. With symbolic sizes the same indexing dispatches
    `aten.slice(x, d, 0, INT64_MAX)`, and its backward `slice_backward` allocates a
    gradient-sized buffer eager never allocates (e.g. HF causal LMs' `logits_to_keep=0`).
    Here an open slice becomes an alias and its backward passes the gradient through.
    """
    return {
        aten.slice.Tensor: _slice,
        aten.slice_backward.default: _slice_backward,
        aten._grouped_mm.default: _grouped_mm,
    }


def _baddbmm(rec: Any, func: Any, args: tuple, kwargs: dict) -> Any:
    # the meta rule expands a broadcast `self` with a call that needs concrete sizes; the
    # kernel broadcasts the same way (a view), so expand first and dispatch the same op
    self_, batch1, batch2 = args
    full = self_.expand(batch1.shape[0], batch1.shape[1], batch2.shape[2])
    out = func(full, batch1, batch2, **kwargs)
    rec.record_op("baddbmm.default", (args, kwargs), out)
    return out


def _polar(rec: Any, func: Any, args: tuple, kwargs: dict) -> Any:
    # torch's reference `polar` (the fake rule) assigns `.real`/`.imag` of a complex result
    # through strided copies that pin symbolic sizes to their hints (DeepSeek-V2's rotary
    # embedding: Eq(32*S, 8192)); the kernel writes one complex tensor of the broadcast
    # shape (`meta_complex` pins the sizes as well, so the output is made here)
    magnitude, angle = args
    base = torch.broadcast_tensors(magnitude, angle)[0]  # a view: no allocation
    cdtype = {torch.float64: torch.complex128, torch.float16: torch.complex32}.get(
        magnitude.dtype, torch.complex64
    )
    out = torch.empty_like(base, dtype=cdtype, memory_format=torch.contiguous_format)
    rec.record_op("polar.default", (args, kwargs), out)
    return out


_EFFICIENT_BACKWARD = aten._scaled_dot_product_efficient_attention_backward.default


def _efficient_attention_backward(rec: Any, func: Any, args: tuple, kwargs: dict) -> Any:
    # the meta rule slices the padded bias gradient with Python indexing, which fails on
    # symbolic sizes (torch 2.13: "dispatch_on_subclass called with NO overloaded args");
    # the kernel's own layout is the same: the last dim rounded up to 16, then narrowed
    bias, mask = args[4], list(args[10])
    if bias is None or not mask[3]:
        out = func(*args, **kwargs)
    else:
        gq, gk, gv, _ = func(*args[:10], [*mask[:3], False], *args[11:], **kwargs)
        last = bias.shape[-1]
        padded = torch.empty(
            (*bias.shape[:-1], _round_up(last, 16)), dtype=bias.dtype, device=bias.device
        )
        out = (gq, gk, gv, padded.narrow(-1, 0, last))
    node = rec.record_op(
        "_scaled_dot_product_efficient_attention_backward.default", (args, kwargs), out
    )
    if rec.scratch is not None:  # the kernel's own scratch, as every unhooked op records it
        node.scratch = rec.scratch(func, args)
    return out


def _constant_pad_nd(rec: Any, func: Any, args: tuple, kwargs: dict) -> Any:
    # the op's CompositeExplicitAutograd kernel runs as it is under fake tensors and wants
    # concrete sizes: a pad that is a size expression (the linear-attention reference
    # kernels of Qwen3-Next, Mamba2 and their kin pad S up to a multiple of the chunk:
    # `(C - S % C) % C`) fails; a negative pad narrows first, which fails on symbolic sizes
    # (RWKV's time shift, `ZeroPad2d((0, 0, 1, -1))`: "Cannot call storage_offset()"); a
    # positive constant pad of a symbolic input pins its sizes to their hints (Mamba2's
    # `F.pad(A_cumsum[..., -1], (1, 0))`: B == 4). The kernel (native/PadNd.cpp) makes one
    # output of the padded shape in the input's suggested memory format and copies into it
    # (where no pad is positive, a clone of the narrowed input: as many bytes), as made here
    x, pad = args[0], list(args[1])
    if all(isinstance(v, int) for v in (*pad, *x.shape)):
        out = func(*args, **kwargs)
    else:
        shape = list(x.shape)
        for k in range(len(pad) // 2):
            shape[-1 - k] = shape[-1 - k] + pad[2 * k] + pad[2 * k + 1]
        out = torch.empty(
            shape, dtype=x.dtype, device=x.device, memory_format=suggest_memory_format(x)
        )
    rec.record_op("constant_pad_nd.default", (args, kwargs), out)
    return out


def _solve_triangular(rec: Any, func: Any, args: tuple, kwargs: dict) -> Any:
    # the meta rule broadcasts the batch dims with a call that takes concrete sizes (torch
    # 2.13: the linear-attention reference kernels' UT solve, Qwen3-Next's gated delta
    # rule); the kernel (native/BatchLinearAlgebra.cpp, linalg_solve_triangular_out) makes
    # one result, column-major (F-contiguous) in B's broadcast shape, copies B into it, and
    # works on A in place when A is "F-ready" (its matrices column- or row-major, not
    # conjugated); else on an F-contiguous clone of A, freed inside the op (its scratch)
    A, B = args[0], args[1]
    if not kwargs.get("left", True) or A.is_conj() or B.is_conj():
        out = func(*args, **kwargs)
        rec.record_op("linalg_solve_triangular.default", (args, kwargs), out)
        return out
    batch = list(B.shape[:-2])
    if list(A.shape[:-2]) != batch:
        batch = list(torch.broadcast_shapes(A.shape[:-2], B.shape[:-2]))
    A_ = A.expand(*batch, *A.shape[-2:])
    shape = [*batch, *B.shape[-2:]]
    out = torch.empty([*batch, shape[-1], shape[-2]], dtype=B.dtype, device=B.device).mT
    node = rec.record_op("linalg_solve_triangular.default", (args, kwargs), out)
    if not (A_.is_contiguous() or A_.mT.is_contiguous()):
        node.scratch = A_.numel() * A_.element_size()
    return out


def symbolic_hooks() -> dict[Any, Any]:
    """Dispatch hooks for ops whose fake-tensor rule fails on symbolic sizes.

    `aten.baddbmm` with a broadcast input (BLOOM's ALiBi bias, `(B*H, 1, S)` against
    `(B*H, S, S)` scores) fails in torch 2.13's `meta_baddbmm`, which expands the input
    through a kernel that takes concrete sizes only. The hook expands it first (a view, as
    the real kernel's broadcast is) and records one `baddbmm` with the original inputs.
    The memory-efficient SDPA backward with a bias that takes a gradient (T5's trained
    relative position bias on a CUDA target) fails in its meta rule's slice of the padded
    bias gradient; the hook allocates the same padded buffer and narrows it.
    `aten.polar` (DeepSeek-V2's complex rotary embedding) specializes B and S in its
    reference rule; the hook makes its one complex output with `aten.complex`.
    `aten.constant_pad_nd` of a symbolic-size input runs a kernel that takes concrete sizes:
    a symbolic amount (linear-attention reference kernels) fails, a negative one (RWKV's
    time shift) fails in its narrow, a positive constant one pins B and S to their hints
    (Mamba2); the hook makes its one padded output.
    `aten.linalg_solve_triangular` (the same kernels' UT solve) broadcasts in its meta rule
    by concrete sizes; the hook makes the kernel's F-contiguous result (and A's clone as
    scratch where the kernel clones it).
    """
    return {
        aten.constant_pad_nd.default: _constant_pad_nd,
        aten.linalg_solve_triangular.default: _solve_triangular,
        aten.baddbmm.default: _baddbmm,
        _EFFICIENT_BACKWARD: _efficient_attention_backward,
        aten.polar.default: _polar,
    }
