"""torchtune recipe configs read key by key (predictor/frameworks/torchtune.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from memgnn.predictor.frameworks import read_config
from memgnn.predictor.frameworks.files import flatten

# in the layout of torchtune's recipes/configs/llama3_1/*_qlora_single_device.yaml
QLORA = """\
# tune run lora_finetune_single_device --config qlora.yaml
output_dir: /tmp/torchtune/llama3_1_8B/qlora

model:
  _component_: torchtune.models.llama3_1.qlora_llama3_1_8b
  lora_attn_modules: ['q_proj', 'v_proj', 'output_proj']
  apply_lora_to_mlp: True
  apply_lora_to_output: False
  lora_rank: 8
  lora_alpha: 16
  lora_dropout: 0.0

tokenizer:
  _component_: torchtune.models.llama3.llama3_tokenizer
  path: /tmp/Meta-Llama-3.1-8B-Instruct/original/tokenizer.model
  max_seq_len: 2048

checkpointer:
  _component_: torchtune.training.FullModelHFCheckpointer
  checkpoint_dir: /tmp/Meta-Llama-3.1-8B-Instruct/
  checkpoint_files: [model-00001-of-00004.safetensors, model-00002-of-00004.safetensors]
  output_dir: ${output_dir}
  model_type: LLAMA3
resume_from_checkpoint: False
save_adapter_weights_only: False

dataset:
  _component_: torchtune.datasets.alpaca_cleaned_dataset
  packed: True
seed: null
shuffle: True
batch_size: 2

optimizer:
  _component_: torch.optim.AdamW
  fused: True
  weight_decay: 0.01
  lr: 3e-4
lr_scheduler:
  _component_: torchtune.training.lr_schedulers.get_cosine_schedule_with_warmup
  num_warmup_steps: 100

loss:
  _component_: torch.nn.CrossEntropyLoss

epochs: 1
max_steps_per_epoch: null
gradient_accumulation_steps: 8
clip_grad_norm: null
compile: False

metric_logger:
  _component_: torchtune.training.metric_logging.DiskLogger
  log_dir: ${output_dir}/logs
log_every_n_steps: 1
log_peak_memory_stats: True

device: cuda
dtype: bf16
enable_activation_checkpointing: True
enable_activation_offloading: False
"""


def test_a_qlora_single_device_recipe(write, catalog, became, accounted, valid_spec):
    import yaml

    r = read_config(write("qlora.yaml", QLORA), catalog=catalog)
    assert r.format == "torchtune"
    assert r.model == "hf:meta-llama/Llama-3.1-8B"
    assert r.sizes == {"B": 2, "S": 2048}
    assert r.options == {
        "peft": "lora",
        "lora_dtype": "model",
        "lora_targets": "q_proj,v_proj,o_proj,gate_proj,up_proj,down_proj",
        "lora_r": 8,
        "lora_alpha": 16.0,
        "lora_dropout": 0.0,
        "quantize_base": "nf4-dq",
        "grad_accum": 8,
        "precision": "bf16",
        "checkpointing": "full",
        "optimizer": "adamw",
        "optimizer_impl": "fused",
    }
    b = became(r)
    assert b["model._component_"].startswith("--model hf:meta-llama/Llama-3.1-8B;")
    assert b["model.lora_attn_modules"].startswith("--lora-targets q_proj,v_proj,o_proj,gate_proj")
    assert b["model.lora_rank"] == "--lora-r 8"
    assert b["tokenizer.max_seq_len"] == "--seq 2048 (every packed row)"
    assert b["dataset.packed"] == "rows of exactly max_seq_len"
    assert b["dtype"].startswith("--precision bf16")
    assert b["enable_activation_checkpointing"] == "--checkpointing full"
    assert b["optimizer.fused"] == "--optimizer-impl fused"
    assert b["compile"].startswith("off")
    assert b["checkpointer.output_dir"] == "no memory effect: checkpoints"
    assert r.key("checkpointer.output_dir").value == "/tmp/torchtune/llama3_1_8B/qlora"  # ${...}
    assert any("torchao's NF4Tensor" in w for w in r.warnings)
    accounted(r, list(flatten(yaml.safe_load(QLORA), atomic=("model.lora_attn_modules",))))
    assert valid_spec(r).quant.base == "nf4-dq"


FULL_DISTRIBUTED = """\
output_dir: /tmp/torchtune/qwen2_5_7B/full
model:
  _component_: torchtune.models.qwen3.qwen3_8b_base
