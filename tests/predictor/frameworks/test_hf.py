"""transformers' TrainingArguments and TRL configs read key by key (predictor/frameworks/hf.py)."""

from __future__ import annotations

import json

import pytest
from memgnn.predictor.frameworks import read_config

# a TrainingArguments export as `args.to_json_string()` writes it (transformers 4.4x: fp32
# weights assumed, HF's own FSDP1 wording), trimmed to the keys a run sets and a few others
TRAINER_JSON = {
    "output_dir": "out/llama-sft",
    "overwrite_output_dir": False,
    "logging_dir": "out/llama-sft/runs",
    "do_train": True,
    "eval_strategy": "steps",
    "per_device_train_batch_size": 4,
    "per_device_eval_batch_size": 8,
    "gradient_accumulation_steps": 8,
    "learning_rate": 2e-05,
    "weight_decay": 0.0,
    "adam_beta1": 0.9,
    "max_grad_norm": 1.0,
    "num_train_epochs": 3.0,
    "lr_scheduler_type": "cosine",
    "warmup_ratio": 0.03,
    "logging_steps": 10,
    "save_steps": 500,
    "seed": 42,
    "bf16": True,
    "fp16": False,
    "tf32": True,
    "dataloader_num_workers": 4,
    "report_to": ["wandb"],
    "gradient_checkpointing": True,
    "gradient_checkpointing_kwargs": {"use_reentrant": False},
    "optim": "adamw_torch",
    "fsdp": "",
    "fsdp_config": {"min_num_params": 0, "xla": False, "xla_fsdp_v2": False},
    "deepspeed": None,
    "torch_compile": False,
    "ddp_find_unused_parameters": None,
    "include_tokens_per_second": False,
}


def test_a_trainer_export_is_read_key_by_key(write, became, accounted, valid_spec):
    path = write("training_args.json", json.dumps(TRAINER_JSON, indent=2))
    r = read_config(path)
    assert r.format == "hf" and r.model is None
    assert r.sizes == {"B": 4}
    assert r.options == {
        "grad_accum": 8,
        "checkpointing": "hf",
        "optimizer": "adamw",
        "precision": "amp-bf16",
    }
    b = became(r)
    assert b["per_device_train_batch_size"] == "--batch 4"
    assert b["gradient_accumulation_steps"] == "--grad-accum 8"
    assert b["bf16"] == "--precision amp-bf16" and b["fp16"] == "--precision amp-bf16"
    assert b["gradient_checkpointing"] == "--checkpointing hf"
    assert "non-reentrant" in b["gradient_checkpointing_kwargs.use_reentrant"]
    assert b["optim"] == "--optimizer adamw"
    assert b["fsdp"] == "off" and b["deepspeed"] == "off"
    assert b["torch_compile"].startswith("off")
    assert b["tf32"].startswith("no memory effect")
    assert (
        b["per_device_eval_batch_size"]
        == "no memory effect: evaluation runs outside the training step"
    )
    assert b["fsdp_config.min_num_params"].startswith("no memory effect: FSDP is off")
    assert any("load dtype" in w and "float32" in w for w in r.warnings)
    assert any("sequence length" in w and "--seq" in w for w in r.warnings)
    flat = [k for k in TRAINER_JSON if k not in ("gradient_checkpointing_kwargs", "fsdp_config")]
    accounted(r, [*flat, "gradient_checkpointing_kwargs.use_reentrant", "fsdp_config.xla"])
    assert valid_spec(r).numerics.precision == "amp-bf16"


def test_every_key_of_the_installed_transformers_export_is_known(write, became):
    transformers = pytest.importorskip("transformers")
    args = transformers.TrainingArguments(
        output_dir="out",
        per_device_train_batch_size=2,
        gradient_accumulation_steps=3,
        optim="paged_adamw_8bit",
        gradient_checkpointing=True,
        use_cpu=True,
        report_to="none",
    )
    r = read_config(write("args.json", args.to_json_string()))
    unknown = [w for w in r.warnings if w.startswith("unknown key")]
    assert unknown == []
    assert r.sizes == {"B": 2}
    assert r.options["grad_accum"] == 3 and r.options["optimizer"] == "adamw8bit"
    assert any(w.startswith("optim: paged_adamw_8bit: bitsandbytes' paged") for w in r.warnings)
    assert any(w.startswith("use_cpu: true") for w in r.warnings)


