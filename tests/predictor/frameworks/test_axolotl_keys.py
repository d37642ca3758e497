"""axolotl's key tables (predictor/frameworks/axolotl_keys.py)."""

from __future__ import annotations

import yaml
from memgnn.predictor.frameworks import read_config
from memgnn.predictor.frameworks.axolotl_keys import FEATURES, NO_EFFECT

# the 388 fields of AxolotlInputConfig and its mixins at axolotl-ai-cloud/axolotl@067b021
# (src/axolotl/utils/schemas/*.py, read with ast)
SCHEMA_FIELDS = """
    accelerator_config activation_offloading adam_beta1 adam_beta2 adam_beta3 adam_epsilon
    adam_epsilon2 adapter added_tokens_overrides attn_implementation auto_find_batch_size
    auto_resume_from_checkpoints axolotl_config_path base_model base_model_config
    batch_flattening batch_size bench_dataset bench_split bf16 bfloat16 bnb_config_kwargs
    center_rewards_coefficient chat_template chat_template_jinja chat_template_kwargs
    chunked_cross_entropy chunked_cross_entropy_num_chunks cls_model_config comet_api_key
    comet_experiment_config comet_experiment_key comet_mode comet_online comet_project_name
    comet_workspace context_parallel_size cosine_constant_lr_ratio cosine_min_lr_ratio cpo_alpha
    curriculum_sampling dataloader_drop_last dataloader_num_workers dataloader_pin_memory
    dataloader_prefetch_factor dataset_exact_deduplication dataset_keep_in_memory
    dataset_num_proc dataset_prepared_path dataset_processes dataset_shard_idx dataset_shard_num
    datasets ddp ddp_broadcast_buffers ddp_bucket_cap_mb ddp_find_unused_parameters ddp_timeout
    deepcompile deepspeed default_system_message device device_map dion_lr dion_momentum
    dion_rank_fraction dion_rank_multiple_of do_bench_eval do_causal_lm_eval dp_replicate_size
    dp_shard_size dpo_beta dpo_generate_during_eval dpo_label_smoothing dpo_loss_type
    dpo_loss_weights dpo_norm_loss dpo_padding_free dpo_use_liger_kernel dpo_use_logits_to_keep
    dpo_use_weighting dynamic_checkpoint eaft_alpha eaft_k eager_attention
    early_stopping_patience ebft embedding_lr embedding_lr_scale embeddings_skip_upcast
    eot_tokens eval_batch_size eval_causal_lm_metrics eval_max_new_tokens eval_sample_packing
    eval_sequence_len eval_steps eval_strategy eval_table_size evals_per_epoch
    evaluation_strategy excess_length_strategy experimental_skip_move_to_device
    experts_implementation fix_untrained_tokens flash_attention flash_attn_cross_entropy
    flash_attn_d512 flash_attn_fuse_mlp flash_attn_rms_norm flash_optimum flex_attention
    flex_attn_compile_kwargs float16 float32 fp16 fp32_norm_classes fp32_norms fp8
    fp8_enable_fsdp_float8_all_gather freeze_mm_modules fsdp fsdp_config
    fsdp_final_state_dict_type fsdp_version fused_attn_kernel gc_collect_steps gc_steps
    gemma4_hybrid_attn_impl generate_samples generation_do_sample generation_max_new_tokens
    generation_prompt_ratio generation_temperature generation_top_k generation_top_p gptq
    gpu_memory_limit gradient_accumulation_steps gradient_checkpointing
    gradient_checkpointing_kwargs gradio_max_new_tokens gradio_server_name gradio_server_port
    gradio_share gradio_temperature gradio_title greater_is_better group_by_length
    heads_k_stride hf_mlflow_log_artifacts hf_use_auth_token hub_model_id hub_revision
    hub_strategy image_resize_algorithm image_size include_tkps include_tokens_per_second
    is_falcon_derived_model is_llama_derived_model is_mistral_derived_model is_preprocess
    is_qwen_derived_model jagged_restart_anneal_steps jagged_restart_steps
    jagged_restart_warmup_steps kto_desirable_weight kto_undesirable_weight large_head_attention
    layer_offloading learning_rate lisa_layers_attribute lisa_n_layers lisa_step_interval
    llama4_linearized_experts load_best_model_at_end load_in_4bit load_in_8bit local_rank
    logging_steps lora_alpha lora_alpha_pattern lora_dropout lora_embedding_kernel
    lora_fan_in_fan_out lora_mlp_kernel lora_model_dir lora_modules_to_save lora_o_kernel
    lora_on_cpu lora_qkv_kernel lora_r lora_rank_pattern lora_target_linear lora_target_modules
    lora_target_parameters loraplus_lr_embedding loraplus_lr_ratio loss_watchdog_patience
    loss_watchdog_threshold low_cpu_mem_usage lr_div_factor lr_groups lr_quadratic_warmup
    lr_scheduler lr_scheduler_kwargs max_grad_norm max_memory max_packed_sequence_len
    max_prompt_len max_steps mean_resizing_embeddings merge_lora merge_method
    metric_for_best_model micro_batch_size min_sample_len mlflow_experiment_name mlflow_run_name
    mlflow_tracking_uri model_quantization_config model_quantization_config_kwargs
    multipack_real_batches neftune_noise_alpha noisy_embedding_alpha num_dataset_shards_to_save
    num_epochs num_generation_samples num_labels optim_args optim_target_modules optimizer
    orpo_alpha otel_metrics_host otel_metrics_port output_dir overrides_of_model_config
    overrides_of_model_kwargs pad_to_multiple_of pad_to_sequence_len peft
    peft_autocast_adapter_dtype peft_ensure_weight_tying peft_init_lora_weights
    peft_layer_replication peft_layers_pattern peft_layers_to_transform
    peft_trainable_token_indices peft_use_dora peft_use_rslora plugins pose_max_context_len
    pose_num_chunks pose_split_on_token_ids precompute_ref_log_probs preprocess_iterable
    pretrain_multipack_attn pretrain_multipack_buffer_size pretraining_dataset
    pretraining_sample_concatenation process_reward_model processor_kwargs processor_type
    profiler_steps profiler_steps_start push_dataset_to_hub qat qgalore_cos_threshold
    qgalore_gamma_proj qgalore_proj_bits qgalore_proj_group_size qgalore_proj_quant
    qgalore_proj_type qgalore_queue_size qgalore_rank qgalore_scale qgalore_update_proj_gap
    qlora_sharded_model_loading quantization quantize_moe_experts ray_num_workers ray_run_name
    reinit_weights relora relora_cpu_offload relora_prune_method relora_prune_ratio
    remove_unused_columns resize_token_embeddings_to_32x resources_per_worker
    resume_from_checkpoint revision_of_model reward_model ring_attn_func rl rl_beta
    role_boundaries rope_scaling rpo_alpha s2_attention sage_attention sample_packing
    sample_packing_bin_size sample_packing_eff_est sample_packing_group_size
    sample_packing_mp_start_method sample_packing_sequentially save_first_step save_only_model
    save_safetensors save_steps save_strategy save_total_limit saves_per_epoch scaling_softmax
    scaling_softmax_bias scaling_softmax_factor sdp_attention sdpa_varlen seed
    selective_checkpointing sequence_len sequence_parallel_degree shrink_embeddings
    shuffle_before_merging_datasets shuffle_merged_datasets simpo_gamma skip_prepare_dataset
    special_tokens streaming streaming_multipack_buffer_size strict tensor_parallel_size
    test_datasets tf32 tiled_mlp tiled_mlp_num_shards tiled_mlp_use_original_mlp
    tokenizer_config tokenizer_legacy tokenizer_save_jinja_files tokenizer_type
    tokenizer_use_fast tokenizer_use_mistral_common tokens torch_compile torch_compile_backend
    torch_compile_mode torch_compile_options torch_empty_cache_steps torchdistx_path
    total_num_tokens total_supervised_tokens trackio_project_name trackio_run_name
    trackio_space_id train_on_inputs trainer_cls trl trust_remote_code type_of_model
    unfrozen_parameters use_comet use_eaft use_kernels use_mlflow use_onebitllms
    use_otel_metrics use_pose use_ray use_tensorboard use_trackio use_wandb val_set_size vllm
    wandb_entity wandb_log_model wandb_mode wandb_name wandb_project wandb_run_id wandb_watch
    warmup_ratio warmup_steps weight_decay world_size xformers_attention
""".split()


def test_the_tables_do_not_overlap():
    assert set(NO_EFFECT) & set(FEATURES) == set()


def test_every_field_of_axolotl_s_schema_is_known(write):
    """A config naming every field (null) reads with no unknown key: each is mapped, has
    no memory effect, or is warned as not modelled."""
    data = dict.fromkeys(SCHEMA_FIELDS)
    data["base_model"] = "meta-llama/Llama-3.1-8B"
    r = read_config(write("all.yml", yaml.safe_dump(data)), format="axolotl")
    assert [w for w in r.warnings if w.startswith("unknown key")] == []
    assert len(SCHEMA_FIELDS) == 388
