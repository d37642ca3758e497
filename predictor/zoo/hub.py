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
}
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

    from .hf import model_class

    cls = model_class(config, task)
    with torch.device("meta"), no_init_weights():
        model = cls(config)
    model.tie_weights()  # no_init_weights skips the tying post_init would do
    return sum(p.numel() for p in model.parameters())


def describe(entry: CatalogEntry) -> dict[str, Any]:
    """What `memgnn models` shows for one entry: its config's shape, the class the default
    task builds, the parameter count computed on the meta device, and the check against
    the published figure (`params_match` None where no exact figure is recorded)."""
    from .hf import infer_task, model_class, require_transformers

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
