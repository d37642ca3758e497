"""What configs of the Hugging Face ecosystem share: optimizer names, attention kernels,
bitsandbytes quantisation, PEFT adapter configs, side files (JSON named by a key). Used by the
HF/TRL reader (`hf`) and by axolotl's (`axolotl`), which passes these through to
transformers' Trainer.

Sources (names and defaults):
- `transformers.training_args.OptimizerNames` and `Trainer.get_optimizer_cls_and_kwargs`
  (transformers 5.24.0, installed): `adamw_torch` is `torch.optim.AdamW` with PyTorch's
  implementation choice, `adamw_torch_fused` passes `fused=True`, `adamw_bnb_8bit` /
  `adamw_8bit` / `paged_adamw_8bit` are bitsandbytes' 8-bit AdamW, `sgd` is `torch.optim.SGD`
  with no momentum, `adafactor` is `transformers.optimization.Adafactor`.
- `transformers.BitsAndBytesConfig` (to_dict keys; `bnb_4bit_quant_type` defaults to fp4).
- `peft.LoraConfig.to_dict()` (peft 0.21.2, installed): an adapter_config.json's keys.
DeepSpeed and FSDP settings: `distributed`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from memgnn.predictor.frameworks.base import Builder, is_off
from memgnn.predictor.frameworks.files import flatten

__all__ = [
    "ADAMW_ASSUMED",
    "HF_OPTIMIZERS",
    "read_adapter",
    "read_attention",
    "load_side_file",
    "read_bnb",
    "read_optimizer",
]

ADAMW_ASSUMED = "the answer assumes torch AdamW (two fp32 states per trained parameter)"
_PAGED = (
    "bitsandbytes' paged optimizer keeps its states in CUDA unified memory, which torch's "
    "allocator does not count (max_memory_allocated misses them); the answer counts them "
    "as device memory"
)
# HF optim name -> (memgnn optimizer, optimizer_impl, what the answer notes/assumes or "")
HF_OPTIMIZERS: dict[str, tuple[str, str, str]] = {
    "adamw_torch": ("adamw", "auto", ""),
    "adamw_torch_fused": ("adamw", "fused", ""),
    "adamw_hf": (
        "adamw",
        "for-loop",
        "transformers' own AdamW (before 4.51): a per-parameter loop keeping the same two states",
    ),
    "adamw_apex_fused": ("adamw", "fused", "apex's FusedAdam modelled as torch's fused AdamW"),
    "adafactor": (
        "adafactor",
        "auto",
        "transformers' Adafactor modelled as torch.optim."
        "Adafactor: both keep factored row/column second moments, no momentum",
    ),
    "sgd": (
        "sgd",
        "auto",
        "HF's sgd has no momentum (no state); memgnn's sgd keeps a "
        "momentum buffer: high by one copy of the trained parameters",
    ),
    "adamw_bnb_8bit": ("adamw8bit", "auto", ""),
    "adamw_8bit": ("adamw8bit", "auto", ""),
    "paged_adamw_8bit": ("adamw8bit", "auto", _PAGED),
    "paged_adamw_32bit": ("adamw", "auto", _PAGED),
    "paged_adamw": ("adamw", "auto", _PAGED),
}
_ATTENTION = {"eager": "eager", "sdpa": "sdpa", "flash_attention_2": "flash"}


def read_optimizer(b: Builder, key: str, name: str) -> None:
    """An HF/axolotl `optim` name -> --optimizer / --optimizer-impl, or a warning."""
    found = HF_OPTIMIZERS.get(str(name).lower())
    source = f"{key}: {name}"
    if found is None:
        b.warn(f"{key}: {name}: this optimizer is not modelled yet; {ADAMW_ASSUMED}", key=key)
        return
    optimizer, impl, note = found
    became = b.option("optimizer", optimizer, source)
    if impl != "auto":
        became += " " + b.option("optimizer_impl", impl, source)
    b.read(key, became)
    if note and note.startswith("bitsandbytes' paged"):
        b.warn(f"{key}: {name}: {note}")
    elif note:
        b.reading.keys[-1].became += f" ({note})"


def read_attention(b: Builder, key: str, value: Any) -> None:
    """attn_implementation -> --attention, or a warning for kernels memgnn lacks."""
    if value is None:
        b.read(key, "--attention auto (the model class's default)")
        return
    found = _ATTENTION.get(str(value))
    if found is None:
        b.warn(
            f"{key}: {value}: this attention kernel is not modelled yet; the answer runs "
            "the model class's default attention (sdpa where it supports it)",
            key=key,
        )
        return
    b.read(key, b.option("attention", found, f"{key}: {value}"))


def read_bnb(b: Builder, prefix: str) -> None:
    """A BitsAndBytesConfig dict flattened under `prefix` ("quantization_config.") ->
    --quantize-base nf4 | nf4-dq | int8, each of its keys read or warned."""
    get = lambda k: b.get(prefix + k)  # noqa: E731
    method = get("quant_method")
    if method is not None and str(method).lower() != "bitsandbytes":
        for key in [k for k in b.unhandled() if k.startswith(prefix)]:
            b.warn(
                f"{prefix}quant_method: {method}: this quantisation is not modelled yet; "
                "the answer trains an unquantised base",
                key=key,
            )
        return
    four, eight = bool(get("load_in_4bit")), bool(get("load_in_8bit"))
    kind = "none"
    if four:
        kind = "nf4-dq" if get("bnb_4bit_use_double_quant") else "nf4"
    elif eight:
        kind = "int8"
    source = f"{prefix}load_in_{'4' if four else '8'}bit: true"
    for key in [k for k in b.unhandled() if k.startswith(prefix)]:
        name, value = key[len(prefix) :], b.get(key)
        if name in ("load_in_4bit", "load_in_8bit", "_load_in_4bit", "_load_in_8bit"):
            on = bool(value) and kind != "none"
            b.read(key, b.option("quantize_base", kind, source) if on else "off")
        elif name == "bnb_4bit_use_double_quant":
            b.read(key, f"--quantize-base {kind}" if four else "no memory effect: 8-bit")
        elif name == "bnb_4bit_quant_type":
            why = "fp4 stores as nf4 does (4-bit codes, fp32 absmax per 64)"
            b.read(key, why if value == "fp4" else f"--quantize-base {kind}")
        elif name == "bnb_4bit_compute_dtype":
            b.read(key, "the compute dtype follows --precision (bf16/fp16; fp32 otherwise)")
        elif name == "quant_method":
            b.read(key, "bitsandbytes")
        elif name == "bnb_4bit_quant_storage" and str(value).replace("torch.", "") != "uint8":
            b.warn(
                f"{key}: {value}: 4-bit storage in {value} (FSDP-QLoRA) is not modelled "
                "yet; the answer packs 4-bit codes in uint8 (the same bytes)",
                key=key,
            )
        elif name == "llm_int8_threshold" and value not in (None, 6.0):
            b.warn(
                f"{key}: {value}: memgnn models LLM.int8 at threshold 6.0 with no outlier columns",
                key=key,
            )
        elif name in ("llm_int8_has_fp16_weight", "llm_int8_enable_fp32_cpu_offload") and value:
            b.warn(
                f"{key}: true: not modelled yet; the answer keeps int8 weights on the device",
                key=key,
            )
        elif name == "llm_int8_skip_modules" and value:
            b.warn(
                f"{key}: {value}: not modelled yet; the answer quantises transformers' "
                "default set (every Linear but the lm_head)",
                key=key,
            )
        else:
            b.read(key, "no memory effect: the default")


def _lora_names(value: Any) -> tuple[str | None, str]:
    if value is None:
        return "", "peft's default targets for the model type"
    if isinstance(value, str):
        if value.lower() == "all-linear":
            return "all-linear", ""
        return None, f"a regular expression ({value}) is not modelled yet"
    return ",".join(str(v) for v in value), ""


_ADAPTER_NO_EFFECT = {
    "task_type": "the head is the model's",
    "use_rslora": "scaling only (alpha / sqrt(r))",
    "init_lora_weights": "initialisation",
    "inference_mode": "flag",
    "revision": "which weights",
    "auto_mapping": "bookkeeping",
    "peft_version": "bookkeeping",
    "fan_in_fan_out": "weight layout (the same shapes)",
    "ensure_weight_tying": "tying of saved modules",
    "megatron_core": "Megatron only",
    "layers_pattern": "used with layers_to_transform",
}


def read_adapter(b: Builder, prefix: str) -> None:
    """A PEFT adapter config (an adapter_config.json, or peft_config in a file) flattened
    under `prefix` -> --peft lora and its options; other PEFT methods -> peft = their type
    and the raw config in `peft_config` (only LoRA is modelled today)."""
    keys = [k for k in b.unhandled() if k.startswith(prefix)]
    raw = {k[len(prefix) :]: b.get(k) for k in keys}
    peft_type = str(raw.get("peft_type") or "LORA").lower()
    src = lambda n: f"{prefix}{n}: {raw.get(n)}"  # noqa: E731
    if peft_type != "lora":
        b.option("peft", peft_type, src("peft_type"))
        b.option("peft_config", raw, f"{prefix}*")
        for key in keys:
            b.read(key, "options['peft_config'] (the adapter's raw config)")
        b.warn(
            f"{prefix}peft_type: {raw.get('peft_type')}: only LoRA is modelled today; the "
            "adapter's raw config is kept for PEFT methods' modelling (options peft_config)"
        )
        return
    b.option("peft", "lora", src("peft_type"))
    for key in keys:
        name, value = key[len(prefix) :], b.get(key)
        if name == "peft_type":
            b.read(key, "--peft lora")
        elif name == "r":
            b.read(key, b.option("lora_r", b.number(key), src(name)))
        elif name == "lora_alpha":
            b.read(key, b.option("lora_alpha", b.number(key, float), src(name)))
        elif name == "lora_dropout":
            b.read(key, b.option("lora_dropout", b.number(key, float), src(name)))
        elif name == "target_modules":
            names, why = _lora_names(value)
            if names is None:
                b.warn(f"{key}: {why}; the answer uses peft's default targets", key=key)
            else:
                b.read(key, b.option("lora_targets", names, src(name)) + (f" ({why})" * bool(why)))
        elif name == "base_model_name_or_path":
            b.read(key, "the model, where the file names none")
        elif name == "use_dora" and value:
            b.option("peft_config", raw, f"{prefix}*")
            b.warn(
                f"{key}: true: DoRA is not modelled yet; the answer is plain LoRA's (DoRA "
                "adds a magnitude vector and the weight norm per layer); the raw config is "
                "in options peft_config",
                key=key,
            )
        elif name == "bias" and value == "none":
            b.read(key, "off: no bias trained")
        elif name in _ADAPTER_NO_EFFECT:
            b.no_effect(key, _ADAPTER_NO_EFFECT[name])
        elif is_off(value) or name == "megatron_config":
            b.read(key, "off")
        else:
            b.warn(
                f"{key}: {value}: not modelled yet; the answer adapts the target modules "
                "alone, at rank r, with nothing else trained",
                key=key,
            )


def load_side_file(b: Builder, key: str, path_text: str, base: Path) -> str | None:
    """Load the JSON file `path_text` (relative to the config's folder, then the current
    one) into the builder's keys under "<key>:"; the prefix, or None with a warning."""
    candidates = [base / path_text, Path(path_text).expanduser()]
    path = next((p for p in candidates if p.is_file()), None)
    if path is None:
        b.warn(f"{key}: {path_text} is not here: its settings are not read", key=key)
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        b.warn(f"{key}: {path} is not readable JSON ({exc}): its settings are not read", key=key)
        return None
    b.read(key, f"read {path}")
    prefix = f"{key}:"
    b.flat.update(flatten(data, prefix=prefix))
    return prefix
