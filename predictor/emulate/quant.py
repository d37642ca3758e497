"""A bitsandbytes-quantised frozen base (QLoRA), as its CUDA kernels allocate, on fake tensors.

`--quantize-base nf4|nf4-dq|int8` swaps the base model's Linear layers for modules that hold
exactly the storages bitsandbytes (0.50.2; `--bnb-version` for older 4-bit kernels) keeps
and whose forward and backward allocate exactly the temporaries its CUDA path allocates, so
the recorder sees the same storages on the CPU capture device (the real modules would take
bitsandbytes' CPU paths there).

Which layers: transformers' rule (`replace_with_bnb_linear`): every `nn.Linear` (exact type)
and GPT-2 `Conv1D`, except `get_keys_to_not_convert(model)` (tied weights, the last module,
the output embeddings: the lm_head) and `_keep_in_fp32_modules`; `should_convert_module`
matches the names. Models that are no `PreTrainedModel` keep their last module unquantised.

Storage per quantised `N x K` weight, n = N*K (`bitsandbytes.functional.quantize_4bit`,
`Params4bit._quantize`, `Int8Params._quantize`):
- nf4: packed uint8 `((n+1)//2, 1)`; absmax fp32 per block of 64 (`ceil(n/64)`); the 16-entry
  fp32 NF4 code (`get_4bit_type`, one per layer).
- nf4-dq (`bnb_4bit_use_double_quant`, LitGPT's `bnb.nf4-dq`): the absmax quantised to uint8
  (`ceil(n/64)` bytes), its fp32 offset (0-dim), its own fp32 absmax per 256 blocks and a
  copy of the 256-entry fp32 dynamic code, per layer; plus one shared dynamic code.
- int8 (LLM.int8, `has_fp16_weights=False`): int8 `N x K` weight and fp32 row scales SCB (N).

`--bnb-quant-storage` (`bnb_4bit_quant_storage`) stores the packed codes in another dtype:
`((n+1) // (2 * itemsize), 1)` elements (the CUDA `quantize_4bit`), the same bytes. A float
storage is FSDP-QLoRA's: FSDP flattens and shards the codes like any weight of that dtype.
The quant state (absmax, codes) is no module state in bitsandbytes (`Params4bit.quant_state`,
kept on the module as `module.quant_state` to survive FSDP's parameter swaps): FSDP neither
shards nor casts it, every rank holds all of it. Under sharding the stand-ins hold it the
same way (`hold_quant_state`), not as buffers FSDP1's MixedPrecision would cast.

Temporaries (`bitsandbytes.autograd._functions`, `backends/cuda/ops.py`):
- nf4 forward: the input cast to the compute dtype; `gemm_4bit`'s dequantise + `F.linear`
  path: (with dq: the fp32 absmax dequantised and offset, 2 x ceil(n/64) x 4 bytes) the
  `N x K` weight in the compute dtype, freed after the matmul; the output cast back.
  bitsandbytes >= 0.50 runs a fused kernel instead (no dequantised weight) for small token
  counts M (at most 1536, per-architecture tables, mostly M <= 128 at 7B shapes); the
  model keeps the dequantise path for every M, so there it overstates by that one weight.
- before 0.43.2 (`--bnb-version`, bitsandbytes PR #1270): the forward dequantises as the
  backward does (`dequantize_4bit(B).to(A.dtype)`) and `MatMul4Bit` keeps its input A as
  `ctx.tensors` (a ctx attribute, not a saved tensor) though backward never reads it: every
  quantised layer's input lives until the autograd graph is freed, checkpointed or not
  (with `TrainSpec.hold_outputs`, into the next step's forward).
- nf4 backward (grad of the input): the weight dequantised again (in the dtype it was
  loaded in, then cast to the gradient's dtype if they differ) and `grad @ W`.
- int8 forward (`MatMul8bitLt`, threshold 6.0): the input in fp16, `int8_vectorwise_quant`
  (int8 `M x K`, fp32 row stats M, the outlier scan `|A| >= 6`: fp16 and bool `M x K`),
  the int32 `M x N` product, its fp16 dequantisation and the cast to the input's dtype.
  Outlier columns are data-dependent; modelled as none (their `M x n` copies are absent).
- int8 backward: `CB.to(dtype, copy=True)` (`N x K`), the fp32 scale, `grad @ CB`.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.nn.functional as F
from memgnn.predictor.spec.train import TrainSpec
from torch import nn

log = logging.getLogger(__name__)

__all__ = [
    "Linear4bitSim",
    "Linear8bitSim",
    "QUANTIZED_TYPES",
    "compute_dtype",
    "hold_quant_state",
    "quant_state_tensors",
    "modules_to_not_convert",
    "quantize_model",
    "quantized_state_bytes",
]

BLOCKSIZE = 64  # bnb_4bit blocksize (Params4bit default)
NESTED_BLOCKSIZE = 256  # double quantisation of the absmax (quantize_4bit)
INT8_THRESHOLD = 6.0  # transformers' llm_int8_threshold default
STORAGES = {"uint8": torch.uint8, "bf16": torch.bfloat16, "fp16": torch.float16,
            "fp32": torch.float32}  # fmt: skip


def _cdiv(a: int, b: int) -> int:
    return -(a // -b)


def compute_dtype(train: TrainSpec) -> torch.dtype:
    """`bnb_4bit_compute_dtype`: the training precision's low dtype, else fp32 (the
    BitsAndBytesConfig default)."""
    if "bf16" in train.numerics.precision:
        return torch.bfloat16
    if "fp16" in train.numerics.precision:
        return torch.float16
    return torch.float32


def quantized_state_bytes(n_out: int, n_in: int, kind: str) -> int:
    """Bytes one quantised `n_out x n_in` weight keeps (weight + quant state), by hand;
    nf4-dq's shared 1024-byte dynamic code is counted once per model, not here."""
    n = n_out * n_in
    if kind == "int8":
        return n + 4 * n_out
    blocks = _cdiv(n, BLOCKSIZE)
    packed = (n + 1) // 2
    if kind == "nf4":
        return packed + 4 * blocks + 16 * 4
    if kind == "nf4-dq":
        return packed + blocks + 4 + 4 * _cdiv(blocks, NESTED_BLOCKSIZE) + 256 * 4 + 16 * 4
    raise ValueError(f"unknown quantisation {kind!r}")