tokenizer:
  _component_: torchtune.models.qwen2_5.qwen2_5_tokenizer
  path: /tmp/Qwen2.5-7B-Instruct/vocab.json
  merges_file: /tmp/Qwen2.5-7B-Instruct/merges.txt
  max_seq_len: null
dataset:
  _component_: torchtune.datasets.alpaca_cleaned_dataset
  packed: False
batch_size: 2
optimizer:
  _component_: torch.optim.AdamW
  lr: 5e-6
  fused: True
optimizer_in_bwd: True
loss:
  _component_: torchtune.modules.loss.LinearCrossEntropyLoss
epochs: 1
gradient_accumulation_steps: 1
fsdp_cpu_offload: False
fsdp_reshard_after_forward: True
data_parallel_shard_dim: -1
compile: True
dtype: bf16
enable_activation_checkpointing: True
enable_activation_offloading: True
"""


def test_fsdp_cpu_offload_is_read(write, catalog, became, valid_spec):
    text = FULL_DISTRIBUTED.replace("fsdp_cpu_offload: False", "fsdp_cpu_offload: True")
    text = text.replace("optimizer_in_bwd: True", "optimizer_in_bwd: False")
    r = read_config(write("full_distributed.yaml", text), catalog=catalog)
    assert r.options["fsdp_cpu_offload"] is True
    assert became(r)["fsdp_cpu_offload"] == "--fsdp-cpu-offload true"
    assert not any(w.startswith("fsdp_cpu_offload") for w in r.warnings)
    r.options.pop("compile", None)  # --compile with sharding is refused on its own
    assert valid_spec(r, gpus=8).parallel.fsdp_cpu_offload


def test_a_full_distributed_recipe_warns_what_is_not_modelled(write, catalog, became, valid_spec):
    r = read_config(write("full_distributed.yaml", FULL_DISTRIBUTED), catalog=catalog)
    assert r.model == "hf:Qwen/Qwen3-8B"  # the base checkpoint's shapes: the catalog's Qwen3-8B
    assert r.sizes == {"B": 2}
    assert r.options["sharding"] == "fsdp" and "peft" not in r.options
    assert r.options["offload_activations"] == "torchtune"  # read, no longer only warned
    starts = (
        "optimizer_in_bwd: true: the optimizer step inside backward under FSDP is not",
        "loss._component_: torchtune.modules.loss.LinearCrossEntropyLoss: a chunked",
        "compile: true: torch.compile",
        "tokenizer.max_seq_len is not set",
        "a distributed recipe: the GPU count",
    )
    for start in starts:
        assert any(w.startswith(start) for w in r.warnings), start
    assert became(r)["fsdp_reshard_after_forward"] == "--fsdp-reshard-after-forward true"
    assert became(r)["fsdp_cpu_offload"].startswith("off")
    spec = valid_spec(r, gpus=8)
    assert (spec.parallel.sharding, spec.parallel.gpus, spec.numerics.precision) == (
        "fsdp",
        8,
        "bf16",
    )


def test_an_instruct_builder_reads_as_its_base_in_the_catalog(write, catalog):
    text = "model:\n  _component_: torchtune.models.qwen2_5.lora_qwen2_5_7b_instruct\n"
    text += "  lora_attn_modules: [q_proj, k_proj, v_proj]\nbatch_size: 1\ndtype: bf16\n"
    r = read_config(write("t.yaml", text), catalog=catalog)
    assert r.model == "hf:Qwen/Qwen2.5-7B"
    assert r.options["lora_targets"] == "q_proj,k_proj,v_proj"
    assert "the catalog's Qwen/Qwen2.5-7B" in r.key("model._component_").became


def test_builder_arguments_memgnn_does_not_read_are_warned(write):
    text = """\
