"""torchtitan job configs (TOML) read key by key (predictor/frameworks/torchtitan.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import tomllib
from memgnn.predictor.frameworks import read_config
from memgnn.predictor.frameworks.files import flatten

# in the layout of torchtitan's llama3 train_configs (before the Feb 2026 Python configs)
LLAMA3_8B = """\
[job]
dump_folder = "./outputs"
description = "Llama 3.1 8B, 8 GPUs"

[profiling]
enable_profiling = false

[metrics]
log_freq = 10
enable_tensorboard = true

[model]
name = "llama3"
flavor = "8B"
hf_assets_path = "./assets/hf/Llama-3.1-8B"

[optimizer]
name = "AdamW"
lr = 3e-4
eps = 1e-8

[lr_scheduler]
warmup_steps = 200

[training]
local_batch_size = 2
global_batch_size = 32
seq_len = 8192
max_norm = 1.0
steps = 1000
dataset = "c4"

[parallelism]
data_parallel_replicate_degree = 1
data_parallel_shard_degree = 8
tensor_parallel_degree = 1
pipeline_parallel_degree = 1
context_parallel_degree = 1
fsdp_reshard_after_forward = "default"

[checkpoint]
enable = false
interval = 500

[compile]
enable = false
components = ["model", "loss"]

[activation_checkpoint]
mode = "selective"
selective_ac_option = "2"

[quantize.linear.float8]
enable_fsdp_float8_all_gather = false
filter_fqns = ["output"]
"""


def test_llama3_8b_on_8_gpus(write, catalog, became, accounted, valid_spec):
    r = read_config(write("llama3_8b.toml", LLAMA3_8B), catalog=catalog)
    assert r.format == "torchtitan"
    assert r.model == "hf:meta-llama/Llama-3.1-8B"
    assert r.sizes == {"B": 2, "S": 8192}
    assert r.options == {
        "sharding": "fsdp",
        "gpus": 8,
        "grad_accum": 2,
        "precision": "fp32",
        "fsdp_param_dtype": "bf16",
        "fsdp_reduce_dtype": "fp32",
        "checkpointing": "every:2",
        "optimizer": "adamw",
        "optimizer_impl": "fused",
    }
    b = became(r)
    assert b["model.flavor"].startswith("--model hf:meta-llama/Llama-3.1-8B;")
    assert b["training.local_batch_size"] == "--batch 2"
    assert b["training.global_batch_size"] == "--grad-accum 2 (32 / (2 x 8))"
    assert b["parallelism.data_parallel_shard_degree"] == "--sharding fsdp --gpus 8"
    assert b["parallelism.tensor_parallel_degree"] == "1: none"
    assert b["activation_checkpoint.mode"] == (
        "--checkpointing every:2 (torchtitan's _apply_layer_sac: blocks 2, 4, ... of 32, "
        "counted from 1)"
    )
    assert b["compile.enable"].startswith("off")
    assert b["quantize.linear.float8.filter_fqns"].startswith("no memory effect: no converter")
    defaults = {k.key: k.became for k in r.keys if k.default}
    # FSDP2's MixedPrecisionPolicy(bf16, fp32) over fp32 shards, as apply_fsdp passes it
    assert defaults["training.mixed_precision_param"].startswith(
        "--fsdp-param-dtype bf16 --fsdp-reduce-dtype fp32"
    )
    assert b["training.dtype"] == "--precision fp32" if "training.dtype" in b else True
    assert not any("MixedPrecisionPolicy" in w for w in r.warnings)
    accounted(r, list(flatten(tomllib.loads(LLAMA3_8B))))
    spec = valid_spec(r)
    assert (spec.parallel.gpus, spec.parallel.sharding, spec.activations.checkpointing) == (
        8,
        "fsdp",
        "every:2",
    )
    assert spec.activations.checkpointed(32) == list(range(1, 32, 2))
    assert (spec.parallel.fsdp_param_dtype, spec.parallel.fsdp_reduce_dtype) == ("bf16", "fp32")


def test_torchtitan_s_defaults_for_what_the_file_leaves_out(write):
    r = read_config(write("min.toml", '[model]\nname = "llama3"\nflavor = "70B"\n'))
    assert r.model == "hf:meta-llama/Llama-3.1-70B"
    assert r.sizes == {"B": 8, "S": 2048}
    assert r.options["checkpointing"] == "every:2"  # selective, every 2nd of 80 layers
    assert r.options["sharding"] == "fsdp" and "gpus" not in r.options  # -1: every rank
    assert any("data_parallel_shard_degree -1" in w and "--gpus N" in w for w in r.warnings)
    defaults = {k.key for k in r.keys if k.default}
    assert {
        "training.local_batch_size",
        "training.seq_len",
        "activation_checkpoint.mode",
        "optimizer.implementation",
        "parallelism.data_parallel_shard_degree",
    } <= defaults


def test_an_older_toml_and_what_is_not_modelled(write, became):
    text = """\
