"""LitGPT finetune configs read key by key (predictor/frameworks/litgpt.py)."""

from __future__ import annotations

import pytest
import yaml
from memgnn.predictor.frameworks import read_config
from memgnn.predictor.frameworks.files import flatten

# in the layout of LitGPT's config_hub/finetune/<model>/qlora.yaml
QLORA = """\
# The path to the base model's checkpoint directory to load for finetuning.
checkpoint_dir: checkpoints/google/gemma-2b
out_dir: out/finetune/qlora-gemma-2b
precision: bf16-true
quantize: bnb.nf4-dq
devices: 1
num_nodes: 1
lora_r: 16
lora_alpha: 16
lora_dropout: 0.1
lora_query: true
lora_key: true
lora_value: true
lora_projection: true
lora_mlp: true
lora_head: false
data:
  class_path: litgpt.data.Alpaca2k
  init_args:
    mask_prompt: false
    val_split_fraction: 0.03847
    prompt_style: alpaca
train:
  save_interval: 800
  log_interval: 1
  global_batch_size: 6
  micro_batch_size: 2
  lr_warmup_steps: 200
  epochs: 2
  max_seq_length: 512
  min_lr: 6.0e-05
eval:
  interval: 25
  max_new_tokens: 100
  max_iters: 100
optimizer:
  class_path: torch.optim.AdamW
  init_args:
    lr: 0.0002
    weight_decay: 0.0
    betas:
      - 0.9
      - 0.95
logger_name: csv
seed: 1337
"""


def test_a_litgpt_qlora_config(write, catalog, became, accounted, valid_spec):
    r = read_config(write("qlora.yaml", QLORA), catalog=catalog)
    assert r.format == "litgpt"
    assert r.model == "hf:google/gemma-2b"
    assert r.model_args == {"use_cache": "false", "tie_word_embeddings": "false"}
    assert r.sizes == {"B": 2, "S": 512}
    assert r.options == {
        "quantize_base": "nf4-dq",
        "precision": "bf16",
        "grad_accum": 3,
        "peft": "lora",
        "lora_dtype": "model",
        "lora_r": 16,
        "lora_alpha": 16.0,
        "lora_dropout": 0.1,
        "lora_targets": "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj",
        "optimizer": "adamw",
        "hold_outputs": True,
    }
    b = became(r)
    assert b["checkpoint_dir"].startswith(
        "--model hf:google/gemma-2b --model-arg use_cache=false --model-arg "
        "tie_word_embeddings=false;"
    )
    assert b["train.global_batch_size"].startswith("--grad-accum 3")
    assert b["lora_head"] == "off"
    assert b["devices"] == "one GPU"
    assert any("PagedAdamW" in w for w in r.warnings)
    assert any("quantises every Linear, the lm_head too" in w for w in r.warnings)
    accounted(r, list(flatten(yaml.safe_load(QLORA), atomic=("data.init_args",))))
    spec = valid_spec(r)
    assert (spec.loop.hold_outputs, spec.adapter.dtype) == (True, "model")


def test_a_full_finetune_on_four_devices(write, catalog, became, valid_spec):
    text = """\
checkpoint_dir: checkpoints/TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T
precision: bf16-true
devices: 4
train:
  global_batch_size: 32
  micro_batch_size: 4
  max_seq_length: 2048
"""
    r = read_config(write("full.yaml", text), catalog=catalog)
    assert r.model == "hf:TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T"  # not in catalog
    spec = valid_spec(r)
    assert (
        spec.parallel.gpus,
        spec.parallel.sharding,
        spec.activations.checkpointing,
        spec.loop.grad_accum,
        spec.parallel.grad_sync,
    ) == (
        4,
        "fsdp",
        "full",
        2,
        "last",
    )
    assert "peft" not in r.options
    assert any("FSDP1 (flat parameters)" in w for w in r.warnings)
    assert became(r)["devices"].startswith("--gpus 4 --sharding fsdp --checkpointing full")


def test_litgpt_s_defaults(write):
    r = read_config(
        write("lora.yaml", "checkpoint_dir: checkpoints/meta-llama/Llama-2-7b-hf\nlora_r: 4\n")
    )
    assert r.sizes == {"B": 1}
    assert r.options["precision"] == "amp-bf16" and r.options["grad_accum"] == 16
    assert r.options["lora_targets"] == "q_proj,v_proj"  # lora_query and lora_value
    assert any(w.startswith("train.max_seq_length is not set") for w in r.warnings)
    defaults = {k.key for k in r.keys if k.default}
    assert {
        "precision",
        "train.micro_batch_size",
        "train.global_batch_size",
        "lora_alpha",
        "lora_dropout",
        "optimizer",
    } <= defaults


def test_quantize_with_mixed_precision_is_refused(write):
    text = "checkpoint_dir: checkpoints/a/b\nquantize: bnb.nf4\nprecision: bf16-mixed\nlora_r: 8\n"
    with pytest.raises(ValueError, match="refuses quantize with mixed precision"):
        read_config(write("q.yaml", text))


def test_an_unknown_key_and_quantisation_are_reported(write):
    text = "checkpoint_dir: checkpoints/a/b\nquantize: bnb.int8-training\nlora_r: 8\nspeed: 3\n"
    r = read_config(write("q.yaml", text))
    assert "quantize_base" not in r.options
    assert any(w.startswith("quantize: bnb.int8-training: this quantisation") for w in r.warnings)
    assert any(w.startswith("unknown key speed") for w in r.warnings)
