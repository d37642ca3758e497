"""Format detection and read_config's contract (predictor/frameworks/read.py)."""

from __future__ import annotations

import pytest
from memgnn.predictor.errors import UserError
from memgnn.predictor.frameworks import detect_format, read_config


@pytest.mark.parametrize(
    ("name", "data", "fmt"),
    [
        ("job.toml", {"training": {"seq_len": 1}}, "torchtitan"),
        (
            "r.yaml",
            {"model": {"_component_": "torchtune.models.llama3_2.llama3_2_1b"}},
            "torchtune",
        ),
        ("l.yaml", {"checkpoint_dir": "checkpoints/a/b"}, "litgpt"),
        ("l.yaml", {"train": {"micro_batch_size": 2}}, "litgpt"),
        ("a.yml", {"base_model": "a/b", "micro_batch_size": 1}, "axolotl"),
        ("t.yaml", {"max_length": 512, "per_device_train_batch_size": 2}, "trl"),
        ("h.json", {"per_device_train_batch_size": 2, "bf16": True}, "hf"),
    ],
)
def test_the_format_is_told_by_the_file(tmp_path, name, data, fmt):
    assert detect_format(tmp_path / name, data) == fmt


def test_an_unrecognisable_file_names_the_formats(write):
    with pytest.raises(
        UserError, match="cannot tell which framework.*its keys: foo.*one of hf, trl"
    ):
        read_config(write("x.yaml", "foo: 1\n"))


def test_the_format_can_be_given(write):
    r = read_config(write("x.yaml", "per_device_train_batch_size: 2\n"), format="trl")
    assert r.format == "trl" and r.sizes["S"] == 1024  # TRL's default max_length
    with pytest.raises(UserError, match="unknown config format 'keras'"):
        read_config(write("y.yaml", "a: 1\n"), format="keras")


def test_an_adapter_config_goes_with_hf_only(write):
    side = write("adapter_config.json", '{"peft_type": "LORA", "r": 4}')
    with pytest.raises(
        UserError, match="adapter_config.json goes with hf/trl configs, not axolotl"
    ):
        read_config(write("a.yml", "base_model: a/b\n"), adapter_config=side)
    with pytest.raises(UserError, match="adapter config not found"):
        read_config(write("b.json", '{"bf16": true}'), adapter_config=side.parent / "none.json")


def test_a_bad_value_is_a_user_error_naming_the_file(write):
    with pytest.raises(UserError, match=r"t.yaml \(torchtune\): dtype: 'fp8'"):
        read_config(write("t.yaml", "model:\n  _component_: x.y\ndtype: fp8\n"))


def test_every_format_s_options_build_a_trainspec_and_predict(write, catalog, valid_spec):
    """From Python, end to end: a reading of each format builds a TrainSpec whose capture
    runs (tiny shapes: the reading's options on a tiny Llama)."""
    from memgnn.predictor.capture.capture import CaptureConfig, capture
    from memgnn.predictor.zoo.resolve import resolve

    files = {
        "hf.json": '{"per_device_train_batch_size": 2, "gradient_accumulation_steps": 2, '
        '"bf16": true, "gradient_checkpointing": true, "optim": "adamw_torch"}',
        "tt.yaml": "model:\n  _component_: torchtune.models.llama3_2.lora_llama3_2_1b\n"
        "  lora_attn_modules: [q_proj, v_proj]\nbatch_size: 2\ndtype: bf16\n"
        "gradient_accumulation_steps: 1\nenable_activation_checkpointing: true\n",
        "titan.toml": '[model]\nname = "llama3"\nflavor = "8B"\n[activation_checkpoint]\n'
        'mode = "full"\n[parallelism]\ndata_parallel_shard_degree = 1\n',
        "ax.yml": "base_model: meta-llama/Llama-3.1-8B\nadapter: lora\nlora_r: 4\n"
        "lora_alpha: 8\nlora_target_linear: true\n",
        "lit.yaml": "checkpoint_dir: checkpoints/meta-llama/Llama-3.1-8B\nlora_r: 4\n"
        "precision: bf16-true\n",
    }
    tiny = {
        "num_hidden_layers": "1",
        "hidden_size": "64",
        "intermediate_size": "128",
        "num_attention_heads": "4",
        "num_key_value_heads": "2",
        "vocab_size": "256",
    }
    for name, text in files.items():
        r = read_config(write(name, text), catalog=catalog)
        train = valid_spec(r)
        bundle = resolve("hf:meta-llama/Llama-3.1-8B", {**tiny, **r.model_args})
        graph = capture(bundle, train, CaptureConfig(target="cuda"))
        assert graph.paths and graph.train["precision"] == train.numerics.precision, name
