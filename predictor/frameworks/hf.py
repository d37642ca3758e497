"""Reader of transformers' `TrainingArguments` and TRL's configs (JSON or YAML).

A file exported by `TrainingArguments.to_json_string()` / `to_dict()`, an `SFTConfig`'s, or
the YAML `trl sft --config` reads (SFTConfig + ModelConfig + ScriptArguments keys in one
mapping). The key tables and their sources: `hf_keys`. What the keys become:

Key (default) -> memgnn:
- per_device_train_batch_size (default 8) -> --batch (B)
- max_length / max_seq_length (TRL; default 1024) -> --seq (S): the longest a batch can be
- gradient_accumulation_steps (default 1) -> --grad-accum
- bf16 / fp16 with the model's load dtype -> --precision (below)
- activation_checkpointing / gradient_checkpointing (TRL default true) -> --checkpointing hf
- optim (default adamw_torch_fused) -> --optimizer / --optimizer-impl (`ecosystem`)
- fsdp + fsdp_config, deepspeed, parallelism_config -> --sharding ... (`distributed`)
- model_name_or_path (TRL) -> --model
- attn_implementation, model_init_kwargs.attn_implementation -> --attention
- use_peft + lora_* (TRL), adapter_config.json beside the file -> --peft lora ...
- load_in_4bit / load_in_8bit (TRL), quantization_config (a BitsAndBytesConfig dict in the
  file, in model_init_kwargs or in the model's config.json) -> --quantize-base
- use_cache -> --model-arg use_cache=

Precision: Trainer's `bf16`/`fp16` are autocast; the parameters keep the dtype the model
was loaded in. TRL loads it in `dtype` (ModelConfig, default float32) or
`model_init_kwargs.dtype` (SFTTrainer's default float32); "auto" is the checkpoint's
dtype (the catalog config's `torch_dtype`). Plain TrainingArguments do not say: the answer
assumes float32 weights (a warning). fp32 weights + bf16 -> amp-bf16, + fp16 -> amp-fp16;
bf16 weights -> bf16 (autocast over bf16 weights is modelled as none); under DeepSpeed,
whose bf16 engine keeps fp32 master weights, bf16 -> amp-bf16.

TRL's defaults (trl/trainer/base_config.py, sft_config.py at 1.9.0+26, f2cd577): bf16
true unless fp16, gradient_checkpointing true (TRL >= 0.24), max_length 1024, loss_type
"chunked_nll" (TRL >= 1.9; not modelled: a warning); QLoRA adapters are cast to bf16
(TRL >= 0.26, sft_trainer.py) -> --lora-dtype model under bf16.
transformers' (training_args.py, 5.24.0): per_device_train_batch_size 8,
optim adamw_torch_fused, non-reentrant checkpointing (4.x: reentrant).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memgnn.predictor.frameworks.base import Builder, ConfigReading, is_off
from memgnn.predictor.frameworks.distributed import DeepSpeed, read_deepspeed, read_fsdp
from memgnn.predictor.frameworks.ecosystem import (
    load_side_file,
    read_adapter,
    read_attention,
    read_bnb,
    read_optimizer,
)
from memgnn.predictor.frameworks.files import flatten
from memgnn.predictor.frameworks.hf_keys import FEATURES, NO_EFFECT, OLDER_ONLY
from memgnn.predictor.frameworks.naming import Catalog, hub_model

__all__ = ["read_hf"]

_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "auto": "auto"}
_CKPT = ("activation_checkpointing", "gradient_checkpointing")
_CKPT_KW = ("activation_checkpointing_kwargs", "gradient_checkpointing_kwargs")
_SECTIONS = (
    *_CKPT_KW,
    "fsdp_config",
    "parallelism_config",
    "model_init_kwargs",
    "quantization_config",
)


def read_hf(
    path: Path,
    data: dict[str, Any],
    *,
    trl: bool,
    adapter_config: Path | None = None,
    catalog: Catalog | None = None,
) -> ConfigReading:
    """The reading of a TrainingArguments (`trl=False`) or TRL config mapping `data`."""
    b = Builder("trl" if trl else "hf", str(path), flatten(data))
    for key in _SECTIONS:  # a mapping left empty: `fsdp_config: null`, `{}`
        if b.has(key) and is_off(b.get(key)):
            b.read(key, "unset")
    config = _model(b, catalog)
    _sizes(b, trl)
    ds = read_deepspeed(b, "deepspeed", path.parent)
    read_fsdp(b, "fsdp", "fsdp_config.", config_enables=False)
    _parallelism(b)
    _checkpointing(b, trl)
    _optimizer(b)
    for key in ("attn_implementation", "model_init_kwargs.attn_implementation"):
        if b.has(key):
            read_attention(b, key, b.get(key))
    if b.has("use_cache"):
        b.read(
            "use_cache",
            b.model_arg(
                "use_cache", _bool_text(b.get("use_cache")), f"use_cache: {b.get('use_cache')}"
            ),
        )
    _adapter(b, path, adapter_config, catalog)
    _quantization(b, config)
    _precision(b, trl, ds, config)
    _trl_only(b, trl)
    for key in [k for k in b.unhandled() if k.startswith("model_init_kwargs.")]:
        name = key.removeprefix("model_init_kwargs.")
        if name in ("device_map", "low_cpu_mem_usage", "revision", "trust_remote_code"):
            b.no_effect(key, "how the weights load (one device)")
    if b.has("torch_compile"):  # Trainer: torch.compile(model), the whole model
        b.compile_switch("torch_compile", "full", "the whole model, as transformers' Trainer")
        cudagraphs = str(b.get("torch_compile_mode") or "") in ("reduce-overhead", "max-autotune")
        if cudagraphs and not is_off(b.get("torch_compile")):
            b.warn(
                f"torch_compile_mode: {b.get('torch_compile_mode')}: CUDA graphs (their static "
                "memory pool) are not modelled; the answer is inductor's step without them"
            )
    return b.finish(NO_EFFECT, FEATURES)


def _bool_text(value: Any) -> str:
    return "true" if value and not is_off(value) else "false"


def _model(b: Builder, catalog: Catalog | None) -> dict | None:
    for key in ("model_name_or_path", "adapter_config.json:base_model_name_or_path"):
        if b.has(key) and b.get(key):
            found = hub_model(b.get(key), catalog)
            if found.warning:
                b.warn(f"{key}: {found.warning}")
            if found.spec is None:
                b.read(key, "no model: see the warnings")
                return None
            became = b.model(found.spec, f"{key}: {b.get(key)}")
            b.read(key, became + (f" ({found.note})" if found.note else ""))
            return dict(found.config) if found.config else None
    return None


def _sizes(b: Builder, trl: bool) -> None:
    # transformers 4.x: the deprecated per_gpu_train_batch_size wins where it is set
    names = ("per_gpu_train_batch_size", "per_device_train_batch_size")
    key = next((k for k in names if b.get(k) is not None), None)
    for k in names:
        if b.has(k) and k != key:
            b.read(k, "no memory effect: unset (the other batch-size key is read)")
    if key is not None:
        b.read(key, b.size("B", b.get(key), f"{key}: {b.get(key)}"))
    else:
        b.size("B", 8, "per_device_train_batch_size: 8 (default)")
        b.default("per_device_train_batch_size", 8, "--batch 8 (TrainingArguments' default)")
    key = "gradient_accumulation_steps"
    accum = b.number(key) if b.given(key) else 1
    became = b.option("grad_accum", accum, f"{key}: {accum}")
    if b.has(key):
        b.read(key, became)
    seq_key = next((k for k in ("max_length", "max_seq_length") if b.get(k) is not None), None)
    packed = bool(b.get("packing"))
    how = (
        "every packed row" if packed else "the longest a batch can be (padded batches are shorter)"
    )
    if seq_key is not None:
        b.read(seq_key, f"{b.size('S', b.get(seq_key), f'{seq_key}: {b.get(seq_key)}')} ({how})")
    elif trl:
        b.size("S", 1024, "max_length: 1024 (TRL's default)")
        b.default("max_length", 1024, f"--seq 1024 (TRL's default; {how})")
    else:
        b.warn("the sequence length is the data collator's, not TrainingArguments': give --seq")
    for k in ("max_length", "max_seq_length"):
        if b.has(k) and k != seq_key:
            b.read(k, "no memory effect: unset (the other length key is read)")
    if b.has("packing"):
        b.read(
            "packing",
            "rows of exactly S tokens" if packed else "off: rows padded to the batch's longest",
        )
    if b.has("padding_free") or packed:
        key = "padding_free"
        on = bool(b.get(key)) or (packed and b.get("packing_strategy", "bfd") == "bfd")
        if on:
            b.warn(
                f"{key}: padding-free batches (one row of up to B x S tokens, variable-length"
                " attention) are not modelled yet; the answer is the B x S step",
                key=key if b.has(key) else None,
            )
        elif b.has(key):
            b.read(key, "off")
    if b.has("pad_to_multiple_of"):
        b.no_effect("pad_to_multiple_of", "S is the stated maximum")


def _parallelism(b: Builder) -> None:
    prefix = "parallelism_config."
    sizes = {k[len(prefix) :]: k for k in b.flat if k.startswith(prefix)}
    if not sizes:
        return
    get = lambda n: int(b.get(sizes[n]) or 1) if n in sizes else 1  # noqa: E731
    shard, replicate = get("dp_shard_size"), get("dp_replicate_size")
    model_parallel = {n: get(n) for n in ("tp_size", "cp_size", "sp_size") if get(n) > 1}
    gpus = shard * replicate * max(1, _product(model_parallel.values()))
    sharding = "hsdp" if shard > 1 and replicate > 1 else "fsdp" if shard > 1 else "ddp"
    if gpus > 1:
        b.option("gpus", gpus, f"{prefix}*: {gpus} ranks")
        b.option("sharding", sharding, f"{prefix}dp_shard_size: {shard}")
        if sharding == "hsdp":
            b.option("hsdp_shard_size", shard, f"{prefix}dp_shard_size: {shard}")
    for name, key in sizes.items():
        if name in model_parallel:
            b.warn(
                f"{key}: {b.get(key)}: tensor/context/sequence parallelism is not modelled "
                "yet; the answer is a data-parallel rank's",
                key=key,
            )
        elif name in ("dp_shard_size", "dp_replicate_size", "tp_size", "cp_size", "sp_size"):
            b.read(key, f"--gpus {gpus} --sharding {sharding}" if gpus > 1 else "1: none")
        else:
            b.no_effect(key, "parallelism detail")


def _product(values: Any) -> int:
    out = 1
    for v in values:
        out *= v
    return out


def _checkpointing(b: Builder, trl: bool) -> None:
    key = next((k for k in _CKPT if b.get(k) is not None), None)
    on = bool(b.get(key)) if key else trl
    for k in _CKPT:
        if b.has(k) and k != key:
            b.read(k, f"no memory effect: an alias of {key}" if key else "unset")
    if "checkpointing" in b.reading.options:  # fsdp_config.activation_checkpointing
        if key:
            b.read(key, "see fsdp_config.activation_checkpointing")
    elif key is not None:
        b.read(key, b.option("checkpointing", "hf", f"{key}: true") if on else "off")
    elif trl:
        b.option("checkpointing", "hf", "gradient_checkpointing: true (TRL's default)")
        b.default("gradient_checkpointing", True, "--checkpointing hf (TRL >= 0.24's default)")
    kw = [
        k
        for k in b.unhandled()
        if k.startswith(_CKPT_KW) or k == "gradient_checkpointing_use_reentrant"
    ]
    reentrant_given = any(k.endswith("use_reentrant") and b.get(k) is not None for k in kw)
    older = [k for k in OLDER_ONLY if b.has(k)]
    if on and older and not reentrant_given and "checkpointing" in b.reading.options:
        b.warn(
            f"a transformers 4.x export (it has {older[0]}): 4.x checkpoints reentrant unless "
            "gradient_checkpointing_kwargs says use_reentrant: false; reentrant checkpointing "
            "is not modelled yet; the answer is non-reentrant checkpointing's"
        )
    for k in kw:
        name, value = k.rpartition(".")[2], b.get(k)
        if not on:
            b.no_effect(k, "checkpointing is off")
        elif name in ("use_reentrant", "gradient_checkpointing_use_reentrant") and value:
            b.warn(
                f"{k}: true: reentrant checkpointing is not modelled yet; the answer is "
                "non-reentrant checkpointing's (transformers 5's default)",
                key=k,
            )
        elif name in ("use_reentrant", "gradient_checkpointing_use_reentrant"):
            b.read(k, "non-reentrant, as memgnn's --checkpointing hf runs it")
        elif name == "every_n_layers" and value not in (None, 1):
            b.warn(
                f"{k}: {value}: checkpointing every n-th layer is not modelled yet; the "
                "answer checkpoints every layer",
                key=k,
            )
        elif name == "offload" and value:
            b.warn(
                f"{k}: true: offloading checkpoints to the host is not modelled yet; the "
                "answer keeps them on the GPU",
                key=k,
            )
        elif name in ("every_n_layers", "offload", "preserve_rng_state", "determinism_check"):
            b.read(k, "as memgnn runs it" if not value or value == 1 else "no memory effect")
        else:
            b.unknown(k)


def _optimizer(b: Builder) -> None:
    if b.get("adafactor"):
        b.read("adafactor", b.option("optimizer", "adafactor", "adafactor: true"))
        if b.has("optim"):
            b.read("optim", "no memory effect: adafactor: true wins")
        return
    if b.has("adafactor"):
        b.read("adafactor", "off")
    if b.has("optim"):
        read_optimizer(b, "optim", b.get("optim"))
    else:
        b.option("optimizer", "adamw", "optim: adamw_torch_fused (default)")
        b.option("optimizer_impl", "fused", "optim: adamw_torch_fused (default)")
        b.default(
            "optim",
            "adamw_torch_fused",
            "--optimizer adamw --optimizer-impl fused (transformers 5's default; 4.x: adamw_torch)",
        )


def _adapter(b: Builder, path: Path, explicit: Path | None, catalog: Catalog | None) -> None:
    beside = path.parent / "adapter_config.json"
    side = explicit or (beside if beside.is_file() and beside != path else None)
    if side is not None:
        b.flat["adapter_config.json"] = str(side)
        prefix = load_side_file(b, "adapter_config.json", str(side), Path.cwd())
        if prefix is not None:
            read_adapter(b, prefix)
            if b.reading.model is None:
                _model(b, catalog)
    use_peft = b.get("use_peft")
    lora = ("lora_r", "lora_alpha", "lora_dropout", "lora_target_modules", "use_dora")
    if b.has("use_peft") and not use_peft:
        b.read("use_peft", "off")
    if not use_peft:
        for k in lora:
            if b.has(k):
                b.no_effect(k, "use_peft is off")
        return
    b.read("use_peft", b.option("peft", "lora", "use_peft: true"))
    defaults = {"lora_r": 16, "lora_alpha": 32, "lora_dropout": 0.05}  # TRL's ModelConfig
    for k, dest, cast in (
        ("lora_r", "lora_r", int),
        ("lora_alpha", "lora_alpha", float),
        ("lora_dropout", "lora_dropout", float),
    ):
        value = b.number(k, cast) if b.given(k) else cast(defaults[k])
        became = b.option(dest, value, f"{k}: {value}")
        b.read(k, became) if b.has(k) else b.default(k, value, f"{became} (TRL's default)")
    if b.has("lora_target_modules"):
        value = b.get("lora_target_modules")
        names = value if isinstance(value, str) else ",".join(str(v) for v in value or ())
        became = b.option("lora_targets", names, f"lora_target_modules: {value}")
        b.read("lora_target_modules", became + ("" if names else " (peft's default targets)"))
    if b.get("use_dora"):
        b.warn(
            "use_dora: true: DoRA is not modelled yet; the answer is plain LoRA's", key="use_dora"
        )
    elif b.has("use_dora"):
        b.read("use_dora", "off")


def _quantization(b: Builder, config: dict | None) -> None:
    for prefix in ("quantization_config.", "model_init_kwargs.quantization_config."):
        if any(k.startswith(prefix) for k in b.unhandled()):
            read_bnb(b, prefix)
    four, eight = b.get("load_in_4bit"), b.get("load_in_8bit")
    if four or eight:  # TRL's ModelConfig -> get_quantization_config
        nested = bool(b.get("use_bnb_nested_quant"))
        kind = "int8" if eight and not four else ("nf4-dq" if nested else "nf4")
        key = "load_in_4bit" if four else "load_in_8bit"
        b.read(key, b.option("quantize_base", kind, f"{key}: true"))
    for k in ("load_in_4bit", "load_in_8bit", "use_bnb_nested_quant", "bnb_4bit_quant_type"):
        if b.has(k) and k not in {r.key for r in b.reading.keys}:
            b.read(
                k,
                f"--quantize-base {b.reading.options['quantize_base']}"
                if (four or eight)
                else "off",
            )
    if b.has("bnb_4bit_quant_storage"):
        b.no_effect("bnb_4bit_quant_storage", "4-bit codes in uint8 (the same bytes)")
    if config and isinstance(config.get("quantization_config"), dict):
        if "quantize_base" not in b.reading.options:
            prefix = "config.json:quantization_config."
            b.flat.update(flatten(config["quantization_config"], prefix=prefix))
            read_bnb(b, prefix)


def _model_dtype(b: Builder, trl: bool, config: dict | None) -> tuple[str, str]:
    """The dtype the weights load in (fp32 | bf16 | fp16) and where that came from."""
    for key in ("model_init_kwargs.dtype", "model_init_kwargs.torch_dtype", "dtype", "torch_dtype"):
        if b.get(key) is not None:
            text = str(b.get(key)).replace("torch.", "")
            dtype = _DTYPES.get(text)
            if dtype is None:
                raise ValueError(f"{b.reading.path}: {key}: unknown dtype {b.get(key)!r}")
            if dtype == "auto":
                stored = str((config or {}).get("torch_dtype") or (config or {}).get("dtype"))
                dtype = _DTYPES.get(stored.replace("torch.", ""), "fp32")
                if dtype == "auto" or not config:
                    b.warn(
                        f"{key}: auto: the checkpoint's dtype is unknown here; the answer "
                        "assumes float32 weights"
                    )
                    dtype = "fp32"
            b.read(key, f"weights in {dtype} (with bf16/fp16: --precision)")
            return dtype, f"{key}: {b.get(key)}"
    if trl:
        return "fp32", "dtype: float32 (TRL's default)"
    b.warn(
        "the model's load dtype is not in TrainingArguments: the answer assumes float32 "
        "weights (from_pretrained(dtype=torch.float32)); transformers 5 loads the "
        "checkpoint's dtype by default: give --precision bf16 if the script does"
    )
    return "fp32", "the model's dtype (assumed float32)"


def _precision(b: Builder, trl: bool, ds: DeepSpeed | None, config: dict | None) -> None:
    weights, why = _model_dtype(b, trl, config)
    fp16 = bool(b.get("fp16"))
    bf16 = b.get("bf16")
    bf16 = (not fp16) if bf16 is None and trl else bool(bf16)
    if bf16 and fp16:
        raise ValueError(f"{b.reading.path}: bf16 and fp16 are both true (Trainer refuses it)")
    amp = "bf16" if bf16 else "fp16" if fp16 else None
    if weights == "fp32":
        precision = f"amp-{amp}" if amp else "fp32"
    else:
        precision = weights
        if amp and amp != weights:
            b.warn(f"{weights} weights with {amp} autocast: read as --precision {weights}")
    if ds is not None and amp and weights == "fp32":
        b.warn(
            "DeepSpeed's bf16/fp16 engine (16-bit parameters, fp32 master weights in the "
            f"optimizer's partition) is modelled as fp32 parameters under autocast "
            f"({precision})"
        )
    source = f"bf16: {bf16}, fp16: {fp16}, {why}"
    became = b.option("precision", precision, source)
    for key in ("bf16", "fp16"):
        if b.has(key):
            b.read(key, became)
    if trl and not b.has("bf16") and not fp16:
        b.default("bf16", True, f"{became} (TRL's default: bf16 unless fp16)")
    quantized = b.reading.options.get("quantize_base", "none") != "none"
    if trl and quantized and b.reading.options.get("peft") == "lora" and precision == "bf16":
        source = b.reading.sources["quantize_base"]
        became = b.option("lora_dtype", "model", f"{source} (TRL casts the adapters to bf16)")
        for k in b.reading.keys:
            if k.key == source.partition(":")[0]:
                k.became += f" {became} (TRL >= 0.26 casts a quantised model's adapters to bf16)"


def _trl_only(b: Builder, trl: bool) -> None:
    key = "loss_type"
    value = b.get(key)
    if value is None and trl and not b.get("use_liger_kernel"):
        value = "chunked_nll"
        b.warn(
            "loss_type: chunked_nll (TRL >= 1.9's default): the lm_head and cross entropy "
            "in chunks over non-ignored tokens is not modelled yet; the answer computes the "
            "full B x S x vocab logits",
            key=key if b.has(key) else None,
        )
    elif value in ("chunked_nll", "dft"):
        b.warn(
            f"{key}: {value}: this loss is not modelled yet; the answer computes the full "
            "B x S x vocab logits and the model's cross entropy",
            key=key,
        )
    elif b.has(key):
        b.read(key, "the model's cross entropy, as memgnn runs it")
