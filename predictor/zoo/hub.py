"""Real Hugging Face models by name, offline: `hf:ORG/NAME` resolves to a config.json.

Resolution order for `hf:SPEC`:
1. SPEC names an existing file or folder (`hf:PATH/config.json`, `hf:PATH/`): that file.
2. SPEC is in the bundled catalog (`catalog/ORG__NAME.json`, the published config.json of
   the Hub repository, or a legacy alias such as `gpt2` for `openai-community/gpt2`).
3. SPEC is in the local Hugging Face cache (`$HF_HUB_CACHE`, else `$HF_HOME/hub`, else
   `~/.cache/huggingface/hub`): `models--ORG--NAME/snapshots/*/config.json`, newest first.
4. Otherwise a ValueError listing the catalog names closest to SPEC (difflib).

Nothing is downloaded. `PUBLISHED_PARAMS` records each catalog model's published parameter
count for the class its `architectures` names (the head `infer_task` picks), which
`param_count` reproduces on the meta device (`memgnn models --check`).
"""

from __future__ import annotations

import difflib
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .hf_tasks import infer_task, model_class, require_transformers

logger = logging.getLogger(__name__)

__all__ = [
    "ALIASES",
    "CATALOG_DIR",
    "PUBLISHED_PARAMS",
    "CatalogEntry",
    "catalog_entries",
    "catalog_names",
    "describe",
    "hub_cache_dir",
    "param_count",
    "resolve_config_file",
]

CATALOG_DIR = Path(__file__).with_name("catalog")

# Legacy Hub names (repositories since moved under an organisation) -> canonical names.
ALIASES = {
    "gpt2": "openai-community/gpt2",
    "gpt2-medium": "openai-community/gpt2-medium",
    "gpt2-large": "openai-community/gpt2-large",
    "gpt2-xl": "openai-community/gpt2-xl",
    "bert-base-uncased": "google-bert/bert-base-uncased",
    "bert-large-uncased": "google-bert/bert-large-uncased",
    "roberta-base": "FacebookAI/roberta-base",
    "roberta-large": "FacebookAI/roberta-large",
    "t5-small": "google-t5/t5-small",
    "t5-base": "google-t5/t5-base",
    "t5-large": "google-t5/t5-large",
    "meta-llama/Meta-Llama-3.1-8B": "meta-llama/Llama-3.1-8B",
    "meta-llama/Meta-Llama-3.1-70B": "meta-llama/Llama-3.1-70B",
    "meta-llama/Meta-Llama-3.1-405B": "meta-llama/Llama-3.1-405B",
}

