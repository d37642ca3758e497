"""The key tables of axolotl's config (`AxolotlInputConfig`), by what each key does to a
training step's memory. Read by `axolotl` (the reader).

Source: axolotl-ai-cloud/axolotl @ 067b021 (Jul 2026), src/axolotl/utils/schemas/*.py: the
388 fields of `AxolotlInputConfig` and its mixins (read with `ast`), plus the plugin keys
its integrations add (`liger_*`, `cut_cross_entropy`, ...). Keys the reader maps
(base_model, micro_batch_size, adapter, lora_*, load_in_*bit, bf16, fsdp_config, ...) are
handled in `axolotl`; `NO_EFFECT` lists why the others do not change the step's memory,
`FEATURES` the memory-relevant ones memgnn does not model (what it is, what the answer
assumes). Keys that only matter with a feature on (its sub-settings) are no-effect: the
feature's own key carries the warning.
"""

from __future__ import annotations

__all__ = ["FEATURES", "NO_EFFECT", "PLUGINS"]


def _keys(text: str) -> list[str]:
    return text.split()


# key (or "section.*": every key under it) -> why it does not change the step's memory
NO_EFFECT: dict[str, str] = {}
NO_EFFECT.update(
    dict.fromkeys(
        _keys(
            """
            wandb_project wandb_entity wandb_name wandb_run_id wandb_mode wandb_watch
            wandb_log_model use_wandb mlflow_tracking_uri mlflow_experiment_name mlflow_run_name
            hf_mlflow_log_artifacts use_mlflow comet_api_key comet_workspace comet_project_name
            comet_experiment_key comet_mode comet_online comet_experiment_config use_comet
            trackio_project_name trackio_run_name trackio_space_id use_trackio use_tensorboard
            use_otel_metrics otel_metrics_host otel_metrics_port logging_steps profiler_steps
            profiler_steps_start include_tkps include_tokens_per_second loss_watchdog_threshold
            loss_watchdog_patience strict gradio_title gradio_share gradio_server_name
            gradio_server_port gradio_max_new_tokens gradio_temperature
            """
        ),
        "logging",
    )
)
NO_EFFECT.update(
    dict.fromkeys(
        _keys(
            """
            output_dir save_steps saves_per_epoch save_strategy save_total_limit save_safetensors
            save_only_model save_first_step hub_model_id hub_strategy hub_revision
            push_dataset_to_hub resume_from_checkpoint auto_resume_from_checkpoints lora_model_dir
            merge_lora merge_method hf_use_auth_token axolotl_config_path
            num_dataset_shards_to_save fsdp_final_state_dict_type
            """
        ),
        "checkpoints and the Hub",
    )
)
NO_EFFECT.update(
    dict.fromkeys(
        _keys(
            """
            val_set_size eval_steps evals_per_epoch eval_strategy evaluation_strategy
            eval_batch_size eval_sample_packing eval_sequence_len eval_table_size
            eval_max_new_tokens eval_causal_lm_metrics do_causal_lm_eval do_bench_eval
            bench_dataset bench_split test_datasets early_stopping_patience load_best_model_at_end
            metric_for_best_model greater_is_better generate_samples num_generation_samples
            generation_max_new_tokens generation_temperature generation_top_k generation_top_p
            generation_do_sample generation_prompt_ratio
            """
        ),
        "evaluation runs outside the training step",
    )
)
NO_EFFECT.update(
    dict.fromkeys(
        _keys(
            """
            datasets dataset_prepared_path dataset_processes dataset_num_proc
            dataset_keep_in_memory dataset_exact_deduplication dataset_shard_num dataset_shard_idx
            shuffle_merged_datasets shuffle_before_merging_datasets skip_prepare_dataset
            is_preprocess preprocess_iterable streaming streaming_multipack_buffer_size
            pretraining_dataset pretraining_sample_concatenation chat_template chat_template_jinja
            chat_template_kwargs default_system_message train_on_inputs role_boundaries eot_tokens
            tokenizer_config tokenizer_type tokenizer_use_fast tokenizer_legacy
            tokenizer_use_mistral_common tokenizer_save_jinja_files processor_type
            processor_kwargs group_by_length curriculum_sampling min_sample_len
            excess_length_strategy sample_packing_eff_est sample_packing_bin_size
            sample_packing_group_size sample_packing_mp_start_method sample_packing_sequentially
            multipack_real_batches pretrain_multipack_attn pretrain_multipack_buffer_size
            total_num_tokens total_supervised_tokens remove_unused_columns dataloader_num_workers
            dataloader_pin_memory dataloader_prefetch_factor dataloader_drop_last max_prompt_len
            image_size image_resize_algorithm seed pose_split_on_token_ids pose_max_context_len
            pose_num_chunks use_pose
            """
        ),
        "data preparation and loading",
    )
)
NO_EFFECT.update(
    dict.fromkeys(
        _keys(
            """
            num_epochs max_steps learning_rate lr_scheduler lr_scheduler_kwargs
            lr_quadratic_warmup lr_div_factor lr_groups cosine_min_lr_ratio
            cosine_constant_lr_ratio warmup_steps warmup_ratio weight_decay adam_beta1 adam_beta2
            adam_beta3 adam_epsilon adam_epsilon2 max_grad_norm loraplus_lr_ratio
            loraplus_lr_embedding embedding_lr embedding_lr_scale jagged_restart_steps
            jagged_restart_warmup_steps jagged_restart_anneal_steps optim_args
            peft_init_lora_weights peft_use_rslora lora_fan_in_fan_out peft_ensure_weight_tying
            rope_scaling lr_scheduler_kwargs.*
            """
        ),
        "schedule or hyperparameters (same tensors)",
    )
)
NO_EFFECT.update(
    dict.fromkeys(
        _keys(
            """
            local_rank ddp ddp_timeout ddp_bucket_cap_mb ddp_broadcast_buffers
            ddp_find_unused_parameters accelerator_config use_ray ray_run_name ray_num_workers
            resources_per_worker world_size device plugins trust_remote_code revision_of_model
            model_type type_of_model is_llama_derived_model is_falcon_derived_model
            is_mistral_derived_model is_qwen_derived_model tf32 gc_steps gc_collect_steps
            torch_empty_cache_steps low_cpu_mem_usage torch_compile_backend torch_compile_mode
            torch_compile_options sdpa_varlen fp32_norm_classes experimental_skip_move_to_device
            torchdistx_path special_tokens added_tokens_overrides mean_resizing_embeddings
            """
        ),
        "launch, loading or bookkeeping",
    )
)
NO_EFFECT.update(
    dict.fromkeys(
        _keys(
            """
            center_rewards_coefficient cpo_alpha dpo_beta dpo_generate_during_eval
            dpo_label_smoothing dpo_loss_type dpo_loss_weights dpo_norm_loss dpo_padding_free
            dpo_use_liger_kernel dpo_use_logits_to_keep dpo_use_weighting kto_desirable_weight
            kto_undesirable_weight orpo_alpha rpo_alpha simpo_gamma rl_beta
            precompute_ref_log_probs trl trl.* vllm vllm.*
            """
        ),
        "a setting of rl (warned when set)",
    )
)
NO_EFFECT.update(
    dict.fromkeys(
        _keys(
            """
            dion_lr dion_momentum dion_rank_fraction dion_rank_multiple_of qgalore_cos_threshold
            qgalore_gamma_proj qgalore_proj_bits qgalore_proj_group_size qgalore_proj_quant
            qgalore_proj_type qgalore_queue_size qgalore_rank qgalore_scale
            qgalore_update_proj_gap optim_target_modules
            """
        ),
        "a setting of the optimizer (warned when not modelled)",
    )
)
NO_EFFECT.update(
    dict.fromkeys(
        _keys(
            """
            relora_cpu_offload relora_prune_method relora_prune_ratio
            """
        ),
        "a setting of relora",
    )
)
NO_EFFECT.update(
    dict.fromkeys(
        _keys(
            """
            lisa_layers_attribute lisa_step_interval
            """
        ),
        "a setting of lisa_n_layers",
    )
)
NO_EFFECT["chunked_cross_entropy_num_chunks"] = "a setting of chunked_cross_entropy"
NO_EFFECT.update(
    dict.fromkeys(
        _keys(
            """
            tiled_mlp_num_shards tiled_mlp_use_original_mlp
            """
        ),
        "a setting of tiled_mlp",
    )
)
NO_EFFECT.update(
    dict.fromkeys(
        _keys(
            """
            scaling_softmax_bias scaling_softmax_factor
            """
        ),
        "a setting of scaling_softmax",
    )
)
NO_EFFECT.update(
    dict.fromkeys(
        _keys(
            """
            flex_attn_compile_kwargs flex_attn_compile_kwargs.*
            """
        ),
        "a setting of flex_attention",
    )
)
NO_EFFECT["fp8_enable_fsdp_float8_all_gather"] = "a setting of fp8"
NO_EFFECT.update(
    dict.fromkeys(
        _keys(
            """
            heads_k_stride ring_attn_func
            """
        ),
        "a setting of context parallelism",
    )
)
NO_EFFECT.update(
    dict.fromkeys(
        _keys(
            """
            eaft_alpha eaft_k
            """
        ),
        "a setting of use_eaft",
    )
)
NO_EFFECT.update(
    dict.fromkeys(
        _keys(
            """
            num_labels cls_model_config
            """
        ),
        "a setting of reward_model / cls heads",
    )
)
NO_EFFECT["reinit_weights"] = "initialisation"
NO_EFFECT.update(
    dict.fromkeys(
        _keys(
            """
            peft peft.*
            """
        ),
        "LoftQ initialisation",
    )
)
NO_EFFECT["qlora_sharded_model_loading"] = "how the weights load"
NO_EFFECT["max_packed_sequence_len"] = "deprecated (sequence_len is read)"
NO_EFFECT["pad_to_multiple_of"] = "S is sequence_len"
NO_EFFECT["bnb_config_kwargs"] = "null: axolotl's QLoRA defaults"
NO_EFFECT["fsdp_config"] = "null: no FSDP"

