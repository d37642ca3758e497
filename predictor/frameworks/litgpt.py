"""Reader of LitGPT finetune configs (YAML), as `litgpt finetune_lora|finetune_full --config
FILE` reads them (jsonargparse: the file's keys over `setup()`'s defaults).

Sources: Lightning-AI/litgpt @ 2685705 (Jun 2026): litgpt/finetune/lora.py and full.py
(`setup` arguments and defaults: TrainArgs(global_batch_size=16, micro_batch_size=1,
max_seq_length=None); precision default `get_default_supported_precision(training=True)`
= bf16-mixed on a bf16 GPU; quantize through `BitsandbytesPrecision`, which refuses mixed
precision; several devices: lora.py `ModelParallelStrategy` (FSDP2 `fully_shard` and a
`checkpoint_wrapper` per block), full.py `FSDPStrategy(activation_checkpointing_policy=
{Block})`; micro-steps but the last under `fabric.no_backward_sync`; `logits = model(...)`
held until the next forward), litgpt/args.py (TrainArgs, EvalArgs, LogArgs;
accumulation = global_batch_size / (micro_batch_size x devices x num_nodes)),
litgpt/utils.py (`instantiate_bnb_optimizer`: bitsandbytes' PagedAdamW under quantize),
config_hub/finetune/*/{lora,qlora,full}.yaml (the layout). How memgnn stands in for
LitGPT's own model code: benchmarks/public_rows.py `DIFFERENCES`.

Key (default) -> memgnn:
- checkpoint_dir (checkpoints/ORG/NAME) -> --model hf:ORG/NAME
- precision (bf16-mixed) -> bf16-true -> bf16, bf16-mixed -> amp-bf16, 16-true -> fp16,
  16-mixed -> amp-fp16, 32-true -> fp32
- quantize (none) -> bnb.nf4 / bnb.fp4 -> nf4, bnb.nf4-dq / bnb.fp4-dq -> nf4-dq, bnb.int8
  -> int8
- devices (1) x num_nodes (1) -> --gpus; > 1: --sharding fsdp --checkpointing full
  (--grad-sync last when accumulating)
- train.micro_batch_size (1) -> --batch (B)
- train.global_batch_size (16) -> --grad-accum = global / (micro x devices x num_nodes)
- train.max_seq_length (none: the longest sample) -> --seq (S)
- lora_r (8) / lora_alpha (16) / lora_dropout (0.05) -> --lora-r / --lora-alpha /
  --lora-dropout
- lora_query (true) / key / value (true) / projection / mlp / head -> --lora-targets (HF
  module names)
- optimizer (AdamW) -> --optimizer
Always (LitGPT's loop and model): --hold-outputs, --model-arg use_cache=false, LoRA
adapters in the model's dtype (--lora-dtype model), and --model-arg
tie_word_embeddings=false where the HF config ties the lm_head (LitGPT's GPT has its own).
A file with a `lora_*` key is read as finetune_lora, else as finetune_full.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memgnn.predictor.frameworks.base import Builder, ConfigReading
from memgnn.predictor.frameworks.ecosystem import ADAMW_ASSUMED
from memgnn.predictor.frameworks.files import flatten
from memgnn.predictor.frameworks.naming import Catalog, hub_model, lora_targets

__all__ = ["read_litgpt"]

_PRECISIONS = {
    "bf16-true": "bf16",
    "bf16-mixed": "amp-bf16",
    "16-true": "fp16",
    "16-mixed": "amp-fp16",
    "32-true": "fp32",
    "32": "fp32",
    "bf16": "amp-bf16",
    "16": "amp-fp16",
}
_QUANTIZE = {
    "bnb.nf4": "nf4",
    "bnb.fp4": "nf4",
    "bnb.nf4-dq": "nf4-dq",
    "bnb.fp4-dq": "nf4-dq",
    "bnb.int8": "int8",
}
_SWITCHES = {
    "lora_query": "q",
    "lora_key": "k",
    "lora_value": "v",
    "lora_projection": "o",
    "lora_mlp": "mlp",
    "lora_head": "head",
}
_SWITCH_DEFAULTS = {"lora_query": True, "lora_value": True}
# model types whose HF config unties the lm_head when tie_word_embeddings is absent
_UNTIED = {
    "llama",
    "mistral",
    "mixtral",
    "qwen2",
    "qwen3",
    "phi",
    "phi3",
    "gpt_neox",
    "olmo2",
    "stablelm",
}
_NO_EFFECT = {
    **dict.fromkeys(
        (
            "out_dir",
            "resume",
            "logger_name",
            "seed",
            "access_token",
            "log.*",
            "train.save_interval",
            "train.log_interval",
        ),
        "logging and checkpoints",
    ),
    **dict.fromkeys(("data", "data.*"), "data preparation and loading"),
    **dict.fromkeys(("eval.*",), "evaluation runs outside the training step"),
    **dict.fromkeys(
        (
            "train.lr_warmup_steps",
            "train.lr_warmup_fraction",
            "train.epochs",
            "train.max_tokens",
            "train.max_steps",
            "train.max_time",
            "train.max_norm",
            "train.min_lr",
            "optimizer.init_args.*",
        ),
        "schedule or hyperparameters",
    ),
}


def read_litgpt(
    path: Path, data: dict[str, Any], *, catalog: Catalog | None = None
) -> ConfigReading:
    """The reading of a LitGPT finetune config mapping `data`."""
    b = Builder("litgpt", str(path), flatten(data, atomic=("data.init_args",)))
    lora = any(k in data for k in ("lora_r", "lora_alpha", "lora_dropout", *_SWITCHES))
    config = _model(b, catalog)
    quantized = _quantize(b)
    _precision(b, quantized)
    _batch(b, lora)
    if lora:
        _lora(b, config)
    _optimizer(b, quantized)
    b.option("hold_outputs", True, "LitGPT's loop: logits = model(input_ids) lives to the next")
    b.default(
        "(LitGPT's loop)",
        "logits = model(input_ids)",
        "--hold-outputs (the last micro-step's logits "
        "and graph live until the next forward returns)",
    )
    if b.has("train.tie_embeddings"):
        b.read(
            "train.tie_embeddings",
            "see --model-arg tie_word_embeddings"
            if b.get("train.tie_embeddings") is not None
            else "null: the checkpoint's",
        )
    return b.finish(_NO_EFFECT)


def _model(b: Builder, catalog: Catalog | None) -> dict | None:
    key = "checkpoint_dir"
    if not b.get(key):
        b.warn("the file has no checkpoint_dir: give --model")
        return None
    parts = Path(str(b.get(key))).parts
    name = "/".join(parts[-2:]) if len(parts) >= 2 else str(b.get(key))
    local = Path(str(b.get(key))).expanduser()
    found = hub_model(str(local) if (local / "config.json").is_file() else name, catalog)
    if found.warning:
        b.warn(f"{key}: {found.warning}")
    if found.spec is None:
        b.read(key, "no model: see the warnings")
        return None
    became = b.model(found.spec, f"{key}: {b.get(key)}") + (f" ({found.note})" * bool(found.note))
    became += " " + b.model_arg("use_cache", "false", "LitGPT's GPT keeps no KV cache in training")
    config = dict(found.config) if found.config else None
    if config is not None:
        tied = config.get("tie_word_embeddings", config.get("model_type") not in _UNTIED)
        if tied and not b.get("train.tie_embeddings"):
            became += " " + b.model_arg(
                "tie_word_embeddings", "false", "LitGPT's GPT has its own lm_head"
            )
    b.read(
        key,
        became + "; LitGPT's own model code is captured as transformers' class of the same shapes",
    )
    return config


def _quantize(b: Builder) -> bool:
    key = "quantize"
    value = b.get(key)
    if value is None:
        if b.has(key):
            b.read(key, "none")
        return False
    kind = _QUANTIZE.get(str(value))
    if kind is None:
        b.warn(
            f"{key}: {value}: this quantisation is not modelled yet (bnb.int8-training keeps "
            "16-bit weights); the answer is unquantised",
            key=key,
        )
        return False
    became = b.option("quantize_base", kind, f"{key}: {value}")
    b.read(key, became + (" (fp4 stores as nf4 does)" if "fp4" in value else ""))
    b.warn(
        f"{key}: {value}: LitGPT's BitsandbytesPrecision quantises every Linear, the lm_head "
        "too; the answer keeps the lm_head unquantised, as transformers does"
    )
    return True


def _precision(b: Builder, quantized: bool) -> None:
    key = "precision"
    value = str(b.get(key) or "bf16-mixed")
    precision = _PRECISIONS.get(value)
    if precision is None:
        b.warn(
            f"{key}: {value}: this precision is not modelled yet; the answer assumes bf16-mixed",
            key=key,
        )
        precision = "amp-bf16"
    if quantized and precision.startswith("amp"):
        raise ValueError(f"{key}: {value}: LitGPT refuses quantize with mixed precision")
    became = b.option("precision", precision, f"{key}: {value}")
    if b.get(key) is not None:
        b.read(key, became)
    else:
        if b.has(key):
            b.read(key, f"null: {became} (LitGPT's default on a bf16 GPU)")
        else:
            b.default(key, "bf16-mixed", f"{became} (LitGPT's default on a bf16 GPU)")


def _batch(b: Builder, lora: bool) -> None:
    micro = b.number("train.micro_batch_size") if b.given("train.micro_batch_size") else 1
    total = b.number("train.global_batch_size") if b.given("train.global_batch_size") else 16
    devices, nodes = b.get("devices", 1), b.number("num_nodes") if b.given("num_nodes") else 1
    if devices in ("auto", -1, "-1"):
        b.warn(f"devices: {devices}: every GPU of the machine: give --gpus N", key="devices")
        devices = None
    else:
        devices = b.number("devices", value=devices)
    became = b.size("B", micro, f"train.micro_batch_size: {micro}")
    if b.given("train.micro_batch_size"):
        b.read("train.micro_batch_size", became)
    else:
        b.default("train.micro_batch_size", 1, f"{became} (LitGPT's default)")
    ranks = (devices or 1) * nodes
    accum = max(1, total // (micro * ranks))
    source = f"train.global_batch_size: {total} / (micro {micro} x {ranks} ranks)"
    became = b.option("grad_accum", accum, source) + f" ({source})"
    if b.given("train.global_batch_size"):
        b.read("train.global_batch_size", became)
    else:
        b.default("train.global_batch_size", 16, f"{became} (LitGPT's default)")
    if devices is not None and ranks > 1:
        became = b.option("gpus", ranks, f"devices: {devices} x num_nodes: {nodes}")
        became += " " + b.option("sharding", "fsdp", f"devices: {devices} (FSDP)")
        became += " " + b.option("checkpointing", "full", "LitGPT's FSDP: every Block checkpointed")
        if accum > 1:
            became += " " + b.option("grad_sync", "last", "fabric.no_backward_sync")
        if not lora:
            b.warn(
                "finetune_full's FSDPStrategy runs FSDP1 (flat parameters): modelled as "
                "FSDP2's per-parameter shards"
            )
    elif devices is not None:
        became = "one GPU"
    for k in ("devices", "num_nodes"):
        if b.has(k) and devices is not None:
            b.read(k, became)
    key = "train.max_seq_length"
    if b.get(key) is not None:
        b.read(
            key,
            b.size("S", b.number(key), f"{key}: {b.get(key)}") + " (the longest a batch can be)",
        )
    else:
        b.warn(
            f"{key} is not set: batches are as long as the dataset's longest sample: give --seq",
            key=key if b.has(key) else None,
        )


def _lora(b: Builder, config: dict | None) -> None:
    b.option("peft", "lora", "lora_* keys (finetune_lora)")
    b.option("lora_dtype", "model", "LitGPT's LoRA weights in the model's dtype")
    for key, dest, kind, default in (
        ("lora_r", "lora_r", int, 8),
        ("lora_alpha", "lora_alpha", float, 16.0),
        ("lora_dropout", "lora_dropout", float, 0.05),
    ):
        value = b.number(key, kind) if b.given(key) else kind(default)
        became = b.option(dest, value, f"{key}: {value}")
        if b.has(key):
            b.read(key, became)
        else:
            b.default(key, value, f"{became} (LitGPT's default)")
    on = {k: bool(b.get(k, _SWITCH_DEFAULTS.get(k, False))) for k in _SWITCHES}
    roles = [_SWITCHES[k] for k, v in on.items() if v]
    if not roles:
        raise ValueError("every lora_* switch is false: LoRA adapts nothing")
    targets, note = lora_targets(roles, config)
    became = b.option("lora_targets", targets, ", ".join(f"{k}: {v}" for k, v in on.items() if v))
    became += f" ({note})" if note else ""
    for k in _SWITCHES:
        if b.has(k):
            b.read(k, became if on[k] else "off")
    b.default(
        "(LitGPT's LoRA)",
        "LoRALinear",
        "--lora-dtype model (LitGPT creates the adapters in the model's dtype)",
    )


def _optimizer(b: Builder, quantized: bool) -> None:
    key = "optimizer" if b.has("optimizer") else "optimizer.class_path"
    value = str(b.get(key) or "AdamW")
    name = value.rpartition(".")[2]
    optimizer = {"AdamW": "adamw", "Adam": "adam", "SGD": "sgd", "Adafactor": "adafactor"}.get(name)
    if quantized:
        if optimizer != "adamw":
            raise ValueError(f"{key}: {value}: LitGPT's quantize supports AdamW only")
        became = b.option("optimizer", "adamw", f"{key}: {value} (bitsandbytes' PagedAdamW)")
        b.warn(
            "quantize: LitGPT steps bitsandbytes' PagedAdamW, whose states live in CUDA "
            "unified memory outside torch's allocator counts; the answer counts torch "
            "AdamW's states as device memory"
        )
    elif optimizer is None:
        b.warn(
            f"{key}: {value}: this optimizer is not modelled yet; {ADAMW_ASSUMED}",
            key=key if b.has(key) else None,
        )
        return
    else:
        became = b.option("optimizer", optimizer, f"{key}: {value}")
    if b.has(key):
        b.read(key, became)
    else:
        b.default("optimizer", "AdamW", f"{became} (LitGPT's default)")
