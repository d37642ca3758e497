"""The zoo's public entry points: the family table, `make_bundle` and `resolve` (CLI specs)."""

from __future__ import annotations

import importlib
import logging
from collections.abc import Mapping
from typing import Any

from predictor.spec import ModelBundle

from . import dynamic, hf, hf_families, recurrent, transformers_inhouse, vision
from .registry import TASKS, Family

logger = logging.getLogger(__name__)

FAMILIES: dict[str, Family] = {
    fam.name: fam
    for module in (hf_families, vision, recurrent, transformers_inhouse, dynamic)
    for fam in module.FAMILIES
}


def family_names() -> list[str]:
    """The zoo names, in registry order (transformers families first)."""
    return list(FAMILIES)


def get_family(name: str) -> Family:
    try:
        return FAMILIES[name]
    except KeyError:
        raise ValueError(
            f"unknown model {name!r}; valid zoo names: {', '.join(FAMILIES)}"
        ) from None


def make_bundle(name: str, overrides: Mapping[str, Any] | None = None) -> ModelBundle:
    """The bundle of zoo family `name` with hparam `overrides` (typed values)."""
    return get_family(name).make(overrides)


def resolve(
    spec: str, model_args: Mapping[str, str] | None = None, task: str | None = None
) -> ModelBundle:
    """A bundle for a CLI model spec.

    - `NAME`: a zoo family; `model_args` (strings) override hparams, converted to the type
      of each default. `task`, if given, must be the family's task.
    - `hf:PATH/config.json` or `hf:ORG/NAME` (the bundled catalog of published configs, then
      the local Hugging Face cache; see `hub`): a transformers config built offline;
      `task` is causal-lm | seq-cls | masked-lm | seq2seq | image-cls (default: inferred
      from the config's architectures); `model_args` override config fields.
    - `py:module:factory`: `factory(**model_args)` must return a ModelBundle.
    """
    model_args = dict(model_args or {})
    if task is not None and task not in TASKS:
        raise ValueError(f"unknown task {task!r}; expected one of {TASKS}")
    if spec.startswith("hf:"):
        path = spec[3:]
        if not path:
            raise ValueError(
                "hf: spec needs a path or a name, e.g. hf:models/gpt2/config.json or hf:gpt2"
            )
        return hf.bundle_from_config_file(path, task, model_args)
    if spec.startswith("py:"):
        return _from_python(spec, model_args)
    family = get_family(spec)
    if task is not None and task != family.task:
        raise ValueError(f"model {spec!r} trains for task {family.task!r}, not {task!r}")
    return family.make(family.coerce(model_args))


def _from_python(spec: str, model_args: Mapping[str, str]) -> ModelBundle:
    parts = spec[3:].split(":")
    if len(parts) != 2 or not all(parts):
        raise ValueError(f"bad model spec {spec!r}; expected py:module:factory")
    module_name, attr = parts
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"{spec}: cannot import module {module_name!r}: {exc}") from exc
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ValueError(f"{spec}: module {module_name!r} has no callable {attr!r}")
    bundle = factory(**model_args)
    if not isinstance(bundle, ModelBundle):
        raise ValueError(
            f"{spec}: factory returned {type(bundle).__name__}, expected a ModelBundle"
        )
    logger.debug("resolved %s to bundle %s", spec, bundle.name)
    return bundle