model:
  _component_: torchtune.models.llama3_2.llama3_2_1b
  tie_word_embeddings: false
batch_size: 4
gradient_accumulation_steps: 1
dtype: fp32
optimizer:
  _component_: torchao.optim.AdamW8bit
  lr: 1e-4
"""
    r = read_config(write("t.yaml", text))
    assert r.model == "hf:meta-llama/Llama-3.2-1B"
    assert any(
        w.startswith("model.tie_word_embeddings: False: a builder argument") for w in r.warnings
    )
    assert r.options["optimizer"] == "torchao.AdamW8bit"  # torchao's own class, run
    assert r.options["precision"] == "fp32"


@pytest.mark.parametrize(
    ("component", "optimizer"),
    [
        ("bitsandbytes.optim.PagedAdamW8bit", "bnb.PagedAdamW8bit"),
        ("bitsandbytes.optim.PagedAdamW", "bnb.PagedAdamW"),
        ("bitsandbytes.optim.AdamW8bit", "bnb.AdamW8bit"),
        ("torchao.optim.AdamW4bit", "torchao.AdamW4bit"),
        ("torch.optim.AdamW", "adamw"),
    ],
)
def test_library_optimizers_are_read_as_the_library_runs_them(
    write, valid_spec, component, optimizer
):
    """PagedAdamW was read as plain adamw (fp32 states on the device) and torchao's
    optimizers only warned; memgnn runs both libraries' own classes under capture."""
    text = "model:\n  _component_: torchtune.models.llama3_2.llama3_2_1b\nbatch_size: 2\n"
    text += f"dtype: bf16\noptimizer:\n  _component_: {component}\n  lr: 1e-5\n"
    text += "optimizer_in_bwd: true\n"
    r = read_config(write("t.yaml", text))
    assert r.options["optimizer"] == optimizer
    assert r.options["optimizer_in_bwd"] is True  # one GPU: the step in backward, modelled
    assert not any("not modelled yet" in w for w in r.warnings)
    assert valid_spec(r).optim.in_backward


def test_an_unknown_builder_and_key_are_reported(write):
    text = "model:\n  _component_: my.models.tiny\nbatch_size: 1\nmystery: 2\n"
    r = read_config(write("t.yaml", text))
    assert r.model is None
    assert any("no Hugging Face model of this builder's shapes" in w for w in r.warnings)
    assert any(w.startswith("unknown key mystery") for w in r.warnings)


def test_an_interpolation_to_a_missing_key_names_it(write):
    text = "model:\n  _component_: torchtune.models.llama3_2.llama3_2_1b\nbatch_size: ${bs}\n"
    with pytest.raises(ValueError, match=r"\$\{bs\} refers to bs, which the file does not have"):
        read_config(write("t.yaml", text))


# every top-level key recipes/{full,lora}_finetune_{single_device,distributed}.py read
# (cfg.X and cfg.get("X") at torchtune bd2a0fc)
RECIPE_KEYS = """
    ac_mode ac_option batch_size batch_size_val checkpointer clip_grad_norm collate_fn compile
    context_parallel_dim cudnn_deterministic_mode custom_sharded_layers
    data_parallel_replicate_dim data_parallel_shard_dim dataset dataset_val device dtype
    enable_activation_checkpointing enable_activation_offloading enable_async_checkpointing
    epochs fsdp_cpu_offload fsdp_reshard_after_forward gradient_accumulation_steps
    log_every_n_steps log_level log_peak_memory_stats loss low_cpu_ram lr_scheduler
    max_steps_per_epoch metric_logger model optimizer optimizer_in_bwd output_dir profile_memory
    profiler resize_token_embeddings resume_from_checkpoint run_val_every_n_steps
    save_adapter_weights_only save_every_n_steps seed shuffle tensor_parallel_dim
    tensor_parallel_plan tokenizer
""".split()