class _Dequant4bit:
    """Dequantising a 4-bit weight as bitsandbytes' CUDA ops allocate it."""

    def dequantize(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """`F.dequantize_4bit` (backward; peft's DoRA): the weight in the dtype it was
        loaded in, then cast to `dtype` (None: as loaded). Double quantisation first
        dequantises the absmax (fp32, one `dequantize_blockwise` output) and adds the
        offset in place."""
        absmax = self.absmax
        if self.nested:
            absmax = torch.empty_like(self.absmax, dtype=torch.float32)
            absmax.copy_(self.absmax).add_(self.offset)
        out = self.weight.new_empty(self.out_features, self.in_features, dtype=self.orig_dtype)
        del absmax
        return out if dtype is None else out.to(dtype)

    @property
    def W_q(self) -> torch.Tensor:  # noqa: N802 - the attribute name peft looks for
        """peft's `dequantize_module_weight` dequantises a module that has a `W_q` (its
        hook for HQQ layers) by calling `module.dequantize()`: DoRA's weight norm over a
        quantised base reads the weight so, as it reads bitsandbytes' (QDoRA)."""
        return self.weight

    def gemm(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """`gemm_4bit`'s dequantise + `F.linear` path (`_dequant_linear_fallback`): with
        double quantisation the fp32 absmax and `absmax + offset` stay alive to the end.
        Before 0.43.2 (`keeps_input`): `F.linear(A, dequantize_4bit(B).to(A.dtype).t())`."""
        if self.keeps_input:
            w = self.dequantize(x.dtype)
            out = F.linear(x, w, bias)
            del w
            return out
        absmax = self.absmax
        held = None
        if self.nested:
            held = torch.empty_like(self.absmax, dtype=torch.float32)
            held.copy_(self.absmax)
            absmax = held + self.offset
        w = self.weight.new_empty(self.out_features, self.in_features, dtype=x.dtype)
        out = F.linear(x, w, bias)
        del absmax, held, w
        return out


class _MatMul4Bit(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, layer: Linear4bitSim, bias: torch.Tensor | None):
        ctx.layer = layer
        if layer.keeps_input and ctx.needs_input_grad[0]:
            # bitsandbytes < 0.43.2: `ctx.tensors = (A, B)`, a ctx attribute, not a saved
            # tensor: A lives as long as this graph node, through backward and beyond
            ctx.tensors = (x,)
        return layer.gemm(x, bias)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):
        layer = ctx.layer
        grad_x = None
        if ctx.needs_input_grad[0]:
            grad_x = torch.matmul(grad, layer.dequantize(grad.dtype))
        return grad_x, None, None


class Linear4bitSim(nn.Module, _Dequant4bit):
    """`bnb.nn.Linear4bit` (nf4, blocksize 64, uint8 storage) on its CUDA path."""

    def __init__(
        self,
        linear: nn.Module,
        *,
        nested: bool,
        compute: torch.dtype,
        shared_code: torch.Tensor | None = None,
        keeps_input: bool = False,
        storage: torch.dtype = torch.uint8,
    ):
        super().__init__()
        weight = linear.weight
        if type(linear).__name__ == "Conv1D":  # (in, out) storage
            n_in, n_out = weight.shape
        else:
            n_out, n_in = weight.shape
        self.in_features, self.out_features = int(n_in), int(n_out)
        self.infeatures, self.outfeatures = self.in_features, self.out_features  # peft reads
        self.nested, self.compute_dtype, self.orig_dtype = nested, compute, weight.dtype
        self.keeps_input = keeps_input  # bitsandbytes < 0.43.2 (TrainSpec.bnb_keeps_input)
        n = self.in_features * self.out_features
        blocks = _cdiv(n, BLOCKSIZE)
        dev = weight.device
        packed = (n + 1) // (2 * storage.itemsize)  # bnb_4bit_quant_storage's elements
        self.weight = nn.Parameter(
            torch.empty(packed, 1, dtype=storage, device=dev), requires_grad=False
        )
        self.bias = linear.bias
        self.register_buffer("code", torch.empty(16, dtype=torch.float32, device=dev))
        if nested:
            self.register_buffer("absmax", torch.empty(blocks, dtype=torch.uint8, device=dev))
            self.register_buffer("offset", torch.empty((), dtype=torch.float32, device=dev))
            self.register_buffer(
                "absmax2",
                torch.empty(_cdiv(blocks, NESTED_BLOCKSIZE), dtype=torch.float32, device=dev),
            )
            self.register_buffer("code2", torch.empty(256, dtype=torch.float32, device=dev))
            # bitsandbytes' module-level dynamic map (`name2qmap["dynamic"]`), one per device
            self.register_buffer("dynamic_code", shared_code)
        else:
            self.register_buffer("absmax", torch.empty(blocks, dtype=torch.float32, device=dev))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inp_dtype = x.dtype
        x = x.to(self.compute_dtype)
        bias = self.bias
        if bias is not None:
            if bias.dtype != x.dtype:
                bias.data = bias.data.to(x.dtype)
            bias = bias.to(self.compute_dtype)
        needs_grad = torch.is_grad_enabled() and (
            x.requires_grad or (bias is not None and bias.requires_grad)
        )
        if needs_grad:
            out = _MatMul4Bit.apply(x, self, bias)
        else:
            out = self.gemm(x, bias)
        return out.to(inp_dtype)


class _MatMul8bitLt(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, layer: Linear8bitSim, bias: torch.Tensor | None):
        shape = x.shape
        a = x.reshape(-1, shape[-1])
        a16 = a.to(torch.float16)
        # int8_vectorwise_quant(A, threshold): row stats, int8 rows, the outlier scan
        sca = a16.new_empty(a16.shape[0], dtype=torch.float32)
        ca = torch.empty_like(a16, dtype=torch.int8)
        outliers = a16.abs() >= INT8_THRESHOLD
        outliers.any()  # no outlier column (see module docstring)
        del outliers, a16
        # int8_scaled_mm: int32 product, fp16 dequantisation (+ bias), cast to A's dtype
        prod = ca.new_empty(ca.shape[0], layer.out_features, dtype=torch.int32)
        out16 = prod.to(torch.float16)
        if bias is not None and bias.dtype != torch.float16:
            out16.add_(bias)
        out = out16.to(x.dtype)
        del out16, prod, ca, sca
        ctx.layer, ctx.dtype, ctx.shape = layer, x.dtype, shape
        if ctx.needs_input_grad[0]:
            ctx.saved_a = a  # MatMul8bitLt keeps (CAt, subA, A) as ctx.tensors
        return out.reshape(*shape[:-1], layer.out_features)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):
        layer = ctx.layer
        grad = grad.reshape(-1, grad.shape[-1]).contiguous()
        cb = layer.weight.to(ctx.dtype, copy=True)
        cb.mul_(layer.SCB.unsqueeze(1).mul(1.0 / 127.0))
        grad_x = torch.matmul(grad.to(ctx.dtype), cb).view(ctx.shape)
        return grad_x, None, None


