"""`read_config`: a framework's config file -> a `ConfigReading`, the format told or found.

Detection, from the file's name and content (the first rule that holds):
- `.toml` -> torchtitan (a job config);
- a top-level value with a `_component_` key -> torchtune (a recipe config);
- `checkpoint_dir`, a `lora_query`-style switch, or `train.micro_batch_size` /
  `train.global_batch_size` -> litgpt (a finetune config);
- `base_model`, `micro_batch_size`, `sequence_len` or `adapter` at the top -> axolotl;
- a key only TRL's configs have (`max_length`, `packing`, `model_name_or_path`, ...)
  -> trl;
- a `TrainingArguments` key -> hf.
Anything else is refused with the formats it could be given as.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from memgnn.predictor.errors import UserError
from memgnn.predictor.frameworks import axolotl, litgpt, torchtitan, torchtune
from memgnn.predictor.frameworks.base import FORMATS, ConfigReading
from memgnn.predictor.frameworks.files import load_file, text_kind
from memgnn.predictor.frameworks.hf import read_hf
from memgnn.predictor.frameworks.hf_keys import FEATURES, HF_ONLY, NO_EFFECT, TRL_ONLY
from memgnn.predictor.frameworks.naming import Catalog
from memgnn.predictor.zoo.hub import catalog_entries

__all__ = ["bundled_catalog", "detect_format", "read_config"]


@functools.cache
def bundled_catalog() -> Catalog:
    """memgnn's bundled catalog: Hub name -> its config.json contents."""
    return {e.name: json.loads(e.path.read_text()) for e in catalog_entries()}


_LITGPT_SWITCHES = (
    "lora_query",
    "lora_key",
    "lora_value",
    "lora_projection",
    "lora_mlp",
    "lora_head",
)
_AXOLOTL = ("base_model", "micro_batch_size", "sequence_len", "adapter")


def detect_format(path: Path, data: dict[str, Any], default: str | None = None) -> str:
    """The format of a loaded config (see the module docstring); `default` (else a
    UserError) when none fits."""
    if text_kind(path) == "toml":
        return "torchtitan"
    if any(isinstance(v, dict) and "_component_" in v for v in data.values()):
        return "torchtune"
    train = data.get("train")
    if (
        "checkpoint_dir" in data
        or any(k in data for k in _LITGPT_SWITCHES)
        or isinstance(train, dict)
        and ("micro_batch_size" in train or "global_batch_size" in train)
    ):
        return "litgpt"
    if any(k in data for k in _AXOLOTL):
        return "axolotl"
    if any(k in TRL_ONLY for k in data):
        return "trl"
    hf_keys = set(NO_EFFECT) | set(FEATURES) | HF_ONLY
    if any(k in hf_keys for k in data):
        return "hf"
    if default is not None:
        return default
    raise UserError(
        f"{path}: cannot tell which framework's config this is (its keys: "
        f"{', '.join(list(data)[:8])}{', ...' if len(data) > 8 else ''}); name the format: "
        f"one of {', '.join(FORMATS)}"
    )


def read_config(
    path: str | Path,
    format: str | None = None,  # noqa: A002 - the CLI's word for it
    *,
    adapter_config: str | Path | None = None,
    catalog: Catalog | None = None,
) -> ConfigReading:
    """Read a framework's config file as a memgnn run.

    `format`: hf | trl | torchtune | torchtitan | axolotl | litgpt (detected when None).
    `adapter_config`: a PEFT adapter_config.json for hf/trl (default: one beside the file).
    `catalog`: a model catalog (Hub name -> config.json contents), to match the file's
    model to a catalog name and to know its module names (default: memgnn's bundled
    one, `bundled_catalog`)."""
    p = Path(path)
    catalog = bundled_catalog() if catalog is None else catalog
    if format is not None and format not in FORMATS:
        raise UserError(f"unknown config format {format!r}; expected one of {', '.join(FORMATS)}")
    kind = "toml" if format == "torchtitan" else None
    data = load_file(p, kind)
    # with an adapter config, a file of no known key is TrainingArguments at their defaults
    fmt = format or detect_format(p, data, "hf" if adapter_config is not None else None)
    if adapter_config is not None and fmt not in ("hf", "trl"):
        raise UserError(f"an adapter_config.json goes with hf/trl configs, not {fmt}")
    try:
        if fmt in ("hf", "trl"):
            side = Path(adapter_config) if adapter_config is not None else None
            if side is not None and not side.is_file():
                raise UserError(f"adapter config not found: {side}")
            return read_hf(p, data, trl=fmt == "trl", adapter_config=side, catalog=catalog)
        reader = {
            "torchtune": torchtune.read_torchtune,
            "torchtitan": torchtitan.read_torchtitan,
            "axolotl": axolotl.read_axolotl,
            "litgpt": litgpt.read_litgpt,
        }[fmt]
        return reader(p, data, catalog=catalog)
    except UserError:
        raise
    except ValueError as exc:  # a value of the wrong kind in the file
        raise UserError(f"{p} ({fmt}): {exc}") from exc
