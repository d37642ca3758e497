"""LoRA through the peft library, applied to a built model as `get_peft_model` does it.

peft freezes every base parameter (no gradient, no optimizer state for it), adds the
`lora_A`/`lora_B` adapter weights next to each target module, and with `lora_dropout > 0`
a dropout on each adapter's input, whose masks are saved for backward. The step then trains
only what is left with `requires_grad` (see `predictor.capture.step.TrainingStep`).

Adapter dtype (`TrainSpec.lora_dtype`): `fp32`, peft's default, upcasts bf16/fp16 adapters
to fp32 (`get_peft_model(autocast_adapter_dtype=True)`), and each adapted layer then casts
its input to fp32 before dropout and `lora_A` (`LoraLayer._cast_input_dtype`): the fp32
copy, the dropout's fp32 output and mask are saved per adapted module. `model` keeps the
adapters in the base's dtype (`autocast_adapter_dtype=False`), so no cast happens and
dropout runs on the input as is: the pattern of LitGPT's own `LoRALinear` under bf16-true
(`lora_dropout(x) @ lora_A.T @ lora_B.T * scaling`, added to the frozen linear's output).

peft is optional: imported here only when a spec asks for LoRA; a missing install is a
ValueError telling the user to install memgnn[peft].
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import torch
from memgnn.predictor.spec.train import TrainSpec
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor

logger = logging.getLogger(__name__)

__all__ = ["all_linear", "apply_lora", "lora_targets", "module_names"]


def lora_targets(train: TrainSpec) -> list[str] | None:
    """The target module names of `--lora-targets`; None: peft's default for the model.
    `all-linear` (peft's shorthand) is expanded by `apply_lora` on the built model."""
    names = [t.strip() for t in train.adapter.targets.split(",") if t.strip()]
    return names or None


def module_names(model: nn.Module) -> list[str]:
    """The leaf names (last dotted part) of the Linear and Conv1D modules LoRA can target,
    subclasses included (Falcon's FalconLinear is an nn.Linear, as peft sees it)."""
    kinds = {"Linear", "Conv1D", "Conv2d", "Embedding", "Linear4bitSim", "Linear8bitSim"}
    return sorted(
        {
            name.rsplit(".", 1)[-1]
            for name, m in model.named_modules()
            if any(c.__name__ in kinds for c in type(m).__mro__)
        }
    )


_LINEAR_KINDS = ("Linear", "Conv1D", "Linear4bitSim", "Linear8bitSim")


def all_linear(model: nn.Module) -> list[str]:
    """peft's `all-linear` (`_maybe_include_all_linear_layers`): the names of every Linear /
    Conv1D module, the quantised bases included, except the output embeddings (the
    lm_head) of a model that has them. peft matches bitsandbytes' Linear4bit as an
    nn.Linear; memgnn's stand-ins are no nn.Linear, so the rule is applied here."""
    get_output = getattr(model, "get_output_embeddings", None)
    output = get_output() if callable(get_output) else None
    return [
        name
        for name, m in model.named_modules()
        if name and m is not output and any(c.__name__ in _LINEAR_KINDS for c in type(m).__mro__)
    ]


def apply_lora(model: nn.Module, train: TrainSpec) -> nn.Module:
    """`peft.get_peft_model(model, LoraConfig(...))` for `train`; a target the model lacks
    is a ValueError naming --lora-targets and the module names the model has."""
    try:
        import peft
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ValueError("--peft lora needs the peft library: install memgnn[peft]") from exc
    targets = lora_targets(train)
    if targets == ["all-linear"]:
        targets = all_linear(model)  # full module names: peft matches them as they are
    elif targets is not None:
        have = set(module_names(model))
        missing = [t for t in targets if t not in have]
        if missing:
            raise ValueError(
                f"--lora-targets: {type(model).__name__} has no module named "
                f"{', '.join(missing)}; its Linear/Conv/Embedding module names: "
                f"{', '.join(sorted(have)) or 'none'}"
            )
    config = peft.LoraConfig(
        r=train.adapter.r,
        lora_alpha=train.adapter.alpha,
        lora_dropout=train.adapter.dropout,
        target_modules=targets,
    )
    if train.quant.base != "none":
        from memgnn.predictor.emulate.quant_lora import register_quant_layers

        register_quant_layers(config)
    try:
        with _fake_safe_adapter_moves():
            wrapped: Any = peft.get_peft_model(
                model, config, autocast_adapter_dtype=train.adapter.dtype == "fp32"
            )
    except ValueError as exc:
        hint = ""
        if targets is None:
            hint = f"; name them with --lora-targets (modules: {', '.join(module_names(model))})"
        raise ValueError(f"--peft lora on {type(model).__name__}: {exc}{hint}") from exc
    trainable = sum(p.numel() for p in wrapped.parameters() if p.requires_grad)
    logger.debug(
        "LoRA r=%d targets=%s: %d trainable parameters", train.adapter.r, targets, trainable
    )
    return wrapped


def _recast(module: nn.Module, dtype: torch.dtype) -> None:
    """Floating parameters and buffers of `module` rebuilt in `dtype` (no-op where equal)."""
    for m in module.modules():
        for name, p in m._parameters.items():
            if p is not None and p.is_floating_point() and p.dtype != dtype:
                m._parameters[name] = nn.Parameter(p.detach().to(dtype), p.requires_grad)
        for name, b in m._buffers.items():
            if b is not None and b.is_floating_point() and b.dtype != dtype:
                m._buffers[name] = b.to(dtype)


@contextlib.contextmanager
def _fake_safe_adapter_moves() -> Iterator[None]:
    """peft moves each new adapter to its base layer's device and dtype with `Module.to`,
    which (torch 2.13) swaps FakeTensor parameters and fails on the weakrefs the fake mode
    holds. The step builds adapters in the base's device and dtype already, so on fake
    tensors that move is a no-op: while peft wraps the model, a `Module.to` whose tensors
    are all fake and already where (and in the dtype) it asks returns the module as is."""
    original = nn.Module.to

    def to(self: nn.Module, *args: Any, **kwargs: Any) -> nn.Module:
        device, dtype, _, _ = torch._C._nn._parse_to(*args, **kwargs)
        tensors = [*self.parameters(), *self.buffers()]
        if tensors and all(
            isinstance(t, FakeTensor) and (device is None or t.device == device) for t in tensors
        ):
            if dtype is not None:
                _recast(self, dtype)
            return self
        return original(self, *args, **kwargs)

    nn.Module.to = to  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.to = original  # type: ignore[method-assign]