class Linear8bitSim(nn.Module):
    """`bnb.nn.Linear8bitLt` (LLM.int8, threshold 6.0, frozen int8 weight) on CUDA."""

    def __init__(self, linear: nn.Module):
        super().__init__()
        weight = linear.weight
        if type(linear).__name__ == "Conv1D":
            n_in, n_out = weight.shape
        else:
            n_out, n_in = weight.shape
        self.in_features, self.out_features = int(n_in), int(n_out)
        self.infeatures, self.outfeatures = self.in_features, self.out_features
        dev = weight.device
        self.weight = nn.Parameter(
            torch.empty(n_out, n_in, dtype=torch.int8, device=dev), requires_grad=False
        )
        self.bias = linear.bias
        self.register_buffer("SCB", torch.empty(self.out_features, dtype=torch.float32, device=dev))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.bias is not None and self.bias.dtype != x.dtype:
            self.bias.data = self.bias.data.to(x.dtype)
        return _MatMul8bitLt.apply(x, self, self.bias)

    def dequantize(self) -> torch.Tensor:
        """`F.int8_vectorwise_dequant(CB, SCB)` (what peft's DoRA reads): its kernel
        computes `CB * SCB[:, None]` (fp32) and scales that into the fp32 output."""
        scaled = self.weight.new_empty(self.out_features, self.in_features, dtype=torch.float32)
        out = torch.empty_like(scaled)
        del scaled
        return out

    @property
    def W_q(self) -> torch.Tensor:  # noqa: N802 - the attribute name peft looks for
        """See `Linear4bitSim.W_q`: peft's DoRA dequantises this layer through it."""
        return self.weight


