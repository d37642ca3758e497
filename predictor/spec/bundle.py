"""`ModelBundle`: everything needed to run one training step of a model.

How to build it, how to make a batch at any sizes (concrete ints or symbolic sizes alike),
and the loss; plus the repeated blocks that activation checkpointing wraps and the depth
knob that repeated-block capture uses.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

__all__ = ["InputMaker", "LossFn", "ModelBundle", "check_size", "default_blocks"]

_SYMBOL_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")

InputMaker = Callable[[Mapping[str, Any], torch.device, torch.dtype], dict[str, torch.Tensor]]
LossFn = Callable[[nn.Module, dict[str, torch.Tensor]], torch.Tensor]


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
    # How the user named it: "zoo", "hf" or "py" (set by the resolver; "" = from the name).
    origin: str = ""
    # The dtype the model's checkpoint is stored in (an hf: config's `dtype`, e.g.
    # "bfloat16"), when the bundle knows it: the answer warns when the step trains fp32
    # weights of a bf16/fp16 checkpoint by default (`answer.predict.precision_warning`).
    stored_dtype: str | None = None
    # Depth knob: `layers` identical blocks, and `with_layers(n)` the same model with n of
    # them (a config's num_hidden_layers); capture then records a few and replicates one
    # (`predictor.capture.replicate`). None: the model is captured in full.
    layers: int | None = None
    with_layers: Callable[[int], ModelBundle] | None = None

    def __post_init__(self) -> None:
        if self.origin not in ("", "zoo", "hf", "py"):
            raise ValueError(f"model {self.name!r}: unknown origin {self.origin!r}")
        if (self.layers is None) != (self.with_layers is None):
            raise ValueError(f"model {self.name!r}: give both layers and with_layers, or neither")
        if self.layers is not None and self.layers < 1:
            raise ValueError(f"model {self.name!r}: layers must be >= 1, got {self.layers}")
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
