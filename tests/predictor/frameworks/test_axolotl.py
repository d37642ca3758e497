"""axolotl configs read key by key (predictor/frameworks/axolotl.py)."""

from __future__ import annotations

import json

import yaml
from memgnn.predictor.frameworks import read_config
from memgnn.predictor.frameworks.files import flatten

# in the layout of axolotl's examples/llama-3/qlora.yml
QLORA = """\
base_model: NousResearch/Meta-Llama-3.1-8B
load_in_8bit: false
load_in_4bit: true
strict: false

datasets:
  - path: tatsu-lab/alpaca
    type: alpaca
dataset_prepared_path:
val_set_size: 0.05
output_dir: ./outputs/qlora-out

adapter: qlora
lora_model_dir:

sequence_len: 4096
sample_packing: true
pad_to_sequence_len: true

lora_r: 32
lora_alpha: 16
lora_dropout: 0.05
lora_target_linear: true

wandb_project:
wandb_entity:

gradient_accumulation_steps: 4
micro_batch_size: 2
num_epochs: 1
optimizer: paged_adamw_8bit
lr_scheduler: cosine
learning_rate: 0.0002

train_on_inputs: false
bf16: auto
tf32: false

gradient_checkpointing: true
gradient_checkpointing_kwargs:
  use_reentrant: false
logging_steps: 1
flash_attention: true

warmup_steps: 10
evals_per_epoch: 4
saves_per_epoch: 1
weight_decay: 0.0
special_tokens:
  pad_token: "<|end_of_text|>"
"""


def test_an_axolotl_qlora_config(write, catalog, became, accounted, valid_spec):
    r = read_config(write("qlora.yml", QLORA), catalog=catalog)
    assert r.format == "axolotl"
    assert r.model == "hf:meta-llama/Llama-3.1-8B"  # NousResearch's mirror of the same shapes
    assert r.sizes == {"B": 2, "S": 4096}
    assert r.options == {
        "grad_accum": 4,
        "precision": "bf16",
        "checkpointing": "hf",
        "optimizer": "adamw8bit",
        "peft": "lora",
        "lora_r": 32,
        "lora_alpha": 16.0,
        "lora_dropout": 0.05,
        "lora_targets": "all-linear",
        "quantize_base": "nf4-dq",
        "attention": "flash",
    }
    b = became(r)
    assert "another organisation" in b["base_model"]
    assert b["sequence_len"] == "--seq 4096 (every row)"
    assert b["bf16"] == "--precision bf16 (the model loads in it)"
    assert b["lora_target_linear"].startswith("--lora-targets all-linear")
    assert b["load_in_4bit"].startswith("--quantize-base nf4-dq (axolotl's QLoRA")
    assert b["gradient_checkpointing_kwargs.use_reentrant"] == "non-reentrant, as memgnn runs it"
    assert b["flash_attention"] == "--attention flash"
    assert b["wandb_entity"] == "no memory effect: logging"
    assert any(w.startswith("optimizer: paged_adamw_8bit: bitsandbytes' paged") for w in r.warnings)
    keys = list(flatten(yaml.safe_load(QLORA), atomic=("datasets", "special_tokens")))
    accounted(r, keys)
    assert valid_spec(r).adapter.targets == "all-linear"


def test_axolotl_s_defaults_and_reentrant_checkpointing(write):
    text = "base_model: meta-llama/Llama-2-7b-hf\ngradient_checkpointing: true\nbatch_size: 16\n"
    text += "micro_batch_size: 4\n"
    r = read_config(write("full.yml", text))
    assert r.sizes == {"B": 4, "S": 512}
    assert r.options["grad_accum"] == 4  # batch_size // micro_batch_size
    assert r.options["precision"] == "bf16" and r.options["optimizer"] == "adamw"
    assert any("reentrant checkpointing (axolotl's default" in w for w in r.warnings)
    defaults = {k.key for k in r.keys if k.default}
    assert {"sequence_len", "bf16", "optimizer"} <= defaults


def test_fsdp_config_alone_turns_fsdp_on(write, became, valid_spec):
    text = """\
base_model: meta-llama/Llama-3.1-8B
micro_batch_size: 1
fp16: true
fsdp_version: 2
fsdp_config:
  offload_params: false
  state_dict_type: FULL_STATE_DICT
  auto_wrap_policy: TRANSFORMER_BASED_WRAP
  transformer_layer_cls_to_wrap: LlamaDecoderLayer
  reshard_after_forward: true
  activation_checkpointing: true
dp_shard_size: 4
"""
    r = read_config(write("fsdp.yml", text))
    b = became(r)
    assert b["fsdp_version"].startswith("FSDP2")
    assert b["fsdp_config.activation_checkpointing"] == "--checkpointing full"
    assert b["dp_shard_size"] == "--gpus 4"
    spec = valid_spec(r)
    assert (
        spec.parallel.sharding,
        spec.parallel.gpus,
        spec.numerics.precision,
        spec.activations.checkpointing,
    ) == (
        "fsdp",
        4,
        "fp16",
        "full",
    )


def test_a_deepspeed_config_beside_the_file(write):
    write(
        "zero2.json", json.dumps({"zero_optimization": {"stage": 2}, "bf16": {"enabled": "auto"}})
    )
    r = read_config(write("ds.yml", "base_model: x/y\ndeepspeed: zero2.json\n"))
    assert r.options["sharding"] == "zero2"


def test_memory_keys_not_modelled_and_plugins_are_warned(write):
    text = """\
base_model: meta-llama/Llama-3.1-8B
adapter: lora
peft_use_dora: true
lora_modules_to_save: [embed_tokens, lm_head]
activation_offloading: true
chunked_cross_entropy: true
torch_compile: true
liger_fused_linear_cross_entropy: true
rl: dpo
mystery_knob: 1
"""
    r = read_config(write("x.yml", text))
    starts = (
        "peft_use_dora: true: DoRA",
        "lora_modules_to_save: ['embed_tokens', 'lm_head']",
        "activation_offloading: true",
        "chunked_cross_entropy: true",
        "liger_fused_linear_cross_entropy: true",
        "rl: dpo: a preference/RL trainer",
        "unknown key mystery_knob",
    )
    for start in starts:
        assert any(w.startswith(start) for w in r.warnings), start
    assert r.options["peft"] == "lora" and "lora_targets" not in r.options  # peft's default
    assert r.options["compile"] == "full"  # transformers' Trainer compiles the whole model


def test_load_in_4bit_without_qlora_is_not_quantised(write, became):
    r = read_config(write("x.yml", "base_model: a/b\nload_in_4bit: true\nlora_r: 8\n"))
    assert "quantize_base" not in r.options
    assert any(w.startswith("load_in_4bit: true without adapter qlora") for w in r.warnings)
    assert became(r)["lora_r"] == "no memory effect: no LoRA adapter"
