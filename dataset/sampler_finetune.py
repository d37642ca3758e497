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
  GPU device (flash only from sm 80 and in fp16/bf16 compute), among those the model class takes
  (`attention_kernels`: T5 has no flash), where the installed TrainSpec has the field;
- bitsandbytes' 8-bit AdamW (`optimizer="adamw8bit"`, kind "adamw8bit") in place of a
  drawn Adam / AdamW on a GPU device, with probability `ADAMW8BIT_SHARE`.

Fields the installed TrainSpec lacks are feature-detected and never drawn, and a value
its validation rejects is left out, so the sampler runs before and after those options
land. The draws use their own RNG (the caller's `finetune` stream): the hparams, base
training config and sizes of every config stay what they were without them.
"""

from __future__ import annotations

import functools
import importlib.util
import random
from typing import Any

from memgnn.predictor.spec.train import BY_NAME, TrainSpec
from torch import nn

__all__ = [
    "FINETUNE_KINDS",
    "ADAMW8BIT_SHARE",
    "ATTENTION_KERNELS",
    "attention_kernels",
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
QUANTIZE_BASES = ("nf4", "nf4-dq", "int8")
ADAMW8BIT_SHARE = 0.3  # of the Adam / AdamW configs on a GPU device
ATTENTION_KERNELS = ("eager", "sdpa", "flash")
# what can be drawn; a corpus pins its own (corpus-v1: LoRA only, built before the rest)
FINETUNE_KINDS = ("lora", "qlora", "attention", "adamw8bit")
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


def attention_kernels(model: nn.Module) -> list[str]:
    """The ATTENTION_KERNELS `predictor.emulate.attention.apply_attention` accepts for `model` (a
    throwaway build: its attention implementation is left set to the last one tried)."""
    from memgnn.predictor.emulate.attention import apply_attention

    kernels = []
    for kernel in ATTENTION_KERNELS:
        try:
            apply_attention(model, TrainSpec.of(attention=kernel), fake=True)
        except (ValueError, ImportError):
            continue
        kernels.append(kernel)
    return kernels


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
    """Does the installed TrainSpec have the option `name`?"""
    return name in BY_NAME


def _valid(base: dict[str, Any], extra: dict[str, Any]) -> bool:
    try:
        TrainSpec.of(**base | extra)
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
    lora_share: float = LORA_SHARE,
    kernels: list[str] | None = None,
) -> dict[str, Any]:
    """TrainSpec fields to add to `base` (a TrainSpec's fields) for one config (see the
    module docstring). `transformers`: the family is a transformers model; `modules`: its
    `lora_modules`, with its `peft_default` under "default"; `gpu`/`sm`: the device;
    `kinds`: which of FINETUNE_KINDS may be drawn; `lora_share`: the probability of LoRA;
    `kernels`: the attention kernels the model takes (None: every one).
    Always takes the same numbers from `rng`, whatever it draws (the 8-bit AdamW draw comes
    last, so configs drawn before it existed keep their other draws)."""
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
    if lora_ok and u_lora < lora_share:
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
        allowed = ATTENTION_KERNELS if kernels is None else kernels
        # flash-attn: sm 80+ and fp16/bf16 compute (`predictor.emulate.attention.check_attention`)
        flash_ok = (sm or 0) >= 80 and base.get("precision", "fp32") != "fp32"
        allowed = [k for k in allowed if k != "flash" or flash_ok]
        kernel = allowed[int(u_attention * len(allowed))] if allowed else None
        if kernel is not None and _valid(base, extra | {"attention": kernel}):
            extra["attention"] = kernel
    u_8bit = rng.random()
    adam = base.get("optimizer") in ("adam", "adamw")
    if "adamw8bit" in kinds and gpu and adam and u_8bit < ADAMW8BIT_SHARE:
        eight = {"optimizer": "adamw8bit", "optimizer_impl": "auto"}
        if _valid(base, extra | eight):
            extra |= eight
    return extra