# Published parameter counts (unique parameters, tied weights once) of the class each
# catalog config's `architectures` names: *ForCausalLM / GPT2LMHeadModel for the LMs,
# BertForMaskedLM / RobertaForMaskedLM (the MLM head: no pooler; dense + LayerNorm + decoder
# bias, decoder weight tied), T5ForConditionalGeneration, ViTForImageClassification
# (1000 classes). The bare encoders are smaller: BertModel (bert-base-uncased) 109,482,240,
# RobertaModel (roberta-base) 124,645,632. Pythia sizes are the Pythia paper's totals.
PUBLISHED_PARAMS: dict[str, int] = {
    "openai-community/gpt2": 124_439_808,
    "openai-community/gpt2-medium": 354_823_168,
    "openai-community/gpt2-large": 774_030_080,
    "openai-community/gpt2-xl": 1_557_611_200,
    "google-bert/bert-base-uncased": 109_514_298,
    "google-bert/bert-large-uncased": 335_174_458,
    "FacebookAI/roberta-base": 124_697_433,
    "FacebookAI/roberta-large": 355_412_057,
    "google-t5/t5-small": 60_506_624,
    "google-t5/t5-base": 222_903_552,
    "google-t5/t5-large": 737_668_096,
    "google/vit-base-patch16-224": 86_567_656,
    "meta-llama/Llama-2-7b-hf": 6_738_415_616,
    "meta-llama/Llama-2-13b-hf": 13_015_864_320,
    "meta-llama/Llama-2-70b-hf": 68_976_648_192,
    "meta-llama/Meta-Llama-3-8B": 8_030_261_248,
    "meta-llama/Meta-Llama-3-70B": 70_553_706_496,
    "meta-llama/Llama-3.1-8B": 8_030_261_248,
    "meta-llama/Llama-3.1-70B": 70_553_706_496,
    "mistralai/Mistral-7B-v0.1": 7_241_732_096,
    "mistralai/Mixtral-8x7B-v0.1": 46_702_792_704,
    "Qwen/Qwen2.5-0.5B": 494_032_768,
    "Qwen/Qwen2.5-1.5B": 1_543_714_304,
    "Qwen/Qwen2.5-3B": 3_085_938_688,
    "Qwen/Qwen2.5-7B": 7_615_616_512,
    "google/gemma-2b": 2_506_172_416,
    "google/gemma-7b": 8_537_680_896,
    "google/gemma-2-9b": 9_241_705_984,
    "microsoft/phi-2": 2_779_683_840,
    "microsoft/Phi-3-mini-4k-instruct": 3_821_079_552,
    "TinyLlama/TinyLlama-1.1B-Chat-v1.0": 1_100_048_384,
    "EleutherAI/pythia-70m": 70_426_624,
    "EleutherAI/pythia-160m": 162_322_944,
    "EleutherAI/pythia-410m": 405_334_016,
    "EleutherAI/pythia-1b": 1_011_781_632,
    "EleutherAI/pythia-1.4b": 1_414_647_808,
    "EleutherAI/pythia-2.8b": 2_775_208_960,
    "EleutherAI/pythia-6.9b": 6_857_302_016,
    "EleutherAI/pythia-12b": 11_846_072_320,
    "facebook/opt-125m": 125_239_296,
    "facebook/opt-350m": 331_196_416,
    "facebook/opt-1.3b": 1_315_758_080,
    "facebook/opt-2.7b": 2_651_596_800,
    "facebook/opt-6.7b": 6_658_473_984,
    # falcon-7b: FalconForCausalLM, lm_head tied; stablelm-base-alpha-3b: the count a
    # loaded checkpoint gives (3,637,321,728, untied); vit-large: torchvision vit_l_16's
    # documented num_params, the same layer shapes (1000 classes)
    "tiiuae/falcon-7b": 6_921_720_704,
    "stabilityai/stablelm-base-alpha-3b": 3_637_321_728,
    "google/vit-large-patch16-224": 304_326_632,
    # --- 2026 additions. "HF" = the Hub's safetensors total (model page / API
    # `safetensors.total`) as recorded in public notes that read it; "keras-hub" = the
    # `params` of keras-team/keras-hub's preset for the same weights (tied embedding once).
    "meta-llama/Llama-3.2-1B": 1_235_814_400,  # HF (safetensors payload, tied lm_head)
    "meta-llama/Llama-3.2-1B-Instruct": 1_235_814_400,  # HF
    "meta-llama/Llama-3.2-3B": 3_212_749_824,  # HF
    "meta-llama/Llama-3.2-3B-Instruct": 3_212_749_824,  # HF
    "meta-llama/Llama-3.1-405B": 405_853_388_800,  # HF API safetensors.total
    "meta-llama/Llama-3.3-70B-Instruct": 70_553_706_496,  # HF (as Llama-3.1-70B)
    "Qwen/Qwen2.5-14B": 14_770_033_664,  # HF API safetensors.total
    "Qwen/Qwen2.5-32B": 32_763_876_352,  # keras-hub qwen2.5_instruct_32b_en; HF
    "Qwen/Qwen2.5-72B": 72_706_203_648,  # keras-hub qwen2.5_instruct_72b_en
    "Qwen/Qwen3-0.6B": 596_049_920,  # keras-hub qwen3_0.6b_en (lm_head tied, once)
    "Qwen/Qwen3-1.7B": 1_720_574_976,  # keras-hub qwen3_1.7b_en (tied, once)
    "Qwen/Qwen3-4B": 4_022_468_096,  # HF API; keras-hub qwen3_4b_en
    "Qwen/Qwen3-8B": 8_190_735_360,  # HF API; keras-hub qwen3_8b_en
    "Qwen/Qwen3-14B": 14_768_307_200,  # keras-hub qwen3_14b_en
    "Qwen/Qwen3-32B": 32_762_123_264,  # keras-hub qwen3_32b_en
    "Qwen/Qwen3-30B-A3B": 30_532_122_624,  # keras-hub qwen3_moe_30b_a3b_en
    "Qwen/Qwen3-235B-A22B": 235_093_634_560,  # keras-hub qwen3_moe_235b_a22b_en
    "google/gemma-2-2b": 2_614_341_888,  # keras-hub gemma2_2b_en
    "google/gemma-2-27b": 27_227_128_320,  # keras-hub gemma2_27b_en
    "google/gemma-3-1b-pt": 999_885_952,  # keras-hub gemma3_1b; HF
    # Gemma 3 4B+: Gemma3ForConditionalGeneration, vision tower and projector included
    "google/gemma-3-4b-pt": 4_300_079_472,  # HF API (gemma-3-4b-it); keras-hub medgemma_4b
    "google/gemma-3-12b-pt": 12_187_325_040,  # HF API (gemma-3-12b-it, same weights' shapes)
    "google/gemma-3-27b-pt": 27_432_406_640,  # keras-hub medgemma_instruct_27b (same shapes)
    "microsoft/Phi-3.5-mini-instruct": 3_821_079_552,  # HF (as Phi-3-mini)
    "microsoft/phi-4": 14_659_507_200,  # HF API safetensors.total
    "mistralai/Mistral-Nemo-Base-2407": 12_247_782_400,  # HF safetensors (Nemo 2407)
    "mistralai/Mistral-Small-24B-Base-2501": 23_572_403_200,  # HF safetensors; keras-hub
    "mistralai/Mixtral-8x22B-v0.1": 140_620_634_112,  # HF API (as WizardLM-2-8x22B)
    "deepseek-ai/DeepSeek-V2-Lite": 15_706_484_224,  # safetensors total (V2-Lite-Chat)
    "allenai/OLMo-2-1124-7B": 7_298_617_344,  # HF API safetensors.total
    "allenai/OLMo-2-1124-13B": 13_716_198_400,  # HF API (OLMo-2-1124-13B-Instruct)
    "HuggingFaceTB/SmolLM2-135M": 134_515_008,  # HF safetensors metadata
    "HuggingFaceTB/SmolLM2-360M": 361_821_120,  # HF safetensors (290 tensors)
    "HuggingFaceTB/SmolLM2-1.7B": 1_711_376_384,  # HF metadata
    "ibm-granite/granite-3.1-8b-base": 8_170_848_256,  # HF safetensors metadata
    "answerdotai/ModernBERT-base": 149_655_232,  # HF API (ModernBertForMaskedLM weights)
    "answerdotai/ModernBERT-large": 395_881_664,  # HF API
}
# No exact figure for the class the catalog builds:
# - deepseek-ai/DeepSeek-V3: 671,026,404,352 built; the paper's "671B total parameters"
#   agrees. transformers builds no multi-token-prediction module (the Hub's 685B counts
#   its 14B, and its fp8 checkpoint's scales).
# - facebook/dinov2-base/-large, google/siglip-base-patch16-224: their configs name the
#   bare Dinov2Model (86,580,480 / 304,368,640) and the contrastive SiglipModel
#   (203,155,970, HF safetensors metadata), which tests check; the catalog trains
#   their image classifiers (2 labels), whose head no publication counts.
# bigscience/T0_3B (T5ForConditionalGeneration, untied lm_head) publishes 2,849,757,184; the
# installed transformers (5.x) ties T5's lm_head to the shared embedding whatever the config
# says (T5Config forces tie_word_embeddings=True), so the class built from its config has
# 2,783,959,040 (one 32128 x 2048 matrix fewer) and it has no exact figure to check against.


