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
Memory-relevant keys memgnn does not model are warned (`_FEATURES`, and plugin keys
`liger_*`, `cut_cross_entropy`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memgnn.predictor.frameworks.base import Builder, ConfigReading
from memgnn.predictor.frameworks.distributed import read_deepspeed, read_fsdp
from memgnn.predictor.frameworks.ecosystem import read_attention, read_optimizer
from memgnn.predictor.frameworks.files import flatten
from memgnn.predictor.frameworks.naming import Catalog, hub_model

__all__ = ["read_axolotl"]

_OFF_EFFECT = "the answer is the plain step's"
_NO_EFFECT: dict[str, str] = {
    **dict.fromkeys(
        (
            "wandb_project",
            "wandb_entity",
            "wandb_name",
            "wandb_run_id",
            "wandb_mode",
            "wandb_watch",
            "wandb_log_model",
            "use_wandb",
            "mlflow_tracking_uri",
            "mlflow_experiment_name",
            "mlflow_run_name",
            "hf_mlflow_log_artifacts",
            "use_mlflow",
            "comet_api_key",
            "comet_workspace",
            "comet_project_name",
            "comet_experiment_key",
            "comet_mode",
            "comet_online",
            "comet_experiment_config",
            "use_comet",
            "trackio_project_name",
            "trackio_run_name",
            "trackio_space_id",
            "use_trackio",
            "use_tensorboard",
            "use_otel_metrics",
            "otel_metrics_host",
            "otel_metrics_port",
            "logging_steps",
            "profiler_steps",
            "profiler_steps_start",
            "include_tkps",
            "include_tokens_per_second",
            "loss_watchdog_threshold",
            "loss_watchdog_patience",
            "strict",
            "gradio_title",
            "gradio_share",
            "gradio_server_name",
            "gradio_server_port",
            "gradio_max_new_tokens",
            "gradio_temperature",
        ),
        "logging",
    ),
    **dict.fromkeys(
        (
            "output_dir",
            "save_steps",
            "saves_per_epoch",
            "save_strategy",
            "save_total_limit",
            "save_safetensors",
            "save_only_model",
            "save_first_step",
            "hub_model_id",
            "hub_strategy",
            "hub_revision",
            "push_dataset_to_hub",
            "resume_from_checkpoint",
            "auto_resume_from_checkpoints",
            "lora_model_dir",
            "merge_lora",
            "merge_method",
            "hf_use_auth_token",
            "axolotl_config_path",
            "num_dataset_shards_to_save",
            "fsdp_final_state_dict_type",
        ),
        "checkpoints and the Hub",
    ),
    **dict.fromkeys(
        (
            "val_set_size",
            "eval_steps",
            "evals_per_epoch",
            "eval_strategy",
            "evaluation_strategy",
            "eval_batch_size",
            "eval_sample_packing",
            "eval_sequence_len",
            "eval_table_size",
            "eval_max_new_tokens",
            "eval_causal_lm_metrics",
            "do_causal_lm_eval",
            "do_bench_eval",
            "bench_dataset",
            "bench_split",
            "test_datasets",
            "early_stopping_patience",
            "load_best_model_at_end",
            "metric_for_best_model",
            "greater_is_better",
            "generate_samples",
            "num_generation_samples",
            "generation_max_new_tokens",
            "generation_temperature",
            "generation_top_k",
            "generation_top_p",
            "generation_do_sample",
            "generation_prompt_ratio",
        ),
        "evaluation runs outside the training step",
    ),
    **dict.fromkeys(
        (
            "datasets",
            "dataset_prepared_path",
            "dataset_processes",
            "dataset_num_proc",
            "dataset_keep_in_memory",
            "dataset_exact_deduplication",
            "dataset_shard_num",
            "dataset_shard_idx",
            "shuffle_merged_datasets",
            "shuffle_before_merging_datasets",
            "skip_prepare_dataset",
            "is_preprocess",
            "preprocess_iterable",
            "streaming",
            "streaming_multipack_buffer_size",
            "pretraining_dataset",
            "pretraining_sample_concatenation",
            "chat_template",
            "chat_template_jinja",
            "chat_template_kwargs",
            "default_system_message",
            "train_on_inputs",
            "role_boundaries",
            "eot_tokens",
            "tokenizer_config",
            "tokenizer_type",
            "tokenizer_use_fast",
            "tokenizer_legacy",
            "tokenizer_use_mistral_common",
            "tokenizer_save_jinja_files",
            "processor_type",
            "processor_kwargs",
            "group_by_length",
            "curriculum_sampling",
            "min_sample_len",
            "excess_length_strategy",
            "sample_packing_eff_est",
            "sample_packing_bin_size",
            "sample_packing_group_size",
            "sample_packing_mp_start_method",
            "sample_packing_sequentially",
            "multipack_real_batches",
            "pretrain_multipack_attn",
            "pretrain_multipack_buffer_size",
            "total_num_tokens",
            "total_supervised_tokens",
            "remove_unused_columns",
            "dataloader_num_workers",
            "dataloader_pin_memory",
            "dataloader_prefetch_factor",
            "dataloader_drop_last",
            "max_prompt_len",
            "image_size",
            "image_resize_algorithm",
            "seed",
            "pose_split_on_token_ids",
            "pose_max_context_len",
            "pose_num_chunks",
            "use_pose",
        ),
        "data preparation and loading",
    ),
    **dict.fromkeys(
        (
            "num_epochs",
            "max_steps",
            "learning_rate",
            "lr_scheduler",
            "lr_scheduler_kwargs",
            "lr_quadratic_warmup",
            "lr_div_factor",
            "lr_groups",
            "cosine_min_lr_ratio",
            "cosine_constant_lr_ratio",
            "warmup_steps",
            "warmup_ratio",
            "weight_decay",
            "adam_beta1",
            "adam_beta2",
            "adam_beta3",
            "adam_epsilon",
            "adam_epsilon2",
            "max_grad_norm",
            "loraplus_lr_ratio",
            "loraplus_lr_embedding",
            "embedding_lr",
            "embedding_lr_scale",
            "jagged_restart_steps",
            "jagged_restart_warmup_steps",
            "jagged_restart_anneal_steps",
            "optim_args",
            "peft_init_lora_weights",
            "peft_use_rslora",
            "lora_fan_in_fan_out",
            "peft_ensure_weight_tying",
            "rope_scaling",
            "lr_scheduler_kwargs.*",
        ),
        "schedule or hyperparameters (same tensors)",
    ),
    **dict.fromkeys(
        (
            "local_rank",
            "ddp",
            "ddp_timeout",
            "ddp_bucket_cap_mb",
            "ddp_broadcast_buffers",
            "ddp_find_unused_parameters",
            "accelerator_config",
            "use_ray",
            "ray_run_name",
            "ray_num_workers",
            "resources_per_worker",
            "world_size",
            "device",
            "plugins",
            "trust_remote_code",
            "revision_of_model",
            "model_type",
            "type_of_model",
            "is_llama_derived_model",
            "is_falcon_derived_model",
            "is_mistral_derived_model",
            "is_qwen_derived_model",
            "tf32",
            "gc_steps",
            "gc_collect_steps",
            "torch_empty_cache_steps",
            "low_cpu_mem_usage",
            "torch_compile_backend",
            "torch_compile_mode",
            "torch_compile_options",
            "sdpa_varlen",
            "fp32_norm_classes",
            "experimental_skip_move_to_device",
            "torchdistx_path",
            "special_tokens",
            "added_tokens_overrides",
            "mean_resizing_embeddings",
        ),
        "launch, loading or bookkeeping",
    ),
}
_FEATURES: dict[str, tuple[str, str]] = {
    "torch_compile": ("torch.compile", "the answer is the eager step's"),
    "activation_offloading": (
        "activation offloading to the CPU",
        "saved activations stay on the GPU",
    ),
    "layer_offloading": ("parameter offloading between layers", "every parameter on the GPU"),
    "chunked_cross_entropy": ("a chunked cross entropy", "the full B x S x vocab logits"),
    "flash_attn_cross_entropy": ("flash-attn's cross entropy", "the model's cross entropy"),
    "flash_attn_rms_norm": ("flash-attn's fused RMSNorm", "transformers' RMSNorm"),
    "flash_attn_fuse_mlp": ("a fused MLP", "transformers' MLP"),
    "cut_cross_entropy": ("Cut Cross Entropy (no full logits)", "the full B x S x vocab logits"),
    "tiled_mlp": ("a tiled MLP", "transformers' MLP"),
    "unfrozen_parameters": ("training a subset of the parameters", "every parameter trains"),
    "fp8": ("float8 training", "bf16/fp32 Linear layers"),
    "qat": ("quantisation-aware training", "plain Linear layers"),
    "quantization": ("quantisation-aware training", "plain Linear layers"),
    "gptq": ("a GPTQ-quantised base", "an unquantised base"),
    "relora": ("ReLoRA", _OFF_EFFECT),
    "lisa_n_layers": ("LISA (a few layers trained at a time)", "every layer trains"),
    "lora_mlp_kernel": ("axolotl's fused LoRA MLP kernel", "peft's LoRA modules"),
    "lora_qkv_kernel": ("axolotl's fused LoRA QKV kernel", "peft's LoRA modules"),
    "lora_o_kernel": ("axolotl's fused LoRA output kernel", "peft's LoRA modules"),
    "lora_embedding_kernel": ("axolotl's fused LoRA embedding kernel", "peft's LoRA modules"),
    "lora_on_cpu": ("LoRA adapters on the CPU", "adapters on the GPU"),
    "lora_modules_to_save": (
        "modules trained in full beside the adapters",
        "the adapters alone train",
    ),
    "lora_target_parameters": ("LoRA on parameters (MoE experts)", "the target modules alone"),
    "peft_layers_to_transform": ("LoRA on some layers", "LoRA on every layer"),
    "peft_layers_pattern": ("LoRA on some layers", "LoRA on every layer"),
    "peft_use_dora": ("DoRA", "plain LoRA"),
    "peft_layer_replication": ("layer replication", "the model's layers"),
    "peft_trainable_token_indices": ("trainable token rows", "the adapters alone"),
    "lora_rank_pattern": ("per-module LoRA ranks", "rank lora_r everywhere"),
    "lora_alpha_pattern": ("per-module LoRA alphas", "lora_alpha everywhere"),
    "xformers_attention": ("xformers attention", "the model's default attention"),
    "flex_attention": ("flex attention", "the model's default attention"),
    "s2_attention": ("shifted sparse attention", "the model's default attention"),
    "sage_attention": ("SageAttention", "the model's default attention"),
    "scaling_softmax": ("a scaled softmax", "the model's attention"),
    "batch_flattening": ("padding-free batches", "B rows of S tokens"),
    "sequence_parallel_degree": ("sequence parallelism", "a data-parallel rank's step"),
    "context_parallel_size": ("context parallelism", "a data-parallel rank's step"),
    "tensor_parallel_size": ("tensor parallelism", "a data-parallel rank's step"),
    "deepcompile": ("DeepSpeed's compiler", "the eager step"),
    "use_kernels": ("hub kernels", "transformers' modules"),
    "experts_implementation": ("a custom MoE experts kernel", "transformers' experts"),
    "quantize_moe_experts": ("quantised MoE experts", "unquantised experts"),
    "neftune_noise_alpha": ("NEFTune's embedding noise", "no noise"),
    "noisy_embedding_alpha": ("NEFTune's embedding noise", "no noise"),
    "rl": (
        "a preference/RL trainer (DPO, KTO, ORPO, GRPO: more forwards per step)",
        "the answer is one SFT step's",
    ),
    "reward_model": ("a reward model head", "the causal LM head"),
    "process_reward_model": ("a reward model head", "the causal LM head"),
    "dynamic_checkpoint": ("dynamic checkpointing", "the checkpointing stated"),
    "selective_checkpointing": ("selective checkpointing", "whole-layer checkpointing"),
    "resize_token_embeddings_to_32x": ("a vocabulary padded to 32x", "the config's vocabulary"),
    "shrink_embeddings": ("shrunk embeddings", "the config's vocabulary"),
    "tokens": ("added tokens (a larger vocabulary)", "the config's vocabulary"),
    "fix_untrained_tokens": ("fixing untrained token rows", _OFF_EFFECT),
    "overrides_of_model_config": ("config overrides (other shapes)", "the config as published"),
    "overrides_of_model_kwargs": ("from_pretrained overrides", "the defaults"),
    "model_quantization_config": ("a quantisation config", "an unquantised base"),
    "model_quantization_config_kwargs": ("a quantisation config", "an unquantised base"),
    "device_map": ("a device map (layers on the CPU)", "the model on one GPU"),
    "max_memory": ("a per-device memory map", "the model on one GPU"),
    "gpu_memory_limit": ("a GPU memory limit for loading", "the model on one GPU"),
    "embeddings_skip_upcast": ("embeddings kept out of the fp32 upcast", "peft's defaults"),
    "fp32_norms": ("norms kept in fp32", "the model's dtype"),
    "use_onebitllms": ("one-bit layers", "plain Linear layers"),
    "llama4_linearized_experts": ("linearised experts", "transformers' experts"),
    "freeze_mm_modules": ("frozen multimodal towers", "every parameter trains"),
}
_PLUGINS = ("liger_", "cut_cross_entropy", "spectrum_", "kd_", "lm_eval_")


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
    for key in b.unhandled():
        if key.startswith(_PLUGINS):
            b.feature(key, f"a plugin's kernel or loss ({key})", "transformers' own modules")
    return b.finish(_NO_EFFECT, _FEATURES)


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
    micro = b.number("micro_batch_size") if b.has("micro_batch_size") else 1
    became = b.size("B", micro, f"micro_batch_size: {micro}")
    if b.has("micro_batch_size"):
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
    seq = b.number("sequence_len") if b.has("sequence_len") else 512
    packed = bool(b.get("sample_packing")) or bool(b.get("pad_to_sequence_len"))
    how = "every row" if packed else "the longest a batch can be"
    became = f"{b.size('S', seq, f'sequence_len: {seq}')} ({how})"
    if b.has("sequence_len"):
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