QUANTIZED_TYPES = (Linear4bitSim, Linear8bitSim)


def modules_to_not_convert(model: nn.Module) -> list[str]:
    """transformers' `get_keys_to_not_convert` + `_keep_in_fp32_modules` for an HF model;
    else the module of the last parameter (the same rule's 'last module')."""
    keys: list[str] = []
    try:
        from transformers import PreTrainedModel
        from transformers.quantizers.base import get_keys_to_not_convert
    except ImportError:  # transformers absent, or older than its quantizers.base helper
        PreTrainedModel = None  # noqa: N806
    if PreTrainedModel is not None and isinstance(model, PreTrainedModel):
        keys = list(get_keys_to_not_convert(model))
        keys += list(getattr(model, "_keep_in_fp32_modules", None) or [])
        return sorted(set(keys))
    names = [name for name, _ in model.named_parameters()]
    return [names[-1].rsplit(".", 1)[0]] if names else []


def _should_convert(name: str, skip: list[str]) -> bool:
    """transformers' `should_convert_module`; without it, its prefix-at-a-module-boundary
    and suffix rules (not the regex one)."""
    try:
        from transformers.quantizers.quantizers_utils import should_convert_module
    except ImportError:
        return not any(name == k or name.startswith(k + ".") or name.endswith(k) for k in skip)
    return should_convert_module(name, skip)


def quantize_model(model: nn.Module, train: TrainSpec) -> list[str]:
    """Swap the Linear layers transformers would quantise for `--quantize-base`'s modules;
    the names swapped. The replaced fp weights are dropped (a quantising load never holds
    them on the device)."""
    kind = train.quant.base
    if kind == "none":
        return []
    skip = modules_to_not_convert(model)
    compute = compute_dtype(train)
    shared = None
    chosen = [
        (name, m)
        for name, m in model.named_modules()
        if name
        # transformers' replace_with_bnb_linear tests isinstance: subclasses such as
        # Falcon's FalconLinear are quantised too
        and (isinstance(m, nn.Linear) or type(m).__name__ == "Conv1D")
        and not isinstance(m, (Linear4bitSim, Linear8bitSim))
        and _should_convert(name, skip)
    ]
    for name, m in chosen:
        parent_name, _, leaf = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        if kind == "int8":
            new: nn.Module = Linear8bitSim(m)
        else:
            if kind == "nf4-dq" and shared is None:
                shared = torch.empty(256, dtype=torch.float32, device=m.weight.device)
            new = Linear4bitSim(
                m,
                nested=kind == "nf4-dq",
                compute=compute,
                shared_code=shared,
                keeps_input=train.quant.keeps_input,
                storage=STORAGES[train.quant.quant_storage],
            )
        setattr(parent, leaf, new)
    if not chosen:
        raise ValueError(
            f"--quantize-base {kind}: {type(model).__name__} has no Linear to quantise"
        )
    log.debug("quantised %d linears (%s); kept: %s", len(chosen), kind, skip)
    return [name for name, _ in chosen]


def hold_quant_state(model: nn.Module) -> None:
    """Move every 4-bit stand-in's quant state out of its buffers into plain attributes,
    as bitsandbytes holds it (`module.quant_state`): what FSDP/DDP wrap next neither
    shards, broadcasts nor casts it (see the module docstring)."""
    for m in model.modules():
        if isinstance(m, Linear4bitSim) and m._buffers:
            held = {name: m._buffers.pop(name) for name in list(m._buffers)}
            for name, t in held.items():
                object.__setattr__(m, name, t)
            m._held_state = list(held)


def quant_state_tensors(model: nn.Module) -> list[torch.Tensor]:
    """The quant-state tensors `hold_quant_state` took out of module state (each rank's)."""
    return [
        getattr(m, name)
        for m in model.modules()
        if isinstance(m, Linear4bitSim)
        for name in getattr(m, "_held_state", ())
        if getattr(m, name) is not None
    ]
