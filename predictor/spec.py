"""Specs shared by capture, profiling and prediction: what model, which sizes, how it trains.

`ModelBundle` is everything needed to run one training step of a model: how to build it,
how to make a batch at any sizes (concrete ints or symbolic sizes alike), and the loss.
`TrainSpec` is how the step runs (precision, optimizer, checkpointing, accumulation).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

PRECISIONS = ("fp32", "bf16", "fp16", "amp-bf16", "amp-fp16")
TORCH_OPTIMIZERS = ("sgd", "adam", "adamw", "adafactor")  # torch.optim's
OPTIMIZERS = (*TORCH_OPTIMIZERS, "adamw8bit")  # + bitsandbytes' AdamW8bit (predictor/optim8bit.py)
PEFT_METHODS = ("none", "lora")
# bitsandbytes-quantised frozen base (QLoRA): see predictor/quant.py
QUANTIZE_BASES = ("none", "nf4", "nf4-dq", "int8")
OPTIMIZER_IMPLS = ("auto", "foreach", "fused", "for-loop")
STEP_KINDS = ("first", "steady", "both")
_CKPT_RE = re.compile(r"^(none|full|blocks:(\d+))$")
_SYMBOL_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")

InputMaker = Callable[[Mapping[str, Any], torch.device, torch.dtype], dict[str, torch.Tensor]]
LossFn = Callable[[nn.Module, dict[str, torch.Tensor]], torch.Tensor]


@dataclass(kw_only=True, slots=True)
class TrainSpec:
    """How one training step runs. Defaults are what a plain PyTorch loop does."""

    precision: str = "fp32"
    optimizer: str = "adamw"
    optimizer_impl: str = "auto"  # auto = what PyTorch picks for the target device
    lr: float = 1e-3
    checkpointing: str = "none"  # none | full | blocks:N (the first N blocks)
    grad_accum: int = 1
    set_to_none: bool = True  # optimizer.zero_grad(set_to_none=...)
    steps: str = "both"  # first | steady | both
    # parameter-efficient fine-tuning through the peft library (see predictor/lora.py)
    peft: str = "none"  # none | lora
    lora_r: int = 8
    lora_alpha: float = 16.0
    lora_dropout: float = 0.0  # peft's LoraConfig default
    lora_targets: str = ""  # comma-separated module names; "" = peft's default for the model
    # the frozen base's Linear layers in bitsandbytes storage (CUDA targets, with peft lora):
    # nf4 = Linear4bit NF4 (BitsAndBytesConfig's default, LitGPT's bnb.nf4), nf4-dq = with
    # double quantisation (bnb_4bit_use_double_quant, LitGPT's bnb.nf4-dq), int8 = LLM.int8()
    quantize_base: str = "none"  # none | nf4 | nf4-dq | int8

    def __post_init__(self) -> None:
        if self.peft not in PEFT_METHODS:
            raise ValueError(f"unknown --peft {self.peft!r}; expected one of {PEFT_METHODS}")
        if self.lora_r < 1:
            raise ValueError(f"--lora-r must be >= 1, got {self.lora_r}")
        if not self.lora_alpha > 0:
            raise ValueError(f"--lora-alpha must be > 0, got {self.lora_alpha}")
        if not 0.0 <= self.lora_dropout < 1.0:
            raise ValueError(f"--lora-dropout must be in [0, 1), got {self.lora_dropout}")
        if self.quantize_base not in QUANTIZE_BASES:
            raise ValueError(
                f"unknown --quantize-base {self.quantize_base!r}; expected one of {QUANTIZE_BASES}"
            )
        if self.quantize_base != "none" and self.peft != "lora":
            raise ValueError(
                f"--quantize-base {self.quantize_base} needs --peft lora: a bitsandbytes-"
                "quantised base is frozen (its weights take no gradient), so only adapters train"
            )
        if self.precision not in PRECISIONS:
            raise ValueError(f"unknown precision {self.precision!r}; expected one of {PRECISIONS}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"unknown optimizer {self.optimizer!r}; expected one of {OPTIMIZERS}")
        if self.optimizer_impl not in OPTIMIZER_IMPLS:
            raise ValueError(
                f"unknown optimizer implementation {self.optimizer_impl!r}; "
                f"expected one of {OPTIMIZER_IMPLS}"
            )
        if self.optimizer == "adamw8bit" and self.optimizer_impl != "auto":
            raise ValueError(
                "--optimizer adamw8bit runs bitsandbytes' own kernel: "
                f"--optimizer-impl must be auto, got {self.optimizer_impl!r}"
            )
        if self.optimizer in ("sgd", "adafactor") and self.optimizer_impl == "fused":
            if self.optimizer == "adafactor":
                raise ValueError("adafactor has no fused implementation")
        if not _CKPT_RE.match(self.checkpointing):
            raise ValueError(
                f"bad checkpointing {self.checkpointing!r}; expected none, full or blocks:N"
            )
        if self.grad_accum < 1:
            raise ValueError(f"grad_accum must be >= 1, got {self.grad_accum}")
        if self.steps not in STEP_KINDS:
            raise ValueError(f"unknown steps {self.steps!r}; expected one of {STEP_KINDS}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")

    @property
    def checkpoint_blocks(self) -> int | None:
        """None: no checkpointing; -1: every block; N: the first N blocks."""
        if self.checkpointing == "none":
            return None
        if self.checkpointing == "full":
            return -1
        return int(self.checkpointing.split(":", 1)[1])

    @property
    def param_dtype(self) -> torch.dtype:
        return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.precision, torch.float32)

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        return {"amp-bf16": torch.bfloat16, "amp-fp16": torch.float16}.get(self.precision)

    @property
    def uses_grad_scaler(self) -> bool:
        return self.precision == "amp-fp16"

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}


@dataclass(kw_only=True, slots=True)
class ModelBundle:
    """A model ready for one training step at any sizes.

    `dims` names the symbolic input sizes with example values (e.g. {"B": 8, "S": 128});
    `make_inputs(sizes, device, float_dtype)` must build the batch from `sizes` alone, so
    it works with ints and with symbolic sizes under a fake-tensor mode alike.
    `loss(model, inputs)` returns the scalar loss. `blocks(model)` lists the repeated
    blocks that activation checkpointing wraps (default: the longest ModuleList).
    """

    name: str
    family: str
    build: Callable[[], nn.Module]
    make_inputs: InputMaker
    loss: LossFn
    dims: dict[str, int]
    hparams: dict[str, Any] = field(default_factory=dict)
    blocks: Callable[[nn.Module], list[nn.Module]] | None = None
    # Data-dependent branches: at most this many paths are enumerated.
    max_paths: int = 16
    # Dims the model's code cannot keep symbolic (e.g. nn.LSTM under fake tensors): a
    # capture fixes them to their trace values and records a guard for each.
    static_dims: tuple[str, ...] = ()
    # Everything that decides the model besides name and hparams, when the bundle knows it
    # (an hf: config's contents); else the capture cache keys on the built model itself.
    fingerprint: str = ""

    def __post_init__(self) -> None:
        if not self.dims:
            raise ValueError(f"model {self.name!r} declares no input dims")
        unknown = set(self.static_dims) - set(self.dims)
        if unknown:
            raise ValueError(f"model {self.name!r}: static dims {sorted(unknown)} are not dims")
        for sym, value in self.dims.items():
            if not _SYMBOL_RE.match(sym):
                raise ValueError(f"model {self.name!r}: bad dim name {sym!r}")
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"model {self.name!r}: dim {sym} must be a positive int")

    def sizes(self, overrides: Mapping[str, int] | None = None) -> dict[str, int]:
        """The example sizes with `overrides` applied; ValueError names a bad symbol/size."""
        out = dict(self.dims)
        for sym, value in (overrides or {}).items():
            if sym not in self.dims:
                raise ValueError(
                    f"size {sym!r} is not an input dim of {self.name!r} (dims: {list(self.dims)})"
                )
            out[sym] = check_size(sym, value)
        return out


def check_size(name: str, value: Any) -> int:
    """A size must be a positive int; the error names it."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"size {name} must be an integer, got {value!r}")
    if value < 1:
        raise ValueError(f"size {name} must be >= 1, got {value}")
    return value


def default_blocks(model: nn.Module) -> list[nn.Module]:
    """The repeated blocks of a model: the longest ModuleList/Sequential of same-type children."""
    best: list[nn.Module] = []
    for module in model.modules():
        if isinstance(module, (nn.ModuleList, nn.Sequential)):
            children = list(module.children())
            if len(children) > len(best) and len({type(c) for c in children}) == 1:
                best = children
    return best
