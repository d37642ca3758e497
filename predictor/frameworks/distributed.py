"""DeepSpeed and FSDP settings of HF-ecosystem configs (transformers' Trainer, TRL, axolotl)
-> memgnn's --sharding and its options.

The number of GPUs is the launcher's (accelerate, torchrun, deepspeed), not the file's, so a
reader sets `sharding` and `merge_options` keeps it only once `--gpus N` is known.

FSDP (`transformers.trainer_utils.FSDPOption`; `fsdp_config` keys with or without
accelerate's `fsdp_` prefix, which TrainingArguments strips; FSDP1's
`ShardingStrategy` names and numbers 1-5):
- full_shard / FULL_SHARD -> --sharding fsdp; shard_grad_op / SHARD_GRAD_OP (parameters
  kept unsharded from forward to backward) -> fsdp with --fsdp-reshard-after-forward false;
  hybrid_shard -> hsdp; hybrid_shard_zero2 -> hsdp, no reshard; no_shard -> ddp.
- FSDP2 (`fsdp_version: 2`) `reshard_after_forward` -> --fsdp-reshard-after-forward.
- FSDP1 (the default where no version is given) is modelled as FSDP2 (per-parameter
  shards instead of flat parameters): a warning says so.
- `activation_checkpointing: true` -> --checkpointing full (a checkpoint wrapper per layer).
- offload / offload_params / cpu_offload (CPU offload of parameters) ->
  --fsdp-cpu-offload true (FSDP2 CPUOffloadPolicy) with full sharding; with another
  strategy a warning.

DeepSpeed (its config JSON, inline or a path): `zero_optimization.stage` 0 -> ddp, 1 ->
zero1, 2 -> zero2, 3 -> zero3; optimizer/parameter offload is not modelled (a warning);
DeepSpeed's bucket sizes, prefetch and live-parameter limits are not modelled (memgnn runs
the stage as PyTorch's own sharding; one warning names them).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memgnn.predictor.frameworks.base import Builder, is_off
from memgnn.predictor.frameworks.ecosystem import load_side_file

__all__ = ["DeepSpeed", "read_deepspeed", "read_fsdp"]

_STAGES = {0: "ddp", 1: "zero1", 2: "zero2", 3: "zero3"}
# FSDP1 ShardingStrategy (name or number) -> (sharding, reshard after forward)
_STRATEGIES = {
    "full_shard": ("fsdp", True),
    "1": ("fsdp", True),
    "shard_grad_op": ("fsdp", False),
    "2": ("fsdp", False),
    "no_shard": ("ddp", True),
    "3": ("ddp", True),
    "hybrid_shard": ("hsdp", True),
    "4": ("hsdp", True),
    "hybrid_shard_zero2": ("hsdp", False),
    "5": ("hsdp", False),
}
_FSDP_NO_EFFECT = {
    "state_dict_type": "checkpoint format",
    "final_state_dict_type": "checkpoint format",
    "cpu_ram_efficient_loading": "host memory at load",
    "sync_module_states": "a broadcast at load",
    "use_orig_params": "parameter views (the same bytes)",
    "limit_all_gathers": "FSDP2 keeps at most two all-gathers in flight, as memgnn runs it",
    "auto_wrap_policy": "memgnn wraps every repeated block (the transformer layer)",
    "transformer_layer_cls_to_wrap": "memgnn wraps every repeated block (the transformer layer)",
    "min_num_params": "memgnn wraps every repeated block (the transformer layer)",
    "backward_prefetch": "memgnn runs FSDP2's prefetch (one group ahead in backward)",
    "xla": "TPU only",
    "xla_fsdp_v2": "TPU only",
    "xla_fsdp_grad_ckpt": "TPU only",
    "activation_checkpointing_reentrant": "see activation_checkpointing",
}
_DS_NO_EFFECT = {
    "train_batch_size": "filled from the Trainer's arguments ('auto')",
    "train_micro_batch_size_per_gpu": "equals the per-device batch (transformers checks)",
    "gradient_accumulation_steps": "equals the Trainer's (transformers checks)",
    "gradient_clipping": "clipping",
    "steps_per_print": "logging",
    "wall_clock_breakdown": "logging",
    "zero_allow_untested_optimizer": "a check",
    "zero_force_ds_cpu_optimizer": "a check",
    "optimizer.*": "DeepSpeed's AdamW keeps the same two fp32 states",
    "scheduler.*": "learning-rate schedule",
    "fp16.*": "loss scaling",
    "bf16.*": "see bf16.enabled",
    "zero_optimization.stage3_gather_16bit_weights_on_model_save": "checkpoint saving",
    "zero_optimization.offload_optimizer.*": "with the offload device",
    "zero_optimization.offload_param.*": "with the offload device",
    "activation_checkpointing.*": "used only by models calling deepspeed.checkpointing",
    "flops_profiler.*": "profiling",
    "tensorboard.*": "logging",
    "wandb.*": "logging",
    "comms_logger.*": "logging",
}


@dataclass(kw_only=True, slots=True)
class DeepSpeed:
    """What a DeepSpeed config said: the ZeRO stage and its bf16/fp16 switches."""

    stage: int | None = None
    bf16: Any = None
    fp16: Any = None


def _offload(b: Builder, sharding: str, source: str) -> str:
    """FSDP's CPU offload of parameters -> --fsdp-cpu-offload (FSDP2 CPUOffloadPolicy, as
    the FSDP run is modelled) where the strategy shards fully; else a warning."""
    if sharding == "fsdp":
        return b.option("fsdp_cpu_offload", True, source)
    b.warn(
        f"{source}: FSDP's CPU offload with --sharding {sharding} is not modelled; the answer "
        "keeps parameters, gradients and optimizer states on the GPU"
    )
    return f"not modelled with --sharding {sharding} (warned)"


def read_deepspeed(b: Builder, key: str, base: Path) -> DeepSpeed | None:
    """`key` is a DeepSpeed config path (read beside the file) or an inline mapping already
    flattened under "key."; None when off or unreadable."""
    if b.has(key):
        value = b.get(key)
        if is_off(value):
            b.read(key, "off")
            return None
        if not isinstance(value, str):
            b.warn(f"{key}: {value!r} is neither a path nor a mapping: not read", key=key)
            return None
        prefix = load_side_file(b, key, value, base)
        if prefix is None:
            return None
    elif any(k.startswith(key + ".") for k in b.flat):
        prefix = key + "."
    else:
        return None
    ds = DeepSpeed(
        stage=b.get(prefix + "zero_optimization.stage"),
        bf16=b.get(prefix + "bf16.enabled"),
        fp16=b.get(prefix + "fp16.enabled"),
    )
    stage_key = prefix + "zero_optimization.stage"
    if b.has(stage_key):
        if ds.stage not in _STAGES:
            raise ValueError(f"{b.reading.path}: {stage_key}: {ds.stage!r} is no ZeRO stage (0-3)")
        b.read(stage_key, b.option("sharding", _STAGES[ds.stage], f"{stage_key}: {ds.stage}"))
    for part in ("offload_optimizer", "offload_param"):
        device_key = f"{prefix}zero_optimization.{part}.device"
        if b.has(device_key):
            b.feature(
                device_key,
                f"DeepSpeed's {part.replace('_', ' ')}",
                "the answer keeps every state on the GPU",
            )
    for k in ("bf16.enabled", "fp16.enabled"):
        if b.has(prefix + k):
            b.read(prefix + k, "precision: with the file's bf16 / fp16 (see their keys)")
    limits = []
    for k in b.unhandled():
        if not k.startswith(prefix):
            continue
        name = k[len(prefix) :]
        why = _lookup_ds(name)
        if why is not None:
            b.no_effect(k, why)
        elif name.startswith("zero_optimization.") or name in ("communication_data_type",):
            limits.append(k)
        else:
            b.unknown(k)
    if limits:
        names = ", ".join(k[len(prefix) :] for k in limits)
        for k in limits:
            b.warn(
                f"DeepSpeed settings not modelled yet ({names}): memgnn runs ZeRO stage "
                f"{ds.stage} as PyTorch's own sharding, without DeepSpeed's buckets and "
                "prefetch limits",
                key=k,
            )
    return ds


def _lookup_ds(name: str) -> str | None:
    if name in _DS_NO_EFFECT:
        return _DS_NO_EFFECT[name]
    for pattern, why in _DS_NO_EFFECT.items():
        if pattern.endswith(".*") and name.startswith(pattern[:-1]):
            return why
    return None


def _words(value: Any) -> list[str]:
    if isinstance(value, bool):
        return ["full_shard"] if value else []
    if isinstance(value, str):
        return value.replace(",", " ").split()
    return [str(v) for v in value or ()]


def read_fsdp(
    b: Builder, key: str, config_prefix: str, *, config_enables: bool, version_key: str = ""
) -> bool:
    """The `fsdp` option list (`key`) and the `fsdp_config` mapping flattened under
    `config_prefix` -> --sharding fsdp|hsdp|ddp and its options; True when FSDP is on.
    `config_enables`: an `fsdp_config` alone turns FSDP on (axolotl), or only with `fsdp`
    set (transformers' TrainingArguments). `version_key`: a top-level FSDP version key
    (axolotl's `fsdp_version`) beside `fsdp_config`'s own."""
    words = [w.lower() for w in _words(b.get(key))]
    cfg = {
        k[len(config_prefix) :].removeprefix("fsdp_"): k
        for k in b.flat
        if k.startswith(config_prefix)
    }
    if version_key and b.has(version_key):
        cfg.setdefault("version", version_key)
    version = b.get(cfg["version"]) if "version" in cfg else None
    strategy = next((w for w in words if w in _STRATEGIES), None)
    source = f"{key}: {b.get(key)}" if b.has(key) else ""
    for name in ("sharding_strategy", "reshard_after_forward"):
        value = b.get(cfg[name]) if name in cfg else None
        if isinstance(value, (str, int)) and not isinstance(value, bool):
            text = str(value).lower().removeprefix("shardingstrategy.")
            if text in _STRATEGIES:
                strategy, source = text, f"{cfg[name]}: {value}"
    on = bool(words) or (config_enables and any(k != version_key for k in cfg.values()))
    if b.has(key) and not words:
        b.read(key, "off")
    if not on:
        for k in cfg.values():
            if k not in {r.key for r in b.reading.keys}:
                b.read(k, f"no memory effect: FSDP is off ({key} is not set)")
        return False
    sharding, reshard = _STRATEGIES[strategy or "full_shard"]
    source = source or f"{config_prefix}*"
    became = b.option("sharding", sharding, source)
    if not reshard:
        became += " " + b.option("fsdp_reshard_after_forward", False, source)
    if b.has(key):
        b.read(key, became)
    if "offload" in words:
        _offload(b, sharding, f"{key}: offload")
    if str(version) != "2":
        b.warn(
            f"{key}: FSDP1's flat parameters are modelled as FSDP2's per-parameter shards "
            "(fully_shard on every layer)"
        )
    for name, k in cfg.items():
        value = b.get(k)
        if name == "version":
            b.read(k, "FSDP2 (fully_shard), as memgnn runs it" if str(value) == "2" else "FSDP1")
        elif name in ("sharding_strategy",) or (
            name == "reshard_after_forward" and not isinstance(value, bool)
        ):
            b.read(k, became)
        elif name == "reshard_after_forward":
            b.read(k, b.option("fsdp_reshard_after_forward", bool(value), f"{k}: {value}"))
        elif name == "activation_checkpointing":
            if value:
                b.read(k, b.option("checkpointing", "full", f"{k}: {value}"))
            else:
                b.read(k, "off")
        elif name in ("offload_params", "cpu_offload"):
            if is_off(value):
                b.read(k, "off")
            else:
                b.read(k, _offload(b, sharding, f"{k}: {value}"))
        elif name == "forward_prefetch":
            b.feature(
                k,
                "FSDP's forward prefetch (one more layer all-gathered ahead)",
                "the answer prefetches in backward only",
            )
        elif name in _FSDP_NO_EFFECT:
            b.no_effect(k, _FSDP_NO_EFFECT[name])
        else:
            b.unknown(k)
    return True
