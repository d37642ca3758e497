"""The `Family` record every zoo entry is, plus the hparam checks the factories share.

A family is a model architecture with a small default configuration and the choices a
config sampler may draw from. `Family.make(overrides)` merges the overrides into the
defaults (unknown keys are a ValueError naming the valid ones) and calls the factory,
which checks the values and returns a `ModelBundle` without building the model: building
happens in `bundle.build()`, so a bundle is cheap to make and can be built under a
fake-tensor mode.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import random
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memgnn.predictor.errors import UserError
from memgnn.predictor.spec.bundle import ModelBundle

logger = logging.getLogger(__name__)

SOURCES = ("transformers", "in-house")
# What a model trains for; `resolve(..., task=...)` checks a zoo name against it.
TASKS = ("causal-lm", "seq-cls", "masked-lm", "seq2seq", "image-cls", "segmentation", "cls")
_NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")

Factory = Callable[[dict[str, Any]], ModelBundle]


@dataclass(kw_only=True, slots=True)
class Family:
    """One zoo entry: `make(hparams)` returns a ModelBundle for defaults updated with hparams."""

    name: str  # the zoo name used on the CLI
    family: str  # the label leave-family-out splits group by
    source: str  # "transformers" or "in-house"
    task: str
    defaults: dict[str, Any]
    ranges: dict[str, list[Any]]
    dims: dict[str, int]
    factory: Factory
    description: str = ""

    def __post_init__(self) -> None:
        if not _NAME_RE.match(self.name):
            raise ValueError(f"bad family name {self.name!r}")
        if not self.family:
            raise ValueError(f"family {self.name!r}: empty family label")
        if self.source not in SOURCES:
            raise ValueError(f"family {self.name!r}: source must be one of {SOURCES}")
        if self.task not in TASKS:
            raise ValueError(f"family {self.name!r}: task must be one of {TASKS}")
        if not self.dims:
            raise ValueError(f"family {self.name!r}: no dims")
        for sym, value in self.dims.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"family {self.name!r}: dim {sym} must be a positive int")
        for key, choices in self.ranges.items():
            if key not in self.defaults:
                raise ValueError(f"family {self.name!r}: range for unknown hparam {key!r}")
            if not isinstance(choices, list) or not choices:
                raise ValueError(f"family {self.name!r}: range {key!r} must be a non-empty list")
        if not callable(self.factory):
            raise ValueError(f"family {self.name!r}: factory is not callable")

    def hparams(self, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The defaults updated with `overrides`; an unknown key is a ValueError."""
        out = dict(self.defaults)
        for key, value in (overrides or {}).items():
            if key not in self.defaults:
                raise ValueError(
                    f"unknown hparam {key!r} for model {self.name!r}; "
                    f"valid hparams: {sorted(self.defaults)}"
                )
            out[key] = value
        return out

    def make(self, hparams: Mapping[str, Any] | None = None) -> ModelBundle:
        """A bundle for the defaults updated with `hparams` (values are checked here)."""
        hp = self.hparams(hparams)
        bundle = self.factory(hp)
        if not bundle.fingerprint:  # the capture cache's key without building the model
            bundle.fingerprint = json.dumps({"zoo": self.name, "sources": zoo_digest()})
        logger.debug("made %s bundle with %s", self.name, hp)
        return bundle

    def coerce(self, args: Mapping[str, str]) -> dict[str, Any]:
        """CLI `--model-arg key=value` strings converted to the type of each default."""
        out: dict[str, Any] = {}
        for key, raw in args.items():
            if key not in self.defaults:
                raise ValueError(
                    f"unknown model arg {key!r} for model {self.name!r}; "
                    f"valid model args: {sorted(self.defaults)}"
                )
            out[key] = coerce_like(self.defaults[key], raw, f"{self.name}.{key}")
        return out

    def arg_limit(self, name: str, scale: float) -> int | None:
        """The largest value integer hparam `name` may take: `scale` x the largest of its
        default and range (None for a non-integer hparam). A capture's cost grows with
        these, and a zoo config far past its range describes no model anyone trains."""
        known = [self.defaults.get(name), *self.ranges.get(name, [])]
        known = [v for v in known if isinstance(v, int) and not isinstance(v, bool)]
        return int(max(known) * scale) if known else None

    def over_limit(self, hparams: Mapping[str, Any], scale: float) -> tuple[str, int, int] | None:
        """The first integer hparam over its `arg_limit`, as (name, value, limit)."""
        for name, value in hparams.items():
            if isinstance(value, bool) or not isinstance(value, int):
                continue
            limit = self.arg_limit(name, scale)
            if limit is not None and value > limit:
                return name, value, limit
        return None

    def check_args(self, hparams: Mapping[str, Any], scale: float) -> None:
        """UserError naming the first integer hparam over its `arg_limit`."""
        over = self.over_limit(hparams, scale)
        if over is not None:
            name, value, limit = over
            raise UserError(
                f"{self.name} {name}={value} is over the limit of {limit} "
                f"({scale:g} x the zoo's largest {name})",
                loc=("model_args", name),
            )

    def sample(self, rng: random.Random) -> dict[str, Any]:
        """One draw from `ranges` (keys without a range keep their default)."""
        return self.hparams({key: rng.choice(choices) for key, choices in self.ranges.items()})


