"""hf:ORG/NAME: the bundled catalog of published configs, the local HF cache, near names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from memgnn.predictor import zoo
from memgnn.predictor.zoo import hub
from memgnn.predictor.zoo.hf_tasks import infer_task

transformers = pytest.importorskip("transformers")


def _config(name: str):
    return transformers.AutoConfig.from_pretrained(
        str(hub.resolve_config_file(name)), local_files_only=True
    )


@pytest.mark.parametrize(
    ("name", "task", "params"),
    [
        ("gpt2", "causal-lm", 124_439_808),  # GPT2LMHeadModel, lm_head tied to wte
        ("bert-base-uncased", "masked-lm", 109_514_298),  # BertForMaskedLM
        ("facebook/opt-125m", "causal-lm", 125_239_296),
        ("EleutherAI/pythia-70m", "causal-lm", 70_426_624),
        ("Qwen/Qwen2.5-0.5B", "causal-lm", 494_032_768),
        ("t5-small", "seq2seq", 60_506_624),
        ("google/vit-base-patch16-224", "image-cls", 86_567_656),
        ("google/vit-large-patch16-224", "image-cls", 304_326_632),  # = torchvision vit_l_16
        ("tiiuae/falcon-7b", "causal-lm", 6_921_720_704),
        ("stabilityai/stablelm-base-alpha-3b", "causal-lm", 3_637_321_728),
    ],
)
def test_catalog_models_have_their_published_parameter_counts(name, task, params):
    config = _config(name)
    assert infer_task(config) == task
    assert hub.param_count(config, task) == params


def test_t0_3b_lm_head_is_tied_by_the_installed_transformers():
    """T0_3B publishes 2,849,757,184 parameters (untied lm_head); transformers 5 ties T5's
    lm_head whatever the config says, so the built class is one 32128 x 2048 matrix short.
    If this fails, transformers honours the config again: record the published figure."""
    config = _config("bigscience/T0_3B")
    assert (
        json.loads(hub.resolve_config_file("bigscience/T0_3B").read_text())["tie_word_embeddings"]
        is False
    )
    assert hub.param_count(config, "seq2seq") == 2_849_757_184 - 32128 * 2048
    assert "bigscience/T0_3B" not in hub.PUBLISHED_PARAMS


def test_bare_bert_encoder_count_is_the_published_bertmodel_figure():
    import torch
    from transformers.initialization import no_init_weights

    with torch.device("meta"), no_init_weights():
        model = transformers.BertModel(_config("google-bert/bert-base-uncased"))
    assert sum(p.numel() for p in model.parameters()) == 109_482_240


def test_every_catalog_file_is_a_readable_config_with_an_architecture():
    entries = hub.catalog_entries()
    assert len(entries) >= 40
    for entry in entries:
        data = json.loads(entry.path.read_text())
        assert data["model_type"] and data["architectures"], entry.name
        assert entry.name in hub.PUBLISHED_PARAMS or entry.published_params is None
    # every published figure belongs to a bundled config
    assert set(hub.PUBLISHED_PARAMS) <= {e.name for e in entries}


def test_aliases_and_case_resolve_to_the_same_catalog_file():
    path = hub.resolve_config_file("openai-community/gpt2")
    assert hub.resolve_config_file("gpt2") == path
    assert hub.resolve_config_file("OpenAI-Community/GPT2") == path
    assert path.parent == hub.CATALOG_DIR


def test_unknown_name_lists_near_names(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(ValueError, match="near names: .*meta-llama/Llama-2-7b-hf"):
        hub.resolve_config_file("meta-llama/Llama-2-7b")
    with pytest.raises(ValueError, match="unknown hf model 'nosuch/model'"):
        zoo.resolve("hf:nosuch/model")


def test_missing_config_path_is_still_a_file_error(tmp_path):
    with pytest.raises(ValueError, match="hf config file not found"):
        hub.resolve_config_file(str(tmp_path / "none" / "config.json"))


def test_local_hf_cache_snapshot_is_found(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    snap = tmp_path / "models--acme--tiny-gpt2" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    cfg = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=100, n_positions=64)
    cfg.to_json_file(str(snap / "config.json"))
    assert hub.resolve_config_file("acme/tiny-gpt2") == snap / "config.json"
    bundle = zoo.resolve("hf:acme/tiny-gpt2")
    assert bundle.name == "hf:acme/tiny-gpt2"
    assert bundle.hparams["task"] == "causal-lm"


def test_hub_cache_location_follows_hf_home(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    assert hub.hub_cache_dir() == tmp_path / "hub"


def test_catalog_name_resolves_to_a_bundle_with_the_task_of_its_architecture():
    bundle = zoo.resolve("hf:bert-base-uncased")
    assert bundle.name == "hf:bert-base-uncased"
    assert bundle.family == "bert"
    assert bundle.hparams["task"] == "masked-lm"
    assert Path(bundle.hparams["config"]).name == "google-bert__bert-base-uncased.json"


# The 2026 additions: (name, task, class the default task builds). Each has an exact
# published figure in hub.PUBLISHED_PARAMS (its source beside it) that the class built on
# the meta device must reproduce.
ADDED = [
    ("meta-llama/Llama-3.2-1B", "causal-lm", "LlamaForCausalLM"),
    ("meta-llama/Llama-3.2-1B-Instruct", "causal-lm", "LlamaForCausalLM"),
    ("meta-llama/Llama-3.2-3B", "causal-lm", "LlamaForCausalLM"),
    ("meta-llama/Llama-3.2-3B-Instruct", "causal-lm", "LlamaForCausalLM"),
    ("meta-llama/Llama-3.1-405B", "causal-lm", "LlamaForCausalLM"),
    ("meta-llama/Llama-3.3-70B-Instruct", "causal-lm", "LlamaForCausalLM"),
    ("Qwen/Qwen2.5-14B", "causal-lm", "Qwen2ForCausalLM"),
    ("Qwen/Qwen2.5-32B", "causal-lm", "Qwen2ForCausalLM"),
    ("Qwen/Qwen2.5-72B", "causal-lm", "Qwen2ForCausalLM"),
    ("Qwen/Qwen3-0.6B", "causal-lm", "Qwen3ForCausalLM"),
    ("Qwen/Qwen3-1.7B", "causal-lm", "Qwen3ForCausalLM"),
    ("Qwen/Qwen3-4B", "causal-lm", "Qwen3ForCausalLM"),
    ("Qwen/Qwen3-8B", "causal-lm", "Qwen3ForCausalLM"),
    ("Qwen/Qwen3-14B", "causal-lm", "Qwen3ForCausalLM"),
    ("Qwen/Qwen3-32B", "causal-lm", "Qwen3ForCausalLM"),
    ("Qwen/Qwen3-30B-A3B", "causal-lm", "Qwen3MoeForCausalLM"),
    ("Qwen/Qwen3-235B-A22B", "causal-lm", "Qwen3MoeForCausalLM"),
    ("google/gemma-2-2b", "causal-lm", "Gemma2ForCausalLM"),
    ("google/gemma-2-27b", "causal-lm", "Gemma2ForCausalLM"),
    ("google/gemma-3-1b-pt", "causal-lm", "Gemma3ForCausalLM"),
    ("google/gemma-3-4b-pt", "causal-lm", "Gemma3ForConditionalGeneration"),
    ("google/gemma-3-12b-pt", "causal-lm", "Gemma3ForConditionalGeneration"),
    ("google/gemma-3-27b-pt", "causal-lm", "Gemma3ForConditionalGeneration"),
    ("microsoft/Phi-3.5-mini-instruct", "causal-lm", "Phi3ForCausalLM"),
    ("microsoft/phi-4", "causal-lm", "Phi3ForCausalLM"),
    ("mistralai/Mistral-Nemo-Base-2407", "causal-lm", "MistralForCausalLM"),
    ("mistralai/Mistral-Small-24B-Base-2501", "causal-lm", "MistralForCausalLM"),
    ("mistralai/Mixtral-8x22B-v0.1", "causal-lm", "MixtralForCausalLM"),
    ("deepseek-ai/DeepSeek-V2-Lite", "causal-lm", "DeepseekV2ForCausalLM"),
    ("allenai/OLMo-2-1124-7B", "causal-lm", "Olmo2ForCausalLM"),
    ("allenai/OLMo-2-1124-13B", "causal-lm", "Olmo2ForCausalLM"),
    ("HuggingFaceTB/SmolLM2-135M", "causal-lm", "LlamaForCausalLM"),
    ("HuggingFaceTB/SmolLM2-360M", "causal-lm", "LlamaForCausalLM"),
    ("HuggingFaceTB/SmolLM2-1.7B", "causal-lm", "LlamaForCausalLM"),
    ("ibm-granite/granite-3.1-8b-base", "causal-lm", "GraniteForCausalLM"),
    ("answerdotai/ModernBERT-base", "masked-lm", "ModernBertForMaskedLM"),
    ("answerdotai/ModernBERT-large", "masked-lm", "ModernBertForMaskedLM"),
]


@pytest.mark.parametrize(("name", "task", "cls"), ADDED)
def test_added_catalog_models_have_their_published_parameter_counts(name, task, cls):
    entry = next(e for e in hub.catalog_entries() if e.name == name)
    row = hub.describe(entry)
    assert (row["task"], row["class"]) == (task, cls)
    assert row["params"] == hub.PUBLISHED_PARAMS[name]
    assert row["params_match"] is True


def test_llama_3_1_405b_resolves_by_its_old_name_too():
    assert hub.resolve_config_file("meta-llama/Meta-Llama-3.1-405B").name == (
        "meta-llama__Llama-3.1-405B.json"
    )


def test_deepseek_v3_builds_without_its_multi_token_prediction_module():
    """671B by the paper; transformers builds no MTP layer (num_nextn_predict_layers), so
    no exact figure is recorded: the Hub's 685B counts it (and fp8 scales)."""
    config = _config("deepseek-ai/DeepSeek-V3")
    assert config.num_nextn_predict_layers == 1
    params = hub.param_count(config, "causal-lm")
    assert params == 671_026_404_352 and round(params / 1e9) == 671
    assert "deepseek-ai/DeepSeek-V3" not in hub.PUBLISHED_PARAMS


@pytest.mark.parametrize(
    ("name", "bare", "params"),
    [
        ("facebook/dinov2-base", "Dinov2Model", 86_580_480),  # official ViT-B/14 count
        ("facebook/dinov2-large", "Dinov2Model", 304_368_640),  # official ViT-L/14 count
        ("google/siglip-base-patch16-224", "SiglipModel", 203_155_970),  # HF safetensors
    ],
)
def test_vision_backbones_bare_class_has_the_published_count(name, bare, params):
    """Their configs name a bare or contrastive class; the catalog trains the image
    classifier built on it (image-cls, 2 labels), whose head no publication counts."""
    import torch
    from transformers.initialization import no_init_weights

    config = _config(name)
    assert config.architectures == [bare]
    assert infer_task(config) == "image-cls"
    with torch.device("meta"), no_init_weights():
        model = getattr(transformers, bare)(config)
    assert sum(p.numel() for p in model.parameters()) == params
    assert name not in hub.PUBLISHED_PARAMS