@dataclass(kw_only=True, slots=True, frozen=True)
class CatalogEntry:
    """One bundled config: its Hub name, file and published parameter count (if known)."""

    name: str
    path: Path
    published_params: int | None

    def __post_init__(self) -> None:
        if "/" not in self.name:
            raise ValueError(f"catalog name {self.name!r} is not ORG/NAME")


def _file_name(name: str) -> str:
    return name.replace("/", "__") + ".json"


def catalog_entries() -> list[CatalogEntry]:
    """Every bundled config, sorted by name (case-insensitive)."""
    entries = [
        CatalogEntry(
            name=(name := f.stem.replace("__", "/", 1)),
            path=f,
            published_params=PUBLISHED_PARAMS.get(name),
        )
        for f in CATALOG_DIR.glob("*__*.json")
    ]
    return sorted(entries, key=lambda e: e.name.lower())


def catalog_names() -> list[str]:
    return [e.name for e in catalog_entries()]


def hub_cache_dir() -> Path:
    """The local Hugging Face hub cache, as huggingface_hub locates it."""
    if cache := os.environ.get("HF_HUB_CACHE"):
        return Path(cache).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface"
    )
    return Path(home).expanduser() / "hub"


def _from_cache(name: str) -> Path | None:
    snapshots = hub_cache_dir() / f"models--{name.replace('/', '--')}" / "snapshots"
    found = sorted(snapshots.glob("*/config.json"), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def resolve_config_file(spec: str) -> Path:
    """The config.json `hf:SPEC` means (see the module docstring); ValueError if none."""
    path = Path(spec).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        return path / "config.json"
    if path.is_file():
        return path
    if spec.endswith(".json") or spec.startswith((".", "/", "~")):
        raise ValueError(f"hf config file not found: {spec}")
    name = ALIASES.get(spec, spec)
    by_lower = {n.lower(): n for n in catalog_names()}
    canonical = by_lower.get(name.lower())
    if canonical is not None:
        return CATALOG_DIR / _file_name(canonical)
    cached = _from_cache(name)
    if cached is not None:
        logger.info("hf:%s read from the local Hugging Face cache: %s", spec, cached)
        return cached
    known = [*by_lower.values(), *ALIASES]
    near = difflib.get_close_matches(spec, known, n=5, cutoff=0.5)
    near += [n for n in known if spec.lower() in n.lower() and n not in near][: 5 - len(near)]
    hint = f"; near names: {', '.join(near)}" if near else ""
    raise ValueError(
        f"unknown hf model {spec!r}: not a config file, not in the bundled catalog "
        f"(`memgnn models` lists it), not in the Hugging Face cache {hub_cache_dir()}{hint}"
    )


def param_count(config: Any, task: str) -> int:
    """Unique parameters (tied weights once) of the `task` class for `config`, built on the
    meta device: no weight is materialised."""
    from transformers.initialization import no_init_weights

    cls = model_class(config, task)
    with torch.device("meta"), no_init_weights():
        model = cls(config)
    model.tie_weights()  # no_init_weights skips the tying post_init would do
    return sum(p.numel() for p in model.parameters())


def describe(entry: CatalogEntry) -> dict[str, Any]:
    """What `memgnn models` shows for one entry: its config's shape, the class the default
    task builds, the parameter count computed on the meta device, and the check against
    the published figure (`params_match` None where no exact figure is recorded)."""
    tf = require_transformers()
    config = tf.AutoConfig.from_pretrained(str(entry.path), local_files_only=True)
    task = infer_task(config)
    params = param_count(config, task)
    published = entry.published_params
    return {
        "name": entry.name,
        "model_type": config.model_type,
        "task": task,
        "class": model_class(config, task).__name__,
        "params": params,
        "published_params": published,
        "params_match": None if published is None else params == published,
        "aliases": sorted(a for a, n in ALIASES.items() if n == entry.name),
    }
