"""Reader of axolotl configs (YAML), as `axolotl train FILE` reads them.

Sources: axolotl-ai-cloud/axolotl @ 067b021 (Jul 2026): src/axolotl/utils/schemas/*.py (the
`AxolotlInputConfig` fields and defaults, 388 keys), utils/config/__init__.py
(normalize_config: torch_dtype bf16 when bf16/bfloat16, fp16 when fp16/float16/8-bit,
fp32 otherwise; gradient_accumulation_steps = batch_size // micro_batch_size when only
batch_size is given; use_reentrant true when gradient_checkpointing has no kwargs),
core/builders/base.py (Trainer bf16/fp16 autocast), loaders/model.py (QLoRA's
BitsAndBytesConfig: nf4, double quantisation, bf16 storage, updated by
bnb_config_kwargs), loaders/adapter.py (lora_target_linear: every Linear but the lm_head).

Key (default) -> memgnn:
- base_model (base_model_config for the shapes) -> --model hf:ORG/NAME
- micro_batch_size (1) -> --batch (B)
- sequence_len (512) -> --seq (S): the longest a batch can be; every row with sample_packing
  / pad_to_sequence_len
- gradient_accumulation_steps (1; or batch_size // micro_batch_size) -> --grad-accum
- bf16 (auto: true on a bf16 GPU) / fp16 / bfloat16 / float16 / float32 -> --precision bf16
  / fp16 / fp32: the model loads in that dtype
- gradient_checkpointing (false) -> --checkpointing hf (reentrant by default: a warning)
- optimizer (adamw_torch_fused) -> --optimizer (`ecosystem.HF_OPTIMIZERS`)
- adapter lora / qlora, lora_r / lora_alpha / lora_dropout, lora_target_modules,
  lora_target_linear -> --peft lora ..., --lora-targets (all-linear)
- load_in_4bit (qlora: nf4-dq) / load_in_8bit, bnb_config_kwargs -> --quantize-base
- peft_autocast_adapter_dtype: false -> --lora-dtype model
- flash_attention / sdp_attention / eager_attention / attn_implementation -> --attention
- fsdp_config (+ fsdp_version, fsdp), deepspeed, dp_shard_size / dp_replicate_size ->
  --sharding ... (`distributed`)
Memory-relevant keys memgnn does not model are warned (`FEATURES`, and plugin keys
`liger_*`, `cut_cross_entropy`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memgnn.predictor.frameworks.axolotl_keys import FEATURES, NO_EFFECT, PLUGINS
from memgnn.predictor.frameworks.base import Builder, ConfigReading, is_off
from memgnn.predictor.frameworks.distributed import read_deepspeed, read_fsdp
from memgnn.predictor.frameworks.ecosystem import read_attention, read_optimizer
from memgnn.predictor.frameworks.files import flatten
from memgnn.predictor.frameworks.naming import Catalog, hub_model

__all__ = ["read_axolotl"]


def read_axolotl(
    path: Path, data: dict[str, Any], *, catalog: Catalog | None = None
) -> ConfigReading:
    """The reading of an axolotl config mapping `data`."""
    atomic = ("datasets", "test_datasets", "special_tokens", "lr_scheduler_kwargs")
    b = Builder("axolotl", str(path), flatten(data, atomic=atomic))
    _model(b, catalog)
    _sizes(b)
    _precision(b)
    _checkpointing(b)
    if b.has("optimizer"):
        read_optimizer(b, "optimizer", b.get("optimizer"))
    else:
        b.option("optimizer", "adamw", "optimizer: adamw_torch_fused (default)")
        b.option("optimizer_impl", "fused", "optimizer: adamw_torch_fused (default)")
        b.default(
            "optimizer",
            "adamw_torch_fused",
            "--optimizer adamw --optimizer-impl fused (axolotl's default)",
        )
    _adapter(b)
    _attention(b)
    read_deepspeed(b, "deepspeed", path.parent)
    read_fsdp(b, "fsdp", "fsdp_config.", config_enables=True, version_key="fsdp_version")
    _world(b)
    if b.has("torch_compile"):  # Trainer: torch.compile(model), the whole model
        b.compile_switch("torch_compile", "full", "the whole model, as transformers' Trainer")
        cudagraphs = str(b.get("torch_compile_mode") or "") in ("reduce-overhead", "max-autotune")
        if cudagraphs and not is_off(b.get("torch_compile")):
            b.warn(
                f"torch_compile_mode: {b.get('torch_compile_mode')}: CUDA graphs (their static "
                "memory pool) are not modelled; the answer is inductor's step without them"
            )
    for key in b.unhandled():
        if key.startswith(PLUGINS):
            b.feature(key, f"a plugin's kernel or loss ({key})", "transformers' own modules")
    return b.finish(NO_EFFECT, FEATURES)


def _model(b: Builder, catalog: Catalog | None) -> None:
    key = "base_model_config" if b.get("base_model_config") else "base_model"
    if not b.get(key):
        b.warn("the file names no base_model: give --model")
        return
    found = hub_model(b.get(key), catalog)
    if found.warning:
        b.warn(f"{key}: {found.warning}")
    became = b.model(found.spec, f"{key}: {b.get(key)}") if found.spec else "no model"
    b.read(key, became + (f" ({found.note})" if found.note else ""))
    other = "base_model" if key == "base_model_config" else "base_model_config"
    if b.has(other):
        b.read(
            other,
            "the weights (the shapes are base_model_config's)"
            if other == "base_model"
            else "unset",
        )


def _sizes(b: Builder) -> None:
    micro = b.number("micro_batch_size") if b.given("micro_batch_size") else 1
    became = b.size("B", micro, f"micro_batch_size: {micro}")
    if b.given("micro_batch_size"):
        b.read("micro_batch_size", became)
    else:
        b.default("micro_batch_size", 1, f"{became} (axolotl's default)")
    if b.get("gradient_accumulation_steps") is not None:
        accum = b.number("gradient_accumulation_steps")
        source = f"gradient_accumulation_steps: {accum}"
    elif b.get("batch_size") is not None:
        accum = max(1, b.number("batch_size") // micro)
        source = f"batch_size: {b.get('batch_size')} // micro_batch_size: {micro}"
    else:
        accum, source = 1, "gradient_accumulation_steps: 1 (default)"
    became = b.option("grad_accum", accum, source)
    for k in ("gradient_accumulation_steps", "batch_size"):
        if b.has(k):
            b.read(k, became)
    seq = b.number("sequence_len") if b.given("sequence_len") else 512
    packed = bool(b.get("sample_packing")) or bool(b.get("pad_to_sequence_len"))
    how = "every row" if packed else "the longest a batch can be"
    became = f"{b.size('S', seq, f'sequence_len: {seq}')} ({how})"
    if b.given("sequence_len"):
        b.read("sequence_len", became)
    else:
        b.default("sequence_len", 512, f"{became} (axolotl's default)")
    for k in ("sample_packing", "pad_to_sequence_len"):
        if b.has(k):
            b.read(k, "rows of exactly sequence_len" if b.get(k) else "off")


def _precision(b: Builder) -> None:
    bf16, fp16 = b.get("bf16", "auto"), b.get("fp16")
    if bf16 == "auto":
        bf16 = not fp16  # normalize_config: auto -> true on a GPU with bf16 (Ampere and later)
    if bf16 == "full":
        bf16 = True
    if bf16 or b.get("bfloat16"):
        precision = "bf16"
    elif fp16 or b.get("float16") or (b.get("load_in_8bit") and not b.get("float32")):
        precision = "fp16"
    else:
        precision = "fp32"
    source = (
        ", ".join(
            f"{k}: {b.get(k)}"
            for k in ("bf16", "fp16", "bfloat16", "float16", "float32")
            if b.has(k)
        )
        or "bf16: auto"
    )
    became = b.option("precision", precision, source) + " (the model loads in it)"
    for k in ("bf16", "fp16", "bfloat16", "float16", "float32"):
        if b.has(k):
            b.read(k, became)
    if not b.has("bf16") and precision == "bf16":
        b.default("bf16", "auto", f"{became} (axolotl's default bf16: auto, on a bf16 GPU)")


def _checkpointing(b: Builder) -> None:
    key = "gradient_checkpointing"
    value = b.get(key, False)
    if not value:
        if b.has(key):
            b.read(key, "off")
        for k in [k for k in b.unhandled() if k.startswith("gradient_checkpointing_kwargs")]:
            b.no_effect(k, "checkpointing is off")
        return
    b.read(key, b.option("checkpointing", "hf", f"{key}: {value}"))
    if value in ("offload", "offload_disk"):
        b.warn(
            f"{key}: {value}: offloaded checkpoints are not modelled yet; the answer keeps "
            "them on the GPU"
        )
    kw = "gradient_checkpointing_kwargs.use_reentrant"
    reentrant = b.get(
        kw,
        True if not any(k.startswith("gradient_checkpointing_kwargs") for k in b.flat) else False,
    )
    if reentrant:
        b.warn(
            "gradient_checkpointing: reentrant checkpointing (axolotl's default without "
            "gradient_checkpointing_kwargs) is not modelled yet; the answer is "
            "non-reentrant checkpointing's",
            key=kw if b.has(kw) else None,
        )
    elif b.has(kw):
        b.read(kw, "non-reentrant, as memgnn runs it")
    for k in [k for k in b.unhandled() if k.startswith("gradient_checkpointing_kwargs")]:
        b.unknown(k)


def _adapter(b: Builder) -> None:
    adapter = b.get("adapter")
    lora_keys = (
        "lora_r",
        "lora_alpha",
        "lora_dropout",
        "lora_target_modules",
        "lora_target_linear",
        "peft_autocast_adapter_dtype",
    )
    if adapter not in ("lora", "qlora"):
        if adapter:
            b.warn(
                f"adapter: {adapter}: only LoRA and QLoRA are modelled; the answer trains "
                "every parameter",
                key="adapter",
            )
        elif b.has("adapter"):
            b.read("adapter", "none: every parameter trains")
        for k in lora_keys:
            if b.has(k):
                b.no_effect(k, "no LoRA adapter")
    else:
        b.read("adapter", b.option("peft", "lora", f"adapter: {adapter}"))
        for k, dest, kind in (
            ("lora_r", "lora_r", int),
            ("lora_alpha", "lora_alpha", float),
            ("lora_dropout", "lora_dropout", float),
        ):
            if b.get(k) is not None:
                b.read(k, b.option(dest, b.number(k, kind), f"{k}: {b.get(k)}"))
            elif b.has(k):
                b.read(k, "null: peft's LoraConfig default")
        if b.get("lora_target_linear"):
            became = b.option("lora_targets", "all-linear", "lora_target_linear: true")
            b.read("lora_target_linear", became + " (every Linear but the lm_head)")
            if b.has("lora_target_modules"):
                b.read("lora_target_modules", "within all-linear")
        else:
            if b.has("lora_target_linear"):
                b.read("lora_target_linear", "off")
            value = b.get("lora_target_modules")
            if value:
                names = value if isinstance(value, str) else ",".join(str(v) for v in value)
                b.read(
                    "lora_target_modules",
                    b.option("lora_targets", names, f"lora_target_modules: {value}"),
                )
            elif b.has("lora_target_modules"):
                b.read("lora_target_modules", "null: peft's default targets")
        key = "peft_autocast_adapter_dtype"
        if b.has(key):
            dtype = "fp32" if b.get(key) is not False else "model"
            b.read(key, b.option("lora_dtype", dtype, f"{key}: {b.get(key)}"))
    _quantized(b, adapter)


def _quantized(b: Builder, adapter: Any) -> None:
    four, eight = b.get("load_in_4bit"), b.get("load_in_8bit")
    if four and adapter == "qlora":
        pre = "bnb_config_kwargs."
        kind = "nf4-dq" if b.get(pre + "bnb_4bit_use_double_quant", True) else "nf4"
        became = b.option("quantize_base", kind, "load_in_4bit: true, adapter: qlora")
        b.read(
            "load_in_4bit",
            f"{became} (axolotl's QLoRA: nf4 with double quantisation, "
            "4-bit codes in bf16 storage: the same bytes)",
        )
        for k in [k for k in b.unhandled() if k.startswith(pre)]:
            name = k[len(pre) :]
            if name in ("bnb_4bit_use_double_quant", "bnb_4bit_quant_type"):
                b.read(k, became if b.get(k) != "fp4" else "fp4 stores as nf4 does")
            elif name in ("bnb_4bit_compute_dtype", "bnb_4bit_quant_storage"):
                b.no_effect(k, "the compute dtype follows --precision; storage: the same bytes")
            else:
                b.warn(
                    f"{k}: {b.get(k)}: not modelled yet; the answer is bitsandbytes' defaults",
                    key=k,
                )
    elif eight and adapter == "lora":
        b.read("load_in_8bit", b.option("quantize_base", "int8", "load_in_8bit: true"))
    for k in ("load_in_4bit", "load_in_8bit"):
        if b.has(k) and k not in {r.key for r in b.reading.keys}:
            if b.get(k):
                b.warn(
                    f"{k}: true without adapter {'qlora' if k == 'load_in_4bit' else 'lora'}"
                    ": axolotl does not quantise then; the answer is unquantised",
                    key=k,
                )
            else:
                b.read(k, "off")
    for k in [k for k in b.unhandled() if k.startswith("bnb_config_kwargs.")]:
        b.no_effect(k, "no QLoRA adapter")


def _attention(b: Builder) -> None:
    for key, impl in (
        ("flash_attention", "flash_attention_2"),
        ("sdp_attention", "sdpa"),
        ("eager_attention", "eager"),
    ):
        if b.get(key):
            read_attention(b, key, impl)
        elif b.has(key):
            b.read(key, "off")
    if b.has("attn_implementation"):
        read_attention(b, "attn_implementation", b.get("attn_implementation"))


def _world(b: Builder) -> None:
    shard = b.number("dp_shard_size") if b.get("dp_shard_size") else None
    replicate = b.number("dp_replicate_size") if b.get("dp_replicate_size") else 1
    if shard is None and replicate == 1:
        for k in ("dp_shard_size", "dp_replicate_size"):
            if b.has(k):
                b.read(k, "unset")
        return
    gpus = (shard or 1) * replicate
    became = b.option("gpus", gpus, f"dp_shard_size: {shard}, dp_replicate_size: {replicate}")
    if replicate > 1 and (shard or 1) > 1:
        became += " " + b.option("sharding", "hsdp", f"dp_replicate_size: {replicate}")
        became += " " + b.option("hsdp_shard_size", shard, f"dp_shard_size: {shard}")
    for k in ("dp_shard_size", "dp_replicate_size"):
        if b.has(k):
            b.read(k, became)
