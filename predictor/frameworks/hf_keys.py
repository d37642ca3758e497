"""The key tables of transformers' `TrainingArguments` and TRL's configs, by what each key
does to a training step's memory. Read by `hf` (the reader) and `read` (format detection).

Sources: the dataclass fields of `transformers.TrainingArguments` in 4.36.2, 4.46.3, 4.57.3
and 5.24.0 (wheels read with `ast`; the union, so files exported by older releases read
too), TRL's `SFTConfig` (trl/trainer/sft_config.py and base_config.py at v0.9.6, v0.12.2,
v0.19.1, v0.24.0 and 1.9.0+26 (f2cd577)), `ModelConfig` (trl/trainer/model_config.py),
`ScriptArguments` and `DatasetMixtureConfig` (trl/scripts/utils.py), which `trl sft
--config FILE` reads from one YAML file.

Keys with a memory effect that the reader maps or warns about are handled in `hf`; this
module lists the others, each with why it does not change the step's memory, and the
memory-relevant switches memgnn does not model (`FEATURES`: what it is, what the answer
assumes).
"""

from __future__ import annotations

__all__ = ["FEATURES", "HF_ONLY", "NO_EFFECT", "OLDER_ONLY", "TRL_ONLY"]


def _keys(text: str) -> list[str]:
    return text.split()


# key (or "section.*": every key under it) -> why it does not change the step's memory
NO_EFFECT: dict[str, str] = {}
NO_EFFECT.update(
    dict.fromkeys(
        _keys(
            """
            per_device_eval_batch_size per_gpu_eval_batch_size eval_accumulation_steps
            eval_strategy evaluation_strategy eval_steps eval_delay eval_on_start
            prediction_loss_only eval_do_concat_batches eval_use_gather_object include_for_metrics
            include_inputs_for_metrics batch_eval_metrics bf16_full_eval fp16_full_eval
            jit_mode_eval use_legacy_prediction_loop past_index eval_packing
            load_best_model_at_end metric_for_best_model greater_is_better do_eval do_predict
            dataset_test_split test_split_size
            """
        ),
        "evaluation runs outside the training step",
    )
)
NO_EFFECT.update(
    dict.fromkeys(
        _keys(
            """
            logging_dir logging_strategy logging_steps logging_first_step logging_nan_inf_filter
            log_level log_level_replica log_on_each_node disable_tqdm report_to run_name project
            trackio_space_id trackio_bucket_id trackio_static_space_id
            include_num_input_tokens_seen include_tokens_per_second skip_memory_metrics
            tpu_metrics_debug debug
            """
        ),
        "logging",
    )
)
NO_EFFECT.update(
    dict.fromkeys(
        _keys(
            """
            output_dir overwrite_output_dir save_strategy save_steps save_total_limit
            save_safetensors save_on_each_node save_only_model enable_jit_checkpoint push_to_hub
            hub_model_id hub_strategy hub_token hub_private_repo hub_always_push hub_revision
            push_to_hub_model_id push_to_hub_organization push_to_hub_token resume_from_checkpoint
            restore_callback_states_from_checkpoint ignore_data_skip do_train
            """
        ),
        "checkpoints and the Hub",
    )
)
NO_EFFECT.update(
    dict.fromkeys(
        _keys(
            """
            dataloader_drop_last dataloader_num_workers dataloader_pin_memory
            dataloader_persistent_workers dataloader_prefetch_factor
            dataloader_multiprocessing_context dataloader_in_order remove_unused_columns
            label_names length_column_name group_by_length train_sampling_strategy
            dataset_text_field dataset_kwargs.* dataset_num_proc dataset_batch_size
            num_of_sequences chars_per_token eos_token pad_token chat_template_path
            shuffle_dataset truncation_mode completion_only_loss assistant_only_loss dataset_name
            dataset_config dataset_train_split dataset_streaming datasets streaming data_seed seed
            full_determinism
            """
        ),
        "data preparation (host side)",
    )
)
NO_EFFECT.update(
    dict.fromkeys(
        _keys(
            """
            num_train_epochs max_steps learning_rate lr_scheduler_type lr_scheduler_kwargs.*
            lr_scheduler_kwargs warmup_steps warmup_ratio weight_decay adam_beta1 adam_beta2
            adam_epsilon max_grad_norm router_aux_loss_coef
            """
        ),
        "optimizer hyperparameter or schedule (same states)",
    )
)
NO_EFFECT.update(
    dict.fromkeys(
        _keys(
            """
            local_rank ddp_backend ddp_timeout ddp_find_unused_parameters ddp_broadcast_buffers
            ddp_static_graph accelerator_config.* accelerator_config dispatch_batches
            split_batches tpu_num_cores mp_parameters ray_scope _n_gpu ignore_bias_buffers
            average_tokens_across_devices
            """
        ),
        "process-group bookkeeping",
    )
)
NO_EFFECT.update(
    dict.fromkeys(
        _keys(
            """
            half_precision_backend fp16_backend
            """
        ),
        "the AMP backend (torch autocast)",
    )
)
NO_EFFECT["fp16_opt_level"] = "apex only"
NO_EFFECT["tf32"] = "matmul math mode (the same tensors)"
NO_EFFECT.update(
    dict.fromkeys(
        _keys(
            """
            torch_compile_backend torch_compile_mode
            """
        ),
        "used with torch_compile",
    )
)
NO_EFFECT.update(
    dict.fromkeys(
        _keys(
            """
            liger_kernel_config liger_kernel_config.*
            """
        ),
        "used with use_liger_kernel",
    )
)
NO_EFFECT["torch_empty_cache_steps"] = (
    "empties the allocator's cache between steps (the step's own peak is the same)"
)
NO_EFFECT["fsdp_min_num_params"] = "memgnn wraps every repeated block (the transformer layer)"
NO_EFFECT["fsdp_transformer_layer_cls_to_wrap"] = "memgnn wraps every repeated block"
NO_EFFECT["trust_remote_code"] = "which code (the catalog config is built offline)"
NO_EFFECT["model_revision"] = "which weights"
NO_EFFECT["lora_task_type"] = "the head is the model's"
NO_EFFECT["use_rslora"] = "scaling only (alpha / sqrt(r))"
NO_EFFECT["packing_strategy"] = "which sequences share a row"