# memory-relevant keys memgnn does not model: key -> (what it is, what the answer assumes)
FEATURES: dict[str, tuple[str, str]] = {
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
    "relora": ("ReLoRA", "the answer is the plain step's"),
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
    "fix_untrained_tokens": ("fixing untrained token rows", "the answer is the plain step's"),
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
    "auto_find_batch_size": (
        "halving the batch after an out-of-memory error",
        "the answer is for the stated batch",
    ),
    "trainer_cls": ("a custom trainer class", "the answer is the standard SFT step's"),
    "use_eaft": ("the Entropy-Aware Focal Training loss", "the model's cross entropy"),
    "ebft": ("Energy-Based Fine-Tuning (generations per prompt)", "one SFT step"),
    "ebft.*": ("Energy-Based Fine-Tuning (generations per prompt)", "one SFT step"),
    "large_head_attention": (
        "a Triton attention kernel for wide heads",
        "the model's default attention",
    ),
    "flash_attn_d512": (
        "a Triton attention kernel for wide heads",
        "the model's default attention",
    ),
    "fused_attn_kernel": ("a fused RMSNorm + RoPE kernel", "transformers' modules"),
    "flash_optimum": ("BetterTransformer attention", "the model's default attention"),
    "gemma4_hybrid_attn_impl": ("a hybrid attention kernel", "the model's default attention"),
}

PLUGINS = ("liger_", "cut_cross_entropy", "spectrum_", "kd_", "lm_eval_")