@functools.cache
def zoo_digest() -> str:
    """A digest of the zoo's own source files. A zoo model is decided by its name, its
    hparams and this code (plus the torch and transformers versions the capture cache keys
    on), so the cache need not build it on fake tensors to key it: a warm `predict` of a
    zoo name skipped 3-5 s of building a transformers model it never used."""
    h = hashlib.sha256()
    for f in sorted(Path(__file__).parent.rglob("*.py")):
        h.update(f.name.encode() + f.read_bytes())
    return h.hexdigest()[:16]


def coerce_like(default: Any, raw: Any, what: str = "value") -> Any:
    """`raw` (usually a CLI string) converted to the type of `default`."""
    if not isinstance(raw, str):
        return raw
    text = raw.strip()
    try:
        if isinstance(default, bool):
            if text.lower() in _TRUE:
                return True
            if text.lower() in _FALSE:
                return False
            raise ValueError(text)
        if isinstance(default, int):
            return int(text)
        if isinstance(default, float):
            return float(text)
    except ValueError:
        kind = type(default).__name__
        raise ValueError(f"{what} must be a {kind}, got {raw!r}") from None
    if default is None:  # untyped (e.g. an optional HF config field): best guess
        return _guess(text)
    return text


def _guess(text: str) -> Any:
    lowered = text.lower()
    if lowered in ("none", "null"):
        return None
    if lowered in ("true", "false"):
        return lowered == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


# ---- value checks the factories share; each names the model and the hparam ----------------


def check_int(name: str, hp: Mapping[str, Any], key: str, *, low: int = 1) -> int:
    value = hp[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name}: hparam {key} must be an int, got {value!r}")
    if value < low:
        raise ValueError(f"{name}: hparam {key} must be >= {low}, got {value}")
    return value


def check_float(
    name: str, hp: Mapping[str, Any], key: str, *, low: float = 0.0, high: float = 1.0
) -> float:
    value = hp[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name}: hparam {key} must be a number, got {value!r}")
    if not low <= value <= high:
        raise ValueError(f"{name}: hparam {key} must be in [{low}, {high}], got {value}")
    return float(value)


def check_choice(name: str, hp: Mapping[str, Any], key: str, options: tuple[Any, ...]) -> Any:
    value = hp[key]
    if value not in options:
        raise ValueError(f"{name}: hparam {key} must be one of {options}, got {value!r}")
    return value


def check_bool(name: str, hp: Mapping[str, Any], key: str) -> bool:
    value = hp[key]
    if not isinstance(value, bool):
        raise ValueError(f"{name}: hparam {key} must be a bool, got {value!r}")
    return value


def check_divides(name: str, hp: Mapping[str, Any], small: str, big: str) -> None:
    if hp[big] % hp[small]:
        raise ValueError(f"{name}: hparam {big}={hp[big]} must be divisible by {small}={hp[small]}")


def check_ints(name: str, hp: Mapping[str, Any], *keys: str) -> None:
    for key in keys:
        check_int(name, hp, key)