[model]
name = "llama3"
flavor = "8B"
converters = ["float8"]

[training]
batch_size = 1
seq_len = 4096
compile = true
data_parallel_shard_degree = 4
tensor_parallel_degree = 2
mixed_precision_param = "bfloat16"

[experimental]
pipeline_parallel_degree = 1
context_parallel_degree = 2

[float8]
enable_fsdp_float8_all_gather = true

[activation_checkpoint]
mode = "selective"
selective_ac_option = "op"
"""
    r = read_config(write("old.toml", text))
    assert r.sizes == {"B": 1, "S": 4096}
    assert r.options["gpus"] == 16 and r.options["sharding"] == "fsdp"
    assert r.options["checkpointing"] == "selective-op"
    # the float8 converter is torchao's default config (tensorwise), nothing filtered
    assert r.options["float8"] == "tensorwise" and r.options["float8_filter_fqns"] == ""
    assert not any(w.startswith("model.converters") for w in r.warnings)
    # training.compile: each block, static shapes (float8 with compile is modelled so)
    assert (r.options["compile"], r.options["compile_dynamic"]) == ("blocks", False)
    assert "compile_loss" not in r.options  # the older training.compile: blocks only
    starts = (
        "training.tensor_parallel_degree: 2",
        "experimental.context_parallel_degree: 2",
    )
    for start in starts:
        assert any(w.startswith(start) for w in r.warnings), start
    # FSDP shards: the weights all-gathered in float8, as torchtitan's converter sets it
    assert r.options["float8_fsdp_all_gather"] is True
    assert became(r)["float8.enable_fsdp_float8_all_gather"] == "--float8-fsdp-all-gather true"
    assert not any("float8 all-gather" in w for w in r.warnings)
    assert became(r)["experimental.pipeline_parallel_degree"] == "1: none"
    assert became(r)["activation_checkpoint.selective_ac_option"].startswith(
        "--checkpointing selective-op (torchtitan's _apply_op_sac policy"
    )
    # under FSDP the mixed-precision dtypes are FSDP2's policy, no autocast
    assert (r.options["precision"], r.options["fsdp_param_dtype"]) == ("fp32", "bf16")


def test_hsdp_and_full_checkpointing(write, valid_spec):
    text = """\
