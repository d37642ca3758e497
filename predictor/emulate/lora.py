"""LoRA through the peft library: what it adapts and how (`emulate.peft` applies it).

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

The target names here (`--lora-targets`, `all-linear`) serve every peft method with a
`target_modules` field.
"""

from __future__ import annotations

from memgnn.predictor.spec.train import TrainSpec
from torch import nn

__all__ = ["all_linear", "lora_targets", "module_names"]


def lora_targets(train: TrainSpec) -> list[str] | None:
    """The target module names of `--lora-targets`; None: peft's default for the model.
    `all-linear` (peft's shorthand) is expanded by `emulate.peft` on the built model."""
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