SFT_YAML = """\
# trl sft --config sft_qlora.yaml
model_name_or_path: meta-llama/Meta-Llama-3.1-8B-Instruct
dtype: bfloat16
attn_implementation: flash_attention_2
dataset_name: trl-lib/Capybara
max_length: 2048
packing: false
per_device_train_batch_size: 2
gradient_accumulation_steps: 16
learning_rate: 2.0e-4
num_train_epochs: 1
logging_steps: 25
use_peft: true
lora_r: 32
lora_alpha: 16
lora_target_modules: all-linear
load_in_4bit: true
use_bnb_nested_quant: true
output_dir: Llama-3.1-8B-QLoRA
report_to: none
"""


def test_a_trl_sft_yaml_with_trl_s_defaults(write, catalog, became, accounted, valid_spec):
    r = read_config(write("sft_qlora.yaml", SFT_YAML), catalog=catalog)
    assert r.format == "trl"
    assert r.model == "hf:meta-llama/Llama-3.1-8B"  # the instruct checkpoint's base shapes
    assert r.sizes == {"B": 2, "S": 2048}
    assert r.options == {
        "grad_accum": 16,
        "checkpointing": "hf",
        "optimizer": "adamw",
        "optimizer_impl": "fused",
        "attention": "flash",
        "peft": "lora",
        "lora_r": 32,
        "lora_alpha": 16.0,
        "lora_dropout": 0.05,
        "lora_targets": "all-linear",
        "quantize_base": "nf4-dq",
        "precision": "bf16",
        "lora_dtype": "model",
    }
    b = became(r)
    assert "the catalog's meta-llama/Llama-3.1-8B" in b["model_name_or_path"]
    assert b["max_length"].startswith("--seq 2048")
    assert b["load_in_4bit"].startswith("--quantize-base nf4-dq --lora-dtype model")
    assert b["use_bnb_nested_quant"] == "--quantize-base nf4-dq"
    assert b["dtype"].startswith("weights in bf16")
    defaults = {k.key: k.became for k in r.keys if k.default}
    assert defaults["gradient_checkpointing"].startswith("--checkpointing hf")
    assert defaults["bf16"].startswith("--precision bf16")
    assert defaults["lora_dropout"].startswith("--lora-dropout 0.05")
    assert any(w.startswith("loss_type: chunked_nll") for w in r.warnings)
    keys = [line.split(":")[0] for line in SFT_YAML.splitlines() if line and line[0] != "#"]
    accounted(r, keys)
    assert valid_spec(r).quant.base == "nf4-dq"


ADAPTER = {
    "peft_type": "LORA",
    "task_type": "CAUSAL_LM",
    "r": 16,
    "lora_alpha": 32,
    "lora_dropout": 0.1,
    "target_modules": ["q_proj", "v_proj"],
    "bias": "none",
    "base_model_name_or_path": "meta-llama/Llama-3.1-8B",
    "inference_mode": False,
    "use_rslora": False,
    "use_dora": False,
    "modules_to_save": None,
    "fan_in_fan_out": False,
}


def test_an_adapter_config_beside_the_file(write, catalog, became, valid_spec):
    write("adapter_config.json", json.dumps(ADAPTER))
    path = write("training_args.json", json.dumps({"per_device_train_batch_size": 1, "bf16": True}))
    r = read_config(path, catalog=catalog)
    assert r.model == "hf:meta-llama/Llama-3.1-8B"
    assert {
        k: r.options[k] for k in ("peft", "lora_r", "lora_alpha", "lora_dropout", "lora_targets")
    } == {
        "peft": "lora",
        "lora_r": 16,
        "lora_alpha": 32.0,
        "lora_dropout": 0.1,
        "lora_targets": "q_proj,v_proj",
    }
    b = became(r)
    assert b["adapter_config.json:r"] == "--lora-r 16"
    assert b["adapter_config.json:use_dora"] == "off"
    assert b["adapter_config.json:use_rslora"].startswith("no memory effect")
    assert valid_spec(r).adapter.targets == "q_proj,v_proj"


def test_every_key_of_peft_s_lora_config_is_known(write):
    peft = pytest.importorskip("peft")
    config = peft.LoraConfig(r=4, target_modules=["q_proj"]).to_dict()
    side = write("adapter/adapter_config.json", json.dumps(config, default=str))
    r = read_config(write("args.yaml", "per_device_train_batch_size: 1\n"), adapter_config=side)
    assert [w for w in r.warnings if w.startswith("unknown key")] == []
    assert r.options["lora_r"] == 4