[model]
name = "qwen3"
flavor = "8B"
[training]
dtype = "bfloat16"
[parallelism]
data_parallel_replicate_degree = 2
data_parallel_shard_degree = 8
fsdp_reshard_after_forward = "never"
[activation_checkpoint]
mode = "full"
"""
    r = read_config(write("hsdp.toml", text))
    assert r.model == "hf:Qwen/Qwen3-8B"
    spec = valid_spec(r)
    assert (spec.parallel.sharding, spec.parallel.gpus, spec.parallel.hsdp_shard_size) == (
        "hsdp",
        16,
        8,
    )
    assert (
        spec.numerics.precision,
        spec.activations.checkpointing,
        spec.parallel.reshard_after_forward,
    ) == (
        "bf16",
        "full",
        False,
    )


def test_an_unknown_flavor_and_key(write):
    text = '[model]\nname = "llama3"\nflavor = "debugmodel"\n[training]\nwarp_speed = 9\n'
    r = read_config(write("debug.toml", text))
    assert r.model is None
    assert any("flavor debugmodel: no Hugging Face model" in w for w in r.warnings)
    assert any(w.startswith("unknown key training.warp_speed") for w in r.warnings)


def test_a_global_batch_that_does_not_divide_is_refused(write):
    text = "[training]\nlocal_batch_size = 3\nglobal_batch_size = 32\n"
    text += "[parallelism]\ndata_parallel_shard_degree = 2\n"
    with pytest.raises(ValueError, match="global_batch_size: 32 is not a multiple"):
        read_config(write("bad.toml", text))


# every key of torchtitan's JobConfig at e347b1e (torchtitan/config/job_config.py) and at
# 29fb3f9 (torchtitan/config_manager.py), as dotted TOML keys (read with ast)
JOB_CONFIG_KEYS = """
    activation_checkpoint.debug activation_checkpoint.determinism_check
    activation_checkpoint.early_stop activation_checkpoint.memory_budget
    activation_checkpoint.mode
    activation_checkpoint.per_op_sac_force_recompute_mm_shapes_by_fqns
    activation_checkpoint.preserve_rng_state activation_checkpoint.selective_ac_option
    activation_checkpoint.visualize_memory_budget_pareto checkpoint.async_mode
    checkpoint.create_seed_checkpoint checkpoint.enable checkpoint.enable_checkpoint
    checkpoint.enable_first_step_checkpoint checkpoint.enable_ft_dataloader_checkpoints
    checkpoint.exclude_from_loading checkpoint.export_dtype checkpoint.folder
    checkpoint.initial_load_in_hf checkpoint.initial_load_in_hf_quantized
    checkpoint.initial_load_model_only checkpoint.initial_load_path checkpoint.interval
    checkpoint.keep_latest_k checkpoint.last_save_in_hf checkpoint.last_save_model_only
    checkpoint.load_only checkpoint.load_step checkpoint.model_weights_only
    comm.init_timeout_seconds comm.mode comm.save_traces_file_prefix comm.save_traces_folder
    comm.trace_buf_size comm.train_timeout_seconds compile.backend compile.components
    compile.enable debug.deterministic debug.deterministic_warn_only
    debug.moe_force_load_balance debug.seed experimental.custom_args_module
    experimental.custom_import fault_tolerance.enable fault_tolerance.group_size
    fault_tolerance.min_replica_size fault_tolerance.process_group
    fault_tolerance.process_group_timeout_ms fault_tolerance.replica_id
    fault_tolerance.semi_sync_method fault_tolerance.sync_steps float8.emulate
    float8.enable_fsdp_float8_all_gather float8.filter_fqns
    float8.force_recompute_fp8_weight_in_bwd float8.precompute_float8_dynamic_scale_for_fsdp
    float8.recipe_name job.config_file job.custom_config_module job.description job.dump_folder
    job.print_args job.print_config job.save_config_file job.use_for_integration_test
    lr_scheduler.decay_ratio lr_scheduler.decay_type lr_scheduler.lr_min
    lr_scheduler.min_lr_factor lr_scheduler.total_steps lr_scheduler.warmup_steps
    memory_estimation.disable_fake_mode memory_estimation.enable memory_estimation.enabled
    metrics.disable_color_printing metrics.enable_tensorboard metrics.enable_wandb
    metrics.log_freq metrics.save_for_all_ranks metrics.save_tb_folder model.converters
    model.flavor model.hf_assets_path model.name model.print_after_conversion
    model.tokenizer_path mx.filter_fqns mx.recipe_name mx.use_fp8_dim1_cast_triton_kernel
    optimizer.beta1 optimizer.beta2 optimizer.early_step_in_backward optimizer.eps
    optimizer.implementation optimizer.lr optimizer.name optimizer.weight_decay
    parallelism.context_parallel_degree parallelism.context_parallel_load_balancer
    parallelism.context_parallel_rotate_method parallelism.data_parallel_replicate_degree
    parallelism.data_parallel_shard_degree parallelism.disable_loss_parallel
    parallelism.enable_async_tensor_parallel parallelism.enable_compiled_autograd
    parallelism.expert_parallel_comm_backend parallelism.expert_parallel_degree
    parallelism.expert_tensor_parallel_degree parallelism.fsdp_reshard_after_forward
    parallelism.module_fqns_per_model_part parallelism.pipeline_parallel_degree
    parallelism.pipeline_parallel_expert_parallel_overlap
    parallelism.pipeline_parallel_first_stage_less_layers
    parallelism.pipeline_parallel_last_stage_less_layers
    parallelism.pipeline_parallel_layers_per_stage parallelism.pipeline_parallel_microbatch_size
    parallelism.pipeline_parallel_schedule parallelism.pipeline_parallel_schedule_csv
    parallelism.pipeline_parallel_split_points parallelism.tensor_parallel_degree
    profiling.enable_memory_snapshot profiling.enable_profiling profiling.profile_freq
    profiling.profiler_active profiling.profiler_warmup profiling.save_memory_snapshot_folder
    profiling.save_traces_folder quantize.grouped_mm.float8.fqns quantize.grouped_mm.mx.fqns
    quantize.grouped_mm.mx.recipe_name quantize.linear.float8.emulate
    quantize.linear.float8.enable_fsdp_float8_all_gather quantize.linear.float8.filter_fqns
    quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp
    quantize.linear.float8.recipe_name quantize.linear.mx.filter_fqns
    quantize.linear.mx.mxfp8_dim1_cast_kernel_choice quantize.linear.mx.recipe_name
    training.batch_size training.compile training.dataloader.num_workers
    training.dataloader.persistent_workers training.dataloader.pin_memory
    training.dataloader.prefetch_factor training.dataset training.dataset_path
    training.deterministic training.dtype training.enable_cpu_offload training.gc_debug
    training.gc_freq training.global_batch_size training.local_batch_size training.max_norm
    training.mixed_precision_param training.mixed_precision_reduce training.seed
    training.seq_len training.steps validation.dataloader.num_workers
    validation.dataloader.persistent_workers validation.dataloader.pin_memory
    validation.dataloader.prefetch_factor validation.dataset validation.dataset_path
    validation.enable validation.freq validation.local_batch_size validation.seq_len
    validation.steps
