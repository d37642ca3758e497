"""A file's model as a memgnn spec, LoRA roles as module names
(predictor/frameworks/naming.py)."""

from __future__ import annotations

import json

import pytest
from memgnn.predictor.frameworks.naming import hub_model, lora_targets

CATALOG = {
    "meta-llama/Llama-3.1-8B": {"model_type": "llama"},
    "meta-llama/Meta-Llama-3-8B": {"model_type": "llama"},
    "google/gemma-2b": {"model_type": "gemma"},
    "tiiuae/falcon-7b": {"model_type": "falcon"},
}


@pytest.mark.parametrize(
    ("name", "spec", "note"),
    [
        ("meta-llama/Llama-3.1-8B", "hf:meta-llama/Llama-3.1-8B", ""),
        ("META-LLAMA/llama-3.1-8b", "hf:meta-llama/Llama-3.1-8B", "the same shapes"),
        ("meta-llama/Meta-Llama-3.1-8B-Instruct", "hf:meta-llama/Llama-3.1-8B", "the same shapes"),
        ("meta-llama/Meta-Llama-3-8B-Instruct", "hf:meta-llama/Meta-Llama-3-8B", "the same shapes"),
        ("google/gemma-2b-it", "hf:google/gemma-2b", "the same shapes"),
        ("NousResearch/Meta-Llama-3.1-8B", "hf:meta-llama/Llama-3.1-8B", "another organisation"),
    ],
)
def test_a_hub_name_matches_the_catalog_entry_of_its_shapes(name, spec, note):
    found = hub_model(name, CATALOG)
    assert found.spec == spec and note in found.note and not found.warning
    assert found.config == CATALOG[spec[3:]]


def test_a_name_outside_the_catalog_is_kept_with_a_warning():
    found = hub_model("Qwen/Qwen3-8B", CATALOG)
    assert found.spec == "hf:Qwen/Qwen3-8B" and "not in memgnn's bundled catalog" in found.warning
    assert hub_model("Qwen/Qwen3-8B", None).warning == ""  # no catalog given: as named


def test_a_local_checkpoint_folder(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "phi3"}))
    found = hub_model(str(tmp_path), CATALOG)
    assert found.spec == f"hf:{tmp_path / 'config.json'}" and found.config == {"model_type": "phi3"}
    missing = hub_model(str(tmp_path / "nothing"), CATALOG)
    assert missing.spec is None and "no config.json" in missing.warning


@pytest.mark.parametrize(
    ("roles", "model_type", "names", "note"),
    [
        (["q", "v"], "llama", "q_proj,v_proj", ""),
        (
            ["q", "k", "v", "o", "mlp", "head"],
            "gemma",
            "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj,lm_head",
            "",
        ),
        (["q", "v"], "falcon", "query_key_value", "adapts the whole fused projection"),
        (["q", "k", "v", "mlp"], "phi3", "qkv_proj,gate_up_proj,down_proj", ""),
        (["o", "mlp"], "phi", "dense,fc1,fc2", ""),
        (["q"], None, "q_proj", "assumed Llama's"),
    ],
)
def test_lora_roles_as_the_model_s_module_names(roles, model_type, names, note):
    config = {"model_type": model_type} if model_type else None
    got, why = lora_targets(roles, config)
    assert got == names and note in why
    if not note:
        assert why == ""
