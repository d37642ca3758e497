"""Fine-tuning draws of the corpus sampler: LoRA, QLoRA and the attention kernel.

`draw_finetune` adds TrainSpec fields to a drawn config:
- LoRA (`peft="lora"`) on the transformers families, with probability `LORA_SHARE`:
  rank in `LORA_RANKS`, alpha r, 2r or 16, dropout 0, 0.05 or 0.1 (its masks are saved
  for backward), and targets drawn from the model's own module names: peft's default for
  the model (where peft has one), its attention projections, or attention and MLP
  (`lora_modules`, read from the repeated blocks of a meta-device build, so names follow
  the model's code); only where peft is installed;
- QLoRA (`quantize_base` nf4 / int8) on a LoRA config on a GPU device, with probability
  `QLORA_SHARE`, where the installed TrainSpec has the field;
- the attention kernel (`attention` eager / sdpa / flash) of a transformers config on a
  GPU device (flash only from sm 80), where the installed TrainSpec has the field.

Fields the installed TrainSpec lacks are feature-detected and never drawn, and a value
its validation rejects is left out, so the sampler runs before and after those options
land. The draws use their own RNG (the caller's `finetune` stream): the hparams, base
training config and sizes of every config stay what they were without them.
"""

from __future__ import annotations

import functools
import importlib.util
import random
from dataclasses import fields
from typing import Any

from memgnn.predictor.spec import TrainSpec
from torch import nn

__all__ = [
    "FINETUNE_KINDS",
    "ATTENTION_KERNELS",
    "LORA_RANKS",
    "LORA_SHARE",
    "QLORA_SHARE",
    "QUANTIZE_BASES",
    "draw_finetune",
    "lora_modules",
    "peft_default",
    "supported",
]

LORA_RANKS = (4, 8, 16, 64)
LORA_DROPOUTS = (0.0, 0.05, 0.1)
LORA_SHARE = 0.3  # of the configs of a transformers family
QLORA_SHARE = 0.4  # of the LoRA configs on a GPU device
QUANTIZE_BASES = ("nf4", "int8")
ATTENTION_KERNELS = ("eager", "sdpa", "flash")
# what can be drawn; a corpus pins its own (corpus-v1: LoRA only, built before the rest)
FINETUNE_KINDS = ("lora", "qlora", "attention")
_LINEAR = ("Linear", "Conv1D")
_ATTENTION_WORDS = ("attn", "attention")


def lora_modules(blocks: list[nn.Module]) -> dict[str, list[str]]:
    """Leaf names of the Linear / Conv1D modules inside the repeated `blocks`:
    {"attention": names found only under an attention module, "all": every name}.
    A name found both under attention and outside it (GPT-2's `c_proj`, BERT's `dense`)
    is in "all" only: peft matches targets by name, so it would adapt both."""
    inside: set[str] = set()
    outside: set[str] = set()
    for block in blocks:
        for path, module in block.named_modules():
            if type(module).__name__ not in _LINEAR or not path:
                continue
            parts = path.lower().split(".")
            if any("router" in p for p in parts):  # an MoE router is not adapted
                continue
            leaf = path.rsplit(".", 1)[-1]
            under_attention = any(w in p for p in parts[:-1] for w in _ATTENTION_WORDS)
            (inside if under_attention else outside).add(leaf)
    return {"attention": sorted(inside - outside), "all": sorted(inside | outside)}


def peft_default(model: nn.Module) -> list[str]:
    """peft's default LoRA targets for the model's `config.model_type` ([] if none)."""
    if not _peft_installed():
        return []
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING

    model_type = getattr(getattr(model, "config", None), "model_type", None)
    return list(TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING.get(model_type) or [])


@functools.cache
def _peft_installed() -> bool:
    return importlib.util.find_spec("peft") is not None


def supported(name: str) -> bool:
    """Does the installed TrainSpec have the field `name`?"""
    return name in {f.name for f in fields(TrainSpec)}


def _valid(base: dict[str, Any], extra: dict[str, Any]) -> bool:
    try:
        TrainSpec(**base | extra)
    except (TypeError, ValueError):
        return False
    return True


def draw_finetune(
    rng: random.Random,
    base: dict[str, Any],
    *,
    transformers: bool,
    modules: dict[str, list[str]] | None,
    gpu: bool,
    sm: int | None,
    kinds: tuple[str, ...] = FINETUNE_KINDS,
) -> dict[str, Any]:
    """TrainSpec fields to add to `base` (a TrainSpec's fields) for one config (see the
    module docstring). `transformers`: the family is a transformers model; `modules`: its
    `lora_modules`, with its `peft_default` under "default"; `gpu`/`sm`: the device;
    `kinds`: which of FINETUNE_KINDS may be drawn.
    Always takes the same numbers from `rng`, whatever it draws."""
    extra: dict[str, Any] = {}
    modules = modules or {}
    u_lora, u_qlora, u_attention = rng.random(), rng.random(), rng.random()
    r, alpha_pick = rng.choice(LORA_RANKS), rng.randrange(3)
    dropout, target_pick = rng.choice(LORA_DROPOUTS), rng.randrange(3)
    quant = rng.choice(QUANTIZE_BASES)
    lora_ok = (
        "lora" in kinds
        and transformers
        and supported("peft")
        and _peft_installed()
        and bool(modules)
    )
    if lora_ok and u_lora < LORA_SHARE:
        options = [""] if modules.get("default") else []  # "": peft's default for the model
        options += [",".join(modules[k]) for k in ("attention", "all") if modules.get(k)]
        targets = options[target_pick % len(options)] if options else None
    else:
        targets = None
    if targets is not None:
        lora = {
            "peft": "lora",
            "lora_r": r,
            "lora_alpha": float((r, 2 * r, 16)[alpha_pick]),
            "lora_dropout": dropout,
            "lora_targets": targets,
        }
        if _valid(base, lora):
            extra |= lora
    qlora_ok = "qlora" in kinds and supported("quantize_base")
    if extra and gpu and qlora_ok and u_qlora < QLORA_SHARE:
        if _valid(base, extra | {"quantize_base": quant}):
            extra["quantize_base"] = quant
    if "attention" in kinds and transformers and gpu and supported("attention"):
        kernels = [k for k in ATTENTION_KERNELS if k != "flash" or (sm or 0) >= 80]
        kernel = kernels[int(u_attention * len(kernels))]
        if _valid(base, extra | {"attention": kernel}):
            extra["attention"] = kernel
    return extra