""".split()


def test_every_key_of_the_job_config_is_known():
    """A config naming every JobConfig key of both eras reads with no unknown key."""
    from pathlib import Path

    from memgnn.predictor.frameworks.torchtitan import read_torchtitan

    words = {
        "name": "llama3",
        "flavor": "8B",
        "mode": "full",
        "selective_ac_option": "2",
        "dtype": "float32",
        "mixed_precision_param": "bfloat16",
        "mixed_precision_reduce": "float32",
        "implementation": "fused",
        "fsdp_reshard_after_forward": "default",
        "converters": [],
        "global_batch_size": -1,
    }
    data: dict = {}
    for key in JOB_CONFIG_KEYS:
        *sections, name = key.split(".")
        table = data
        for s in sections:
            table = table.setdefault(s, {})
        table[name] = words.get(name, 1)
    r = read_torchtitan(Path("all.toml"), data)
    assert [w for w in r.warnings if w.startswith("unknown key")] == []
    assert len(JOB_CONFIG_KEYS) == 171


def test_the_float8_converter_becomes_float8_training(write, became):
    text = """\
[model]
name = "llama3"
flavor = "8B"
converters = ["quantize.linear.float8"]

[quantize.linear.float8]
recipe_name = "rowwise"
filter_fqns = ["output", "attention.wq", "auto_filter_small_kn"]
precompute_float8_dynamic_scale_for_fsdp = false