def test_a_peft_method_other_than_lora_is_kept_raw(write):
    ia3 = {
        "peft_type": "IA3",
        "target_modules": ["k_proj", "v_proj", "down_proj"],
        "feedforward_modules": ["down_proj"],
        "task_type": "CAUSAL_LM",
    }
    side = write("ia3/adapter_config.json", json.dumps(ia3))
    r = read_config(write("a.json", '{"per_device_train_batch_size": 2}'), adapter_config=side)
    assert r.options["peft"] == "ia3"
    assert r.options["peft_config"] == ia3
    assert any("only LoRA is modelled" in w for w in r.warnings)


def test_dora_is_warned_with_the_raw_config_kept(write):
    side = write("d/adapter_config.json", json.dumps({**ADAPTER, "use_dora": True}))
    r = read_config(write("a.json", "{}"), adapter_config=side)
    assert r.options["peft"] == "lora" and r.options["peft_config"]["use_dora"] is True
    assert any(w.startswith("adapter_config.json:use_dora: true: DoRA") for w in r.warnings)


def test_a_bitsandbytes_config_in_model_init_kwargs(write, became):
    text = """\
per_device_train_batch_size: 1
max_length: 1024
model_init_kwargs:
  dtype: bfloat16
  device_map: auto
  quantization_config:
    load_in_4bit: true
    bnb_4bit_quant_type: fp4
    bnb_4bit_use_double_quant: false
    bnb_4bit_compute_dtype: bfloat16
use_peft: true
"""
    r = read_config(write("sft.yaml", text))
    assert r.options["quantize_base"] == "nf4" and r.options["precision"] == "bf16"
    b = became(r)
    assert b["model_init_kwargs.quantization_config.load_in_4bit"].startswith(
        "--quantize-base nf4 --lora-dtype model (TRL >= 0.26 casts"
    )
    assert "fp4 stores as nf4" in b["model_init_kwargs.quantization_config.bnb_4bit_quant_type"]
    assert b["model_init_kwargs.device_map"].startswith("no memory effect")


def test_a_local_model_with_a_quantization_config(write, tmp_path):
    config = {
        "model_type": "llama",
        "torch_dtype": "bfloat16",
        "quantization_config": {
            "quant_method": "bitsandbytes",
            "load_in_4bit": True,
            "bnb_4bit_use_double_quant": True,
        },
    }
    write("model/config.json", json.dumps(config))
    text = f"model_name_or_path: {tmp_path / 'model'}\ndtype: auto\nuse_peft: true\n"
    r = read_config(write("sft.yaml", text))
    assert r.model == f"hf:{tmp_path / 'model' / 'config.json'}"
    assert r.options["quantize_base"] == "nf4-dq"
    assert r.options["precision"] == "bf16"  # auto: the checkpoint's dtype
    assert "config.json:quantization_config.load_in_4bit" in {k.key for k in r.keys}


def test_deepspeed_zero3_from_a_json_beside_the_file(write, became, valid_spec):
    ds = {
        "zero_optimization": {
            "stage": 3,
            "overlap_comm": True,
            "reduce_bucket_size": "auto",
            "offload_optimizer": {"device": "cpu", "pin_memory": True},
        },
        "bf16": {"enabled": "auto"},
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
    }
    write("ds_z3.json", json.dumps(ds))
    args = {"per_device_train_batch_size": 2, "bf16": True, "deepspeed": "ds_z3.json"}
    r = read_config(write("args.json", json.dumps(args)))
    assert r.options["sharding"] == "zero3" and r.options["precision"] == "amp-bf16"
    b = became(r)
    assert b["deepspeed:zero_optimization.stage"] == "--sharding zero3"
    assert any(
        w.startswith("deepspeed:zero_optimization.offload_optimizer.device: cpu")
        for w in r.warnings
    )
    assert any("overlap_comm" in w and "reduce_bucket_size" in w for w in r.warnings)
    assert any("DeepSpeed's bf16/fp16 engine" in w for w in r.warnings)
    assert valid_spec(r, gpus=8).parallel.sharding == "zero3"
    assert "sharding" not in valid_spec(r).to_dict() or valid_spec(r).parallel.sharding == "none"


def test_fsdp_full_shard_with_an_fsdp2_config(write, became, valid_spec):
    args = {
        "per_device_train_batch_size": 1,
        "bf16": True,
        "fsdp": "full_shard auto_wrap",
        "fsdp_config": {
            "fsdp_version": 2,
            "reshard_after_forward": False,
            "activation_checkpointing": True,
            "transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"],
            "cpu_ram_efficient_loading": True,
        },
    }
    r = read_config(write("fsdp.json", json.dumps(args)))
    assert r.options["sharding"] == "fsdp" and r.options["fsdp_reshard_after_forward"] is False
    assert r.options["checkpointing"] == "full"
    b = became(r)
    assert b["fsdp"] == "--sharding fsdp"
    assert b["fsdp_config.fsdp_version"].startswith("FSDP2")
    assert not any("FSDP1" in w for w in r.warnings)
    spec = valid_spec(r, gpus=4)
    assert (spec.parallel.sharding, spec.parallel.gpus, spec.parallel.reshard_after_forward) == (
        "fsdp",
        4,
        False,
    )


