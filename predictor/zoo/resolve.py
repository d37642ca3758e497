"""The zoo's public entry points: the family table, `make_bundle` and `resolve` (CLI specs)."""

from __future__ import annotations

import importlib
import inspect
import logging
import os
import sys
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from memgnn.predictor.errors import UserError
from memgnn.predictor.spec.bundle import ModelBundle

from . import dynamic, hf, hf_families, recurrent, transformers_inhouse, vision
from .registry import TASKS, Family

logger = logging.getLogger(__name__)
# A zoo model's integer args may reach this multiple of the largest value of the family's
# range (or default): beyond that no published model, and a capture that runs for hours.
# The service applies its own, tighter `max_hparam_scale`.
ZOO_ARG_SCALE = 64.0

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
    spec: str,
    model_args: Mapping[str, str] | None = None,
    task: str | None = None,
    *,
    max_arg_scale: float = ZOO_ARG_SCALE,
) -> ModelBundle:
    """A bundle for a CLI model spec.

    - `NAME`: a zoo family; `model_args` (strings) override hparams, converted to the type
      of each default, each integer at most `max_arg_scale` x the largest of the family's
      range. `task`, if given, must be the family's task.
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
    if spec not in FAMILIES and "/" in spec:  # an org/name: a published config, not a zoo family
        raise ValueError(
            f"unknown model {spec!r}: an org/name model is read with the hf: prefix "
            f"(--model hf:{spec}; `memgnn models` lists the bundled catalog); zoo names: "
            f"{', '.join(FAMILIES)}"
        )
    family = get_family(spec)
    if task is not None and task != family.task:
        raise ValueError(f"model {spec!r} trains for task {family.task!r}, not {task!r}")
    hparams = family.coerce(model_args)
    family.check_args(hparams, max_arg_scale)
    return family.make(hparams)


def _from_python(spec: str, model_args: Mapping[str, str]) -> ModelBundle:
    """`py:module:factory`: import `module` (from sys.path, then the current directory, as
    `python -m` would) and call `factory(**model_args)`, which must return a ModelBundle.
    Model args arrive as strings; a factory converts them (see docs/how-to/your-model.md)."""
    parts = spec[3:].split(":")
    if len(parts) != 2 or not all(parts):
        raise UserError(f"bad model spec {spec!r}; expected py:module:factory")
    module_name, attr = parts
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)  # after installed packages: a local file cannot shadow them
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UserError(
            f"{spec}: cannot import module {module_name!r} (looked on sys.path and in {cwd}): {exc}"
        ) from exc
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise UserError(f"{spec}: module {module_name!r} has no callable {attr!r}")
    try:
        inspect.signature(factory).bind(**model_args)
    except TypeError as exc:
        raise UserError(
            f"{spec}: model args {sorted(model_args)} do not fit {attr}{_signature(factory)}: {exc}"
        ) from None
    try:
        bundle = factory(**model_args)
    except Exception as exc:  # the user's code: its error, named, without our traceback
        logger.debug("%s raised", spec, exc_info=exc)
        raise UserError(f"{spec}: {attr}() raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(bundle, ModelBundle):
        raise UserError(f"{spec}: factory returned {type(bundle).__name__}, expected a ModelBundle")
    logger.debug("resolved %s to bundle %s", spec, bundle.name)
    return replace(bundle, origin="py")


def _signature(fn: Any) -> str:
    try:
        return str(inspect.signature(fn))
    except (TypeError, ValueError):
        return "(...)"
