"""The model a config file names, as a memgnn spec, and LoRA's target roles as module names.

`hub_model` turns what a file says (a Hub name "meta-llama/Meta-Llama-3.1-8B-Instruct", a
local checkpoint folder, a config.json) into `hf:...`. With a `catalog` (Hub name -> its
config.json contents; `read.bundled_catalog` by default), a name matches the catalog entry
of the same shapes: the name itself, then without an instruction/chat suffix (an instruct
checkpoint has its base's config), then Meta's renamed Llama 3.1 repositories, then the
same name under another organisation (mirrors such as NousResearch/Meta-Llama-3.1-8B).
Each match says what it did.

`lora_targets` names, for a model type, the modules a framework's LoRA switches mean
(torchtune's `lora_attn_modules` and `apply_lora_to_mlp`, LitGPT's `lora_query` ...): q, k,
v, o (attention output), mlp and head. Hugging Face's module names per model type, read off
transformers' modeling files: Llama-style `q_proj ... down_proj`; Phi-3's fused `qkv_proj`,
`gate_up_proj`; Phi-2's `dense`, `fc1`, `fc2`; Falcon's and GPT-NeoX's fused
`query_key_value`, `dense_h_to_4h`, `dense_4h_to_h`; GPT-2's `c_attn`, `c_proj`, `c_fc`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Catalog", "ModelName", "hub_model", "lora_targets", "ROLES"]

Catalog = Mapping[str, Mapping[str, Any]]  # "ORG/NAME" -> its config.json contents

ROLES = ("q", "k", "v", "o", "mlp", "head")
_SUFFIXES = ("-instruct", "-chat", "-it", "-base", "-hf")
_LLAMA = {
    "q": "q_proj",
    "k": "k_proj",
    "v": "v_proj",
    "o": "o_proj",
    "mlp": "gate_proj,up_proj,down_proj",
    "head": "lm_head",
}
_NEOX = {
    "q": "query_key_value",
    "k": "query_key_value",
    "v": "query_key_value",
    "o": "dense",
    "mlp": "dense_h_to_4h,dense_4h_to_h",
    "head": "embed_out",
}
_MODULES: dict[str, dict[str, str]] = {
    **dict.fromkeys(
        (
            "llama",
            "mistral",
            "qwen2",
            "qwen3",
            "gemma",
            "gemma2",
            "gemma3_text",
            "olmo2",
            "granite",
            "stablelm",
            "smollm3",
            "qwen2_moe",
            "qwen3_moe",
        ),
        _LLAMA,
    ),
    "mixtral": {**_LLAMA, "mlp": "w1,w2,w3"},
    "phi3": {
        **_LLAMA,
        "q": "qkv_proj",
        "k": "qkv_proj",
        "v": "qkv_proj",
        "mlp": "gate_up_proj,down_proj",
    },
    "phi": {**_LLAMA, "o": "dense", "mlp": "fc1,fc2"},
    "falcon": {**_NEOX, "head": "lm_head"},
    "gpt_neox": _NEOX,
    "gpt2": {
        "q": "c_attn",
        "k": "c_attn",
        "v": "c_attn",
        "o": "c_proj",
        "mlp": "c_fc,c_proj",
        "head": "lm_head",
    },
}


@dataclass(kw_only=True, slots=True)
class ModelName:
    """A file's model as memgnn names it: `spec` (None: not usable), what was done to the
    name (`note`), a problem with it (`warning`), and its config.json when known."""

    spec: str | None
    note: str = ""
    warning: str = ""
    config: Mapping[str, Any] | None = None


def _strip_suffixes(name: str) -> str:
    changed = True
    while changed:
        changed = False
        for s in _SUFFIXES:
            if name.lower().endswith(s):
                name, changed = name[: -len(s)], True
    return name


def _variants(name: str) -> list[str]:
    """Names of the same shapes, best first: as given, without -Instruct/-chat/..., and
    Meta's Llama 3.1 renaming (Meta-Llama-3.1-8B is now Llama-3.1-8B) both ways."""
    out = [name, _strip_suffixes(name)]
    for n in list(out):
        if n.startswith("Meta-Llama-3.1-"):
            out.append(n.removeprefix("Meta-"))
        elif n.startswith("Llama-3.1-"):
            out.append("Meta-" + n)
    return list(dict.fromkeys(out))


def _local(text: str) -> ModelName | None:
    path = Path(text).expanduser()
    looks_local = text.startswith(("/", "./", "../", "~")) or path.exists()
    if not looks_local:
        return None
    config = path / "config.json" if path.is_dir() else path
    if config.is_file() and config.suffix == ".json":
        try:
            contents = json.loads(config.read_text())
        except (OSError, ValueError):
            contents = None
        return ModelName(spec=f"hf:{config}", config=contents)
    return ModelName(
        spec=None,
        warning=f"model path {text} has no config.json here: give --model (e.g. "
        "hf:ORG/NAME or hf:PATH/config.json)",
    )


def hub_model(text: str, catalog: Catalog | None) -> ModelName:
    """The memgnn spec of a model a file names: a local folder/config.json, or a Hub name
    matched against `catalog` (see the module docstring)."""
    text = str(text).strip()
    local = _local(text)
    if local is not None:
        return local
    if catalog is None:
        return ModelName(spec=f"hf:{text}")
    by_lower = {n.lower(): n for n in catalog}
    org, _, name = text.rpartition("/")
    for variant in _variants(name):
        found = by_lower.get(f"{org}/{variant}".lower())
        if found is not None:
            note = "" if found == text else f"the catalog's {found}: the same shapes"
            return ModelName(spec=f"hf:{found}", note=note, config=catalog[found])
    by_name = {n.rpartition("/")[2].lower(): n for n in catalog}
    for variant in _variants(name):
        found = by_name.get(variant.lower())
        if found is not None:
            return ModelName(
                spec=f"hf:{found}",
                note=f"the catalog's {found}: the same name under another organisation",
                config=catalog[found],
            )
    return ModelName(
        spec=f"hf:{text}",
        warning=f"model {text} is not in memgnn's bundled catalog (`memgnn models` lists "
        "it): it resolves only from the local Hugging Face cache",
    )


def lora_targets(roles: Sequence[str], config: Mapping[str, Any] | None) -> tuple[str, str]:
    """The comma-separated module names LoRA roles (q, k, v, o, mlp, head) mean in the
    model of `config` (a config.json), and a note: a fused projection adapted whole, or
    the Llama names assumed where the model type is unknown."""
    unknown = [r for r in roles if r not in ROLES]
    if unknown:
        raise ValueError(f"unknown LoRA roles {unknown}; expected some of {ROLES}")
    model_type = (config or {}).get("model_type")
    table = _MODULES.get(model_type or "")
    notes = []
    if table is None:
        table = _LLAMA
        notes.append(
            f"LoRA module names assumed Llama's ({', '.join(_LLAMA[r] for r in roles)}): "
            + (f"model type {model_type!r} has no table" if model_type else "model unknown")
        )
    names: list[str] = []
    for role in roles:
        for name in table[role].split(","):
            if name not in names:
                names.append(name)
    qkv = [r for r in roles if r in ("q", "k", "v")]
    fused = table["q"] == table["k"] == table["v"]
    if fused and qkv and len(qkv) < 3:
        notes.append(
            f"{model_type} fuses q, k and v in {table['q']}: peft adapts the whole fused "
            f"projection (only {', '.join(qkv)} asked): a wider B matrix"
        )
    return ",".join(names), "; ".join(notes)