def test_memory_keys_memgnn_does_not_model_are_warned(write):
    args = {
        "torch_compile": True,
        "use_liger_kernel": True,
        "neftune_noise_alpha": 5,
        "label_smoothing_factor": 0.1,
        "gradient_checkpointing": True,
        "gradient_checkpointing_kwargs": {"use_reentrant": True},
        "optim": "lion_8bit",
        "fsdp": "full_shard offload",
    }
    r = read_config(write("args.json", json.dumps(args)))
    starts = (
        "torch_compile: true: torch.compile",
        "use_liger_kernel: true",
        "neftune_noise_alpha: 5",
        "label_smoothing_factor: 0.1",
        "gradient_checkpointing_kwargs.use_reentrant: true: reentrant",
        "optim: lion_8bit: this optimizer is not modelled",
    )
    for start in starts:
        assert any(w.startswith(start) for w in r.warnings), start
    assert "optimizer" not in r.options  # memgnn's default AdamW, as the warning says
    assert r.options["fsdp_cpu_offload"] is True  # fsdp: offload, read (FSDP2 CPUOffloadPolicy)


def test_an_unknown_key_is_reported(write):
    r = read_config(write("args.json", '{"per_device_train_batch_size": 1, "my_knob": 3}'))
    assert (
        "unknown key my_knob: not read; the answer does not know whether it changes memory"
    ) in r.warnings


def test_bf16_and_fp16_together_are_refused(write):
    with pytest.raises(ValueError, match="bf16 and fp16 are both true"):
        read_config(write("args.json", '{"bf16": true, "fp16": true}'))


def test_deprecated_aliases_of_an_older_export(write, became):
    """transformers 4.x exports per_gpu_train_batch_size (null unless set; it wins when
    set); 5.x exports gradient_checkpointing beside activation_checkpointing."""
    args = {"per_device_train_batch_size": 8, "per_gpu_train_batch_size": None,
            "activation_checkpointing": True, "gradient_checkpointing": True}  # fmt: skip
    r = read_config(write("a.json", json.dumps(args)))
    b = became(r)
    assert r.sizes == {"B": 8} and r.options["checkpointing"] == "hf"
    assert b["per_gpu_train_batch_size"].startswith("no memory effect: unset")
    assert b["gradient_checkpointing"] == "no memory effect: an alias of activation_checkpointing"
    args["per_gpu_train_batch_size"] = 2
    assert read_config(write("b.json", json.dumps(args))).sizes == {"B": 2}


def test_a_4x_export_without_reentrant_kwargs_is_warned(write):
    """transformers 4.x checkpoints reentrant when gradient_checkpointing_kwargs is unset; a
    file with 4.x-only keys (logging_dir) says which release wrote it."""
    args = {"logging_dir": "runs", "gradient_checkpointing": True,
            "gradient_checkpointing_kwargs": None}  # fmt: skip
    r = read_config(write("a.json", json.dumps(args)))
    assert any(w.startswith("a transformers 4.x export (it has logging_dir)") for w in r.warnings)
    args["gradient_checkpointing_kwargs"] = {"use_reentrant": False}
    r = read_config(write("b.json", json.dumps(args)))
    assert not any("4.x export" in w for w in r.warnings)


def test_torch_compile_reads_as_the_whole_model_compiled(write):
    base = {"per_device_train_batch_size": 2, "optim": "adamw_torch"}
    r = read_config(write("args.json", json.dumps(base | {"torch_compile": True})))
    assert r.options["compile"] == "full"
    assert not any("torch.compile" in w for w in r.warnings)
    args = base | {"torch_compile": True, "torch_compile_mode": "reduce-overhead"}
    r = read_config(write("args.json", json.dumps(args)))
    assert any(w.startswith("torch_compile_mode: reduce-overhead: CUDA graphs") for w in r.warnings)
    args = base | {"torch_compile": True, "gradient_checkpointing": True}
    r = read_config(write("args.json", json.dumps(args)))
    assert "compile" not in r.options
    assert any(
        w.startswith("torch_compile: true: torch.compile with --checkpointing hf is not")
        for w in r.warnings
    )