def test_every_key_the_recipes_read_is_known(write):
    import yaml

    data = dict.fromkeys(RECIPE_KEYS, 1)
    data.update(
        model={"_component_": "torchtune.models.llama3_2.llama3_2_1b"}, dtype="bf16",
        optimizer={"_component_": "torch.optim.AdamW"}, loss={"_component_": "x.Loss"},
        tokenizer={"_component_": "t.tok", "max_seq_len": 8}, dataset={"_component_": "d.d"},
    )  # fmt: skip
    r = read_config(write("all.yaml", yaml.safe_dump(data)))
    assert [w for w in r.warnings if w.startswith("unknown key")] == []


def test_fp8_training_becomes_float8(write, became, valid_spec):
    text = """\
model:
  _component_: torchtune.models.llama3_2.llama3_2_1b
dtype: bf16
batch_size: 2
gradient_accumulation_steps: 1
enable_fp8_training: true
fp8_recipe_name: rowwise
"""
    r = read_config(write("fp8.yaml", text))
    assert r.options["float8"] == "rowwise" and r.options["float8_filter_fqns"] == "output"
    assert became(r)["enable_fp8_training"] == "--float8 rowwise --float8-filter-fqns output"
    spec = valid_spec(r)
    assert (spec.numerics.float8, spec.numerics.float8_filters) == ("rowwise", ("output",))
    default = read_config(write("fp8d.yaml", text.replace("fp8_recipe_name: rowwise\n", "")))
    assert default.options["float8"] == "tensorwise"
    assert any("float8 all-gather" in w for w in default.warnings)
    assert "float8_fsdp_all_gather" not in default.options
    # the distributed recipe: FSDP2 over the ranks, the weights all-gathered in float8
    name = "fp8_distributed.yaml"
    shard = read_config(write(name, text.replace("fp8_recipe_name: rowwise\n", "")))
    assert (shard.options["sharding"], shard.options["float8_fsdp_all_gather"]) == ("fsdp", True)
    default = next(k for k in shard.keys if k.key == "fp8_recipe_name")
    assert default.default and default.became.endswith("enable_fsdp_float8_all_gather=True))")
    assert not any("float8 all-gather" in w for w in shard.warnings)
    spec = valid_spec(shard, gpus=2)
    assert spec.numerics.float8_fsdp_all_gather
    off = read_config(
        write("off.yaml", text.replace("enable_fp8_training: true", "enable_fp8_training: false"))
    )
    assert "float8" not in off.options
    assert became(off)["fp8_recipe_name"].startswith("no memory effect")


def test_compile_reads_as_each_layer_compiled(write, catalog):
    text = "model:\n  _component_: torchtune.models.qwen2_5.qwen2_5_7b_base\n"
    text += "batch_size: 1\ndtype: bf16\ncompile: True\n"
    r = read_config(write("t.yaml", text), catalog=catalog)
    assert r.options["compile"] == "blocks"
    assert not any("torch.compile" in w for w in r.warnings)
    # an unchunked loss stays eager (torchtune's model upcasts the logits before its
    # compiled loss); the chunked one compiles per chunk under --compile blocks
    assert "compile_loss" not in r.options
    chunked = text + "loss:\n  _component_: torchtune.modules.loss.CEWithChunkedOutputLoss\n"
    r = read_config(write("c.yaml", chunked), catalog=catalog)
    assert r.options["loss"] == "chunked-ce:8" and "compile_loss" not in r.options
    # unpacked batches vary in length: dynamo recompiles them with dynamic shapes (the
    # default); packed ones are all max_seq_len long: one static-shape compile
    assert "compile_dynamic" not in r.options
    packed = text + "dataset:\n  _component_: d.d\n  packed: True\n"
    packed += "tokenizer:\n  _component_: t.t\n  max_seq_len: 2048\n"
    r = read_config(write("p.yaml", packed), catalog=catalog)
    assert (r.options["compile"], r.options["compile_dynamic"]) == ("blocks", False)
    r = read_config(write("pe.yaml", packed.replace("compile: True", "compile: False")))
    assert "compile_dynamic" not in r.options


