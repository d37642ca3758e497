"""Read a run as its framework states it: transformers' TrainingArguments and TRL configs,
torchtune recipes, torchtitan job configs, axolotl and LitGPT configs -> memgnn options.

`read_config(path)` returns a `ConfigReading`: the model, sizes and memgnn options the
file means, every key with what it became, and a warning for each key that changes memory
in a way memgnn does not model yet (or that nobody knows). `merge_options` lays the
command line's explicit flags over the file's options and names each override.
"""

from memgnn.predictor.frameworks.base import (
    ConfigReading,
    KeyRead,
    merge_options,
    merge_sizes,
    spec_options,
)
from memgnn.predictor.frameworks.read import detect_format, read_config

__all__ = [
    "ConfigReading",
    "KeyRead",
    "detect_format",
    "merge_options",
    "merge_sizes",
    "read_config",
    "spec_options",
]