[quantize.linear.mx]
filter_fqns = ["output"]
"""
    r = read_config(write("f8.toml", text))
    assert r.options["float8"] == "rowwise"
    # torchtitan's module names in the transformers class's spelling; the heuristic dropped
    assert r.options["float8_filter_fqns"] == "output,self_attn.q_proj"
    assert any(w.startswith("quantize.linear.float8.filter_fqns: auto_filter") for w in r.warnings)
    b = became(r)
    assert b["model.converters"].startswith("--float8 rowwise")
    assert b["quantize.linear.mx.filter_fqns"].startswith("no memory effect")
    assert b["quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp"].startswith("off")
    bad = text.replace('"rowwise"', '"mxfp8"')
    with pytest.raises(ValueError, match="recipe_name"):
        read_config(write("bad.toml", bad))


def test_compile_with_fsdp_is_each_block_compiled_and_float8_keeps_it_eager(write):
    """torchtitan's apply_compile then apply_fsdp: `--compile blocks --sharding fsdp`
    with static shapes (tests/predictor/emulate/test_compile_sharded.py), float8 too."""
    text = LLAMA3_8B.replace("[compile]\nenable = false", "[compile]\nenable = true")
    text = text.replace('mode = "selective"', 'mode = "none"')
    r = read_config(write("compiled.toml", text))
    assert (r.options["compile"], r.options["sharding"]) == ("blocks", "fsdp")
    assert not any("torch.compile" in w for w in r.warnings)
    # compile.components ["model", "loss"] (its default): the loss compiled too
    assert r.options["compile_loss"] is True
    model_only = text.replace('components = ["model", "loss"]', 'components = ["model"]')
    assert "compile_loss" not in read_config(write("model_only.toml", model_only)).options
    text = text.replace("[model]\n", '[model]\nconverters = ["float8"]\n')
    r = read_config(write("float8.toml", text))
    assert (r.options["compile"], r.options["float8"]) == ("blocks", "tensorwise")
    assert r.options["compile_dynamic"] is False
    assert not any("torch.compile" in w for w in r.warnings), r.warnings


TITAN_CONFIGS = Path(__file__).parents[3] / "benchmarks" / "configs" / "torchtitan"


def test_the_benchmark_configs_read_as_their_rows(write, catalog, became, valid_spec):
    """benchmarks/configs/torchtitan (public-gpu-measurements-2 rows aof81..aof812, ttitan1,
    2, 6): FSDP2 with MixedPrecisionPolicy(bf16, fp32) over fp32 shards and op-level
    selective (ttitan2: full) checkpointing, every one read; torch.compile reads as
    `--compile blocks` with static shapes, float8 too, with FSDP's float8 all-gather and
    precomputed scales where the file has them (MX is what rows still warn about). The
    same config with compile off reads without a warning into a valid spec."""
    files = sorted(TITAN_CONFIGS.glob("*.toml"))
    assert len(files) == 15
    for f in files:
        r = read_config(f, catalog=catalog)
        assert r.model == "hf:meta-llama/Llama-3.1-8B", f.name
        mp = ("precision", "fsdp_param_dtype", "fsdp_reduce_dtype")
        assert [r.options[k] for k in mp] == ["fp32", "bf16", "fp32"], f.name
        ck = "full" if f.stem == "ttitan2" else "selective-op"
        assert (r.options["sharding"], r.options["checkpointing"]) == ("fsdp", ck), f.name
        compile_warnings = [w for w in r.warnings if w.startswith("compile.enable: true")]
        assert not compile_warnings and r.options["compile"] == "blocks", f.name
        assert r.options["compile_dynamic"] is False, f.name  # seq_len fixed: static
        other = [w for w in r.warnings if w not in compile_warnings]
        assert all("MX" in w for w in other), other  # aof810, aof811
        text = f.read_text()
        if "enable_fsdp_float8_all_gather = true" in text:  # aof82, ttitan1, 2, 6
            assert r.options["float8_fsdp_all_gather"] is True, f.name
        if "precompute_float8_dynamic_scale_for_fsdp = true" in text:
            assert r.options["float8_precompute_scale"] is True, f.name
    eager = (TITAN_CONFIGS / "aof81.toml").read_text().replace("enable = true", "enable = false")
    r = read_config(write("aof81_eager.toml", eager), catalog=catalog)
    assert r.warnings == []
    assert became(r)["compile.enable"] == "off"
    spec = valid_spec(r)
    assert (spec.parallel.gpus, spec.activations.checkpointing, spec.kernels.compile) == (
        8,
        "selective-op",
        "none",
    )
    assert (spec.numerics.precision, spec.parallel.fsdp_param_dtype) == ("fp32", "bf16")


def test_pipeline_alone_maps_to_pp(write, valid_spec, became):
    """pipeline_parallel_degree alone -> --pp N --gpus N, the schedule by torchtitan's
    name, the micro-batch size as --batch and local / micro as --microbatches."""
    text = """\
