"""peft's LoRA layer over a quantised base (`predictor.emulate.quant`), as peft runs it over bnb's.

peft wraps `bnb.nn.Linear4bit` / `Linear8bitLt` in its own layers (`peft.tuners.lora.bnb`,
peft 0.21.2), which exist only where bitsandbytes imports and differ from its plain
`lora.Linear` in memory: the 4-bit layer clones the base output ("defensively", per its
comment), and both cast the adapter output back to the base output's dtype before adding
it (plain LoRA adds in the adapter dtype, then casts). `QuantLoraLinear` is that forward
for the capture's stand-ins, registered through peft's custom-module API
(`LoraConfig._register_custom_module`), so `get_peft_model` dispatches to it as it would
to its bnb layers. Its `update_layer` and adapters are peft's own (`LoraLayer`), and so is
DoRA (`use_dora`: peft's `DoraLinearVariant`, which dequantises the base weight for its
weight norm through `dequantize_module_weight`; the stand-ins answer it as bitsandbytes'
`dequantize_4bit` / `int8_vectorwise_dequant` allocate, see `Linear4bitSim.W_q`).

peft checks `torch.is_autocast_enabled()` (CUDA autocast) to skip its casts; the capture
runs CUDA autocast as CPU autocast, so either counts here.
"""

from __future__ import annotations

from typing import Any

import torch
from memgnn.predictor.emulate.quant import Linear4bitSim, Linear8bitSim
from peft import LoraConfig
from peft.tuners.lora.layer import LoraLayer, LoraVariant
from peft.tuners.lora.variants import DoraLinearVariant
from torch import nn

__all__ = ["QuantLoraLinear", "register_quant_layers"]


def _autocast_on() -> bool:
    return torch.is_autocast_enabled("cuda") or torch.is_autocast_enabled("cpu")


class QuantLoraLinear(nn.Module, LoraLayer):
    """LoRA on a `Linear4bitSim` / `Linear8bitSim` base, as peft's bnb layers run it."""

    def __init__(
        self,
        base_layer: nn.Module,
        adapter_name: str,
        config: LoraConfig,
        r: int = 0,
        lora_alpha: int = 1,
        **kwargs: Any,
    ) -> None:
        super().__init__()
        LoraLayer.__init__(self, base_layer)
        self.fan_in_fan_out = False
        self._active_adapter = adapter_name
        self.update_layer(adapter_name, r, lora_alpha=lora_alpha, config=config)

    def resolve_lora_variant(self, *, config: LoraConfig, **kwargs: Any) -> LoraVariant | None:
        """DoRA (`use_dora`), as peft's bnb layers resolve it; no other variant."""
        return DoraLinearVariant() if config.use_dora else None

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        result = self.base_layer(x, *args, **kwargs)
        if self.disable_adapters or self.merged:
            return result
        if isinstance(self.get_base_layer(), Linear4bitSim):
            result = result.clone()
        for name in self.active_adapters:
            if name not in self.lora_A:
                continue
            lora_a, lora_b = self.lora_A[name], self.lora_B[name]
            dropout, scaling = self.lora_dropout[name], self.scaling[name]
            convert = not _autocast_on()
            if convert:
                expected = result.dtype
                x = self._cast_input_dtype(x, lora_a.weight.dtype)
            if name in self.lora_variant:  # DoRA: peft's own variant, its result in full
                result = self.lora_variant[name].forward(
                    self, active_adapter=name, x=x, result=result
                )
                if convert:
                    result = result.to(expected)
                continue
            output = lora_b(lora_a(dropout(x))) * scaling
            if convert:
                output = output.to(expected)
            result = result + output
        return result


def register_quant_layers(config: LoraConfig) -> LoraConfig:
    """Let `get_peft_model` wrap the quantised stand-ins with `QuantLoraLinear`."""
    config._register_custom_module({Linear4bitSim: QuantLoraLinear, Linear8bitSim: QuantLoraLinear})
    return config