# memory-relevant keys memgnn does not model: key -> (what it is, what the answer assumes)
FEATURES: dict[str, tuple[str, str]] = {
    "torchdynamo": ("torch.compile (torchdynamo)", "the answer is the eager step's"),
    "use_liger_kernel": (
        "Liger's fused kernels (RMSNorm, RoPE, SwiGLU, fused linear cross entropy)",
        "the answer runs transformers' own modules",
    ),
    "use_liger": ("Liger's fused kernels", "the answer runs transformers' own modules"),
    "neftune_noise_alpha": (
        "NEFTune's embedding noise (one B x S x hidden temporary)",
        "the answer adds no noise",
    ),
    "auto_find_batch_size": (
        "halving the batch after an out-of-memory error",
        "the answer is for the stated batch",
    ),
    "activation_offloading": (
        "activation offloading to the CPU",
        "the answer keeps saved activations on the GPU",
    ),
    "optim_target_modules": (
        "GaLore/APOLLO-style projected optimizers",
        "the answer's optimizer states are whole",
    ),
    "optim_args": ("extra optimizer arguments", "the answer uses the optimizer's defaults"),
    "lora_target_parameters": (
        "LoRA on parameters (MoE experts)",
        "the answer adapts the target modules alone",
    ),
    "lora_modules_to_save": (
        "modules trained in full beside the adapters",
        "the answer trains the adapters alone",
    ),
    "use_mps_device": ("training on Apple MPS", "the answer is for --device"),
    "use_ipex": ("Intel extension for PyTorch", "the answer is for --device"),
    "use_cpu": ("training on the CPU", "the answer is for --device (give --device cpu)"),
    "no_cuda": ("training on the CPU", "the answer is for --device (give --device cpu)"),
    "ddp_bucket_cap_mb": ("DDP's gradient bucket size", "DDP's default 25 MiB buckets"),
    "label_smoothing_factor": (
        "label smoothing (a log-softmax over B x S x vocab outside the model's loss)",
        "the model's own loss",
    ),
}

# keys only TRL's configs have (SFTConfig, ModelConfig, ScriptArguments): a file with one
# of them is read as TRL, whose defaults differ from TrainingArguments'
TRL_ONLY = frozenset(
    {
        "max_seq_length",
        "max_length",
        "packing",
        "packing_strategy",
        "padding_free",
        "pad_to_multiple_of",
        "model_init_kwargs",
        "dataset_text_field",
        "dataset_kwargs",
        "dataset_num_proc",
        "dataset_batch_size",
        "num_of_sequences",
        "chars_per_token",
        "eos_token",
        "pad_token",
        "chat_template_path",
        "shuffle_dataset",
        "truncation_mode",
        "eval_packing",
        "completion_only_loss",
        "assistant_only_loss",
        "loss_type",
        "activation_offloading",
        "use_liger",
        "router_aux_loss_coef",
        "model_name_or_path",
        "model_revision",
        "dtype",
        "torch_dtype",
        "attn_implementation",
        "use_peft",
        "lora_r",
        "lora_alpha",
        "lora_dropout",
        "lora_target_modules",
        "lora_target_parameters",
        "lora_modules_to_save",
        "lora_task_type",
        "use_rslora",
        "use_dora",
        "load_in_8bit",
        "load_in_4bit",
        "bnb_4bit_quant_type",
        "use_bnb_nested_quant",
        "bnb_4bit_quant_storage",
        "dataset_name",
        "dataset_config",
        "dataset_train_split",
        "dataset_test_split",
        "dataset_streaming",
        "ignore_bias_buffers",
        "gradient_checkpointing_use_reentrant",
        "datasets",
        "streaming",
        "test_split_size",
    }
)

# TrainingArguments keys the reader handles itself (besides NO_EFFECT and FEATURES)
HF_ONLY = frozenset(
    {
        "per_device_train_batch_size",
        "per_gpu_train_batch_size",
        "gradient_accumulation_steps",
        "bf16",
        "fp16",
        "gradient_checkpointing",
        "gradient_checkpointing_kwargs",
        "activation_checkpointing",
        "activation_checkpointing_kwargs",
        "optim",
        "adafactor",
        "fsdp",
        "fsdp_config",
        "deepspeed",
        "use_cache",
        "parallelism_config",
        "torch_compile",
    }
)

# TrainingArguments fields transformers 4.36-4.57 export and 5.x dropped: a file with one of
# them comes from 4.x, whose gradient checkpointing is reentrant by default
OLDER_ONLY = frozenset(
    _keys(
        """
        _n_gpu adafactor dispatch_batches evaluation_strategy fp16_backend fp16_opt_level
        fsdp_min_num_params fsdp_transformer_layer_cls_to_wrap group_by_length
        half_precision_backend include_inputs_for_metrics include_tokens_per_second
        jit_mode_eval logging_dir mp_parameters no_cuda overwrite_output_dir past_index
        per_gpu_eval_batch_size per_gpu_train_batch_size push_to_hub_model_id
        push_to_hub_organization push_to_hub_token ray_scope save_safetensors split_batches
        torchdynamo tpu_metrics_debug tpu_num_cores use_ipex use_legacy_prediction_loop
        use_mps_device warmup_ratio
        """
    )
)
