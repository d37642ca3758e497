"""torchtitan job configs (TOML) read key by key (predictor/frameworks/torchtitan.py)."""

from __future__ import annotations

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
        "precision": "amp-bf16",
        "checkpointing": "blocks:16",
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
        "--checkpointing blocks:16 (torchtitan checkpoints one block in 2 of 32; memgnn the "
        "first as many)"
    )
    assert b["compile.enable"].startswith("off")
    assert b["quantize.linear.float8.filter_fqns"].startswith("no memory effect: no converter")
    defaults = {k.key: k.became for k in r.keys if k.default}
    assert defaults["training.mixed_precision_param"].startswith("--precision amp-bf16")
    assert any("MixedPrecisionPolicy" in w for w in r.warnings)
    accounted(r, list(flatten(tomllib.loads(LLAMA3_8B))))
    spec = valid_spec(r)
    assert (spec.gpus, spec.sharding, spec.checkpointing) == (8, "fsdp", "blocks:16")


def test_torchtitan_s_defaults_for_what_the_file_leaves_out(write):
    r = read_config(write("min.toml", '[model]\nname = "llama3"\nflavor = "70B"\n'))
    assert r.model == "hf:meta-llama/Llama-3.1-70B"
    assert r.sizes == {"B": 8, "S": 2048}
    assert r.options["checkpointing"] == "blocks:40"  # selective, every 2nd of 80 layers
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
    assert "checkpointing" not in r.options
    starts = (
        "training.compile: true: torch.compile",
        "training.tensor_parallel_degree: 2",
        "experimental.context_parallel_degree: 2",
        "model.converters: ['float8']",
        "float8.enable_fsdp_float8_all_gather: True",
        "activation_checkpoint.mode: selective (activation_checkpoint.selective_ac_option:"
        " op): op-level selective",
    )
    for start in starts:
        assert any(w.startswith(start) for w in r.warnings), start
    assert became(r)["experimental.pipeline_parallel_degree"] == "1: none"


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
    assert (spec.sharding, spec.gpus, spec.hsdp_shard_size) == ("hsdp", 16, 8)
    assert (spec.precision, spec.checkpointing, spec.fsdp_reshard_after_forward) == (
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