[model]
name = "llama3"
flavor = "8B"
[training]
local_batch_size = 8
seq_len = 2048
[parallelism]
data_parallel_shard_degree = 1
pipeline_parallel_degree = 2
pipeline_parallel_schedule = "GPipe"
pipeline_parallel_microbatch_size = 2
[activation_checkpoint]
mode = "none"
"""
    r = read_config(write("pp.toml", text))
    assert r.sizes == {"B": 2, "S": 2048}
    opts = {k: r.options[k] for k in ("pp", "gpus", "pp_schedule", "microbatches")}
    assert opts == {"pp": 2, "gpus": 2, "pp_schedule": "gpipe", "microbatches": 4}
    spec = valid_spec(r)
    assert (spec.parallel.pp, spec.parallel.pp_microbatches, spec.parallel.sharding) == (
        2, 4, "none",
    )  # fmt: skip
    assert became(r)["parallelism.pipeline_parallel_microbatch_size"].startswith("--batch 2")
    assert not any("pipeline" in w for w in r.warnings), r.warnings


def test_pipeline_with_fsdp_maps_to_pp_sharding_fsdp(write, valid_spec, became):
    """pipeline_parallel_degree 2 x data_parallel_shard_degree 4 -> --pp 2 --sharding fsdp
    --gpus 8; fsdp_reshard_after_forward left at torchtitan's "default" -> false under PP
    (apply_fsdp: not pp_enabled), "always" -> true."""
    text = """\
[model]
name = "llama3"
flavor = "8B"
[training]
local_batch_size = 8
seq_len = 2048
[parallelism]
data_parallel_shard_degree = 4
pipeline_parallel_degree = 2
[activation_checkpoint]
mode = "none"
"""
    r = read_config(write("ppfsdp.toml", text))
    opts = {k: r.options[k] for k in ("pp", "gpus", "sharding", "fsdp_reshard_after_forward")}
    assert opts == {"pp": 2, "gpus": 8, "sharding": "fsdp", "fsdp_reshard_after_forward": False}
    spec = valid_spec(r)
    assert (spec.parallel.pp, spec.parallel.dp, spec.parallel.pp_microbatches) == (2, 4, 8)
    read = next(k for k in r.keys if k.key == "parallelism.fsdp_reshard_after_forward")
    assert read.default and "not pp_enabled" in read.became
    assert not any("pipeline" in w for w in r.warnings), r.warnings
    line = "pipeline_parallel_degree = 2\n"
    always = text.replace(line, line + 'fsdp_reshard_after_forward = "always"\n')
    r = read_config(write("always.toml", always))
    assert valid_spec(r).parallel.reshard_after_forward is True
    assert became(r)["parallelism.fsdp_reshard_after_forward"].endswith("true")


def test_pipeline_defaults_and_what_is_not_modelled(write):
    """torchtitan's defaults (1F1B, micro-batch 1); with data parallelism (shard degree
    -1: every rank left) a warning says the answer takes every rank as a stage; an
    interleaved schedule is read, then refused by name when the spec is built."""
    base = """\
[model]
name = "llama3"
flavor = "8B"
[training]
local_batch_size = 4
[parallelism]
pipeline_parallel_degree = 4
"""
    r = read_config(write("pp4.toml", base))
    assert (r.options["pp_schedule"], r.options["microbatches"], r.sizes["B"]) == ("1f1b", 4, 1)
    assert any(w.startswith("data_parallel_shard_degree -1 with pipeline") for w in r.warnings)
    assert any("torchtitan's default split counts the embeddings" in w for w in r.warnings)
    from memgnn.predictor.spec.train import TrainSpec

    r = read_config(write("i.toml", base + 'pipeline_parallel_schedule = "ZBVZeroBubble"\n'))
    assert r.options["pp_schedule"] == "zbvzerobubble"
    with pytest.raises(ValueError, match="--pp-schedule zbvzerobubble is not modelled yet"):
        TrainSpec.of(**r.options)
    r = read_config(write("tp.toml", base + "tensor_parallel_degree = 2\n"))
    assert "pp" not in r.options
    assert any(w.startswith("parallelism.pipeline_parallel_degree: 4") for w in r.warnings)