# recipes/configs/llama3_2/3B_full_single_device.yaml as torchtune's README optimization-flags
# table (pytorch/torchtune@1814feb17) runs its '+ Chunked Cross Entropy' step
CHUNKED = """\
model:
  _component_: torchtune.models.llama3_2.llama3_2_3b
tokenizer:
  _component_: torchtune.models.llama3.llama3_tokenizer
  path: /tmp/Llama-3.2-3B-Instruct/original/tokenizer.model
  max_seq_len: 4096
dataset:
  _component_: torchtune.datasets.alpaca_cleaned_dataset
  packed: True
batch_size: 2
optimizer:
  _component_: torch.optim.AdamW
  lr: 2e-5
  fused: True
loss:
  _component_: torchtune.modules.loss.CEWithChunkedOutputLoss
gradient_accumulation_steps: 1
compile: True
enable_activation_checkpointing: False
dtype: bf16
"""


def test_the_chunked_cross_entropy_becomes_the_chunked_loss(write, catalog, became, valid_spec):
    r = read_config(write("3B_full_single_device.yaml", CHUNKED), catalog=catalog)
    assert r.options["loss"] == "chunked-ce:8"  # CEWithChunkedOutputLoss's default chunks
    assert not any("loss" in w for w in r.warnings)
    assert became(r)["loss._component_"].startswith("--loss chunked-ce:8")
    spec = valid_spec(r)
    assert (spec.kernels.loss_chunks, spec.kernels.compile) == (8, "blocks")
    text = CHUNKED.replace(
        "CEWithChunkedOutputLoss\n", "CEWithChunkedOutputLoss\n  num_output_chunks: 16\n"
    )
    r = read_config(write("16.yaml", text), catalog=catalog)
    assert r.options["loss"] == "chunked-ce:16"
    assert became(r)["loss.num_output_chunks"] == "--loss chunked-ce:16"


def test_the_plain_cross_entropy_is_the_models_loss(write, catalog):
    text = CHUNKED.replace(
        "torchtune.modules.loss.CEWithChunkedOutputLoss", "torch.nn.CrossEntropyLoss"
    )
    r = read_config(write("ce.yaml", text), catalog=catalog)
    assert "loss" not in r.options


TUNE_CONFIGS = Path(__file__).parents[3] / "benchmarks" / "configs" / "torchtune"


def test_the_benchmark_configs_read_into_valid_specs(catalog, valid_spec):
    """benchmarks/configs/torchtune (the public-gpu-measurements-2 torchtune rows): each
    reads into a valid spec; the only warnings are the bitsandbytes paged optimizers' (a
    paged state's device share) and the distributed recipe's GPU count. The packed,
    compiled steps compile with static shapes, the Nov 2024 '+ Activation Offloading' and
    later steps with torchtune's offloading around the compiled layers."""
    files = sorted(TUNE_CONFIGS.glob("*.yaml"))
    assert len(files) == 13
    for f in files:
        r = read_config(f, catalog=catalog)
        for w in r.warnings:
            assert w.startswith(("optimizer._component_: bitsandbytes.optim.Paged",
                                 "a distributed recipe")), (f.name, w)  # fmt: skip
        valid_spec(r, **({"gpus": 8} if r.options.get("sharding") else {}))
        if r.options.get("compile") == "blocks":
            assert r.options["compile_dynamic"] is False, f.name  # every one packed
    offload = read_config(TUNE_CONFIGS / "llama3_2_3B_lora_single_device_offload.yaml")
    assert (offload.options["offload_activations"], offload.options["compile"]) == (
        "torchtune",
        "blocks",
    )
