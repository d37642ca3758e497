"""The model zoo: small, configurable model families for capture, profiling and training data.

`FAMILIES` maps zoo names to `Family` records; `make_bundle(name, overrides)` makes a
`ModelBundle`; `resolve(spec, model_args, task)` handles the CLI spec forms (zoo name,
`hf:PATH/config.json`, `py:module:factory`). Importing this package does not import
transformers; the transformers families import it when a bundle is made.
"""

from __future__ import annotations

from .registry import SOURCES, TASKS, Family, coerce_like
from .resolve import FAMILIES, ZOO_ARG_SCALE, family_names, get_family, make_bundle, resolve

__all__ = [
    "FAMILIES",
    "SOURCES",
    "TASKS",
    "ZOO_ARG_SCALE",
    "Family",
    "coerce_like",
    "family_names",
    "get_family",
    "make_bundle",
    "resolve",
]
