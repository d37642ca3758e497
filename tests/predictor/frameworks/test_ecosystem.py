"""What HF-ecosystem configs share: optimizers, attention, bitsandbytes, PEFT adapter
configs, side files (predictor/frameworks/ecosystem.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from memgnn.predictor.frameworks.base import Builder
from memgnn.predictor.frameworks.ecosystem import (
    load_side_file,
    read_adapter,
    read_attention,
    read_bnb,
    read_optimizer,
)


@pytest.mark.parametrize(
    ("name", "options"),
    [
        ("adamw_torch", {"optimizer": "adamw"}),
        ("adamw_torch_fused", {"optimizer": "adamw", "optimizer_impl": "fused"}),
        ("adamw_bnb_8bit", {"optimizer": "adamw8bit"}),
        ("paged_adamw_32bit", {"optimizer": "adamw"}),
        ("adafactor", {"optimizer": "adafactor"}),
        ("sgd", {"optimizer": "sgd"}),
        ("galore_adamw", {}),
    ],
)
def test_hf_optimizer_names(name, options):
    b = Builder("hf", "a.json", {"optim": name})
    read_optimizer(b, "optim", name)
    r = b.result()
    assert r.options == options
    if not options:
        assert r.warnings[0].startswith(f"optim: {name}: this optimizer is not modelled yet")
    if name.startswith("paged"):
        assert "unified memory" in r.warnings[0]
    if name == "sgd":
        assert "no momentum" in r.key("optim").became


@pytest.mark.parametrize(
    ("value", "option"),
    [
        ("eager", "eager"),
        ("sdpa", "sdpa"),
        ("flash_attention_2", "flash"),
        ("flex_attention", None),
    ],
)
def test_attention_implementations(value, option):
    b = Builder("hf", "a.json", {"attn_implementation": value})
    read_attention(b, "attn_implementation", value)
    r = b.result()
    assert r.options.get("attention") == option
    assert (option is None) == bool(r.warnings)


def _bnb(config: dict) -> Builder:
    b = Builder("hf", "a.json", {f"q.{k}": v for k, v in config.items()})
    read_bnb(b, "q.")
    return b


def test_bitsandbytes_int8_and_its_unmodelled_settings():
    r = _bnb(
        {"load_in_8bit": True, "llm_int8_threshold": 4.0, "llm_int8_skip_modules": ["mlp"]}
    ).result()
    assert r.options == {"quantize_base": "int8"}
    assert any(w.startswith("q.llm_int8_threshold: 4.0") for w in r.warnings)
    assert any(w.startswith("q.llm_int8_skip_modules: ['mlp']") for w in r.warnings)


def test_another_quantisation_method_is_warned():
    r = _bnb({"quant_method": "gptq", "bits": 4}).result()
    assert "quantize_base" not in r.options
    assert all("quant_method: gptq: this quantisation is not modelled" in w for w in r.warnings)


def _adapter(config: dict) -> Builder:
    b = Builder("hf", "a.json", {f"adapter_config.json:{k}": v for k, v in config.items()})
    read_adapter(b, "adapter_config.json:")
    return b


def test_an_adapter_s_target_shorthand_and_regex():
    r = _adapter({"peft_type": "LORA", "r": 8, "target_modules": "all-linear"}).result()
    assert r.options["lora_targets"] == "all-linear"
    r = _adapter({"peft_type": "LORA", "r": 8, "target_modules": r".*\.(q|v)_proj"}).result()
    assert "lora_targets" not in r.options
    assert any("a regular expression" in w for w in r.warnings)


def test_adapter_settings_that_train_more_are_warned():
    r = _adapter(
        {
            "peft_type": "LORA",
            "r": 8,
            "modules_to_save": ["lm_head"],
            "bias": "all",
            "rank_pattern": {"q_proj": 16},
            "layers_to_transform": None,
        }
    ).result()
    for key in ("modules_to_save", "bias", "rank_pattern"):
        assert any(w.startswith(f"adapter_config.json:{key}:") for w in r.warnings), key
    assert r.key("adapter_config.json:layers_to_transform").became == "off"


def test_a_side_file_that_is_not_there_is_warned(tmp_path: Path):
    b = Builder("hf", "a.json", {"deepspeed": "ds.json"})
    assert load_side_file(b, "deepspeed", "ds.json", tmp_path) is None
    assert b.result().warnings == ["deepspeed: ds.json is not here: its settings are not read"]
