"""A PEFT method's own config fields as training-spec values (`AdapterSpec.args`).

`--peft-arg k=v` (repeatable) sets one field of the method's peft config class: its
dataclass fields (`LoraConfig.use_rslora`, `PrefixTuningConfig.num_virtual_tokens`, ...),
read from the installed peft, are the names it knows. `v` is read as JSON where it parses
(`20`, `0.1`, `true`, `["q_proj","v_proj"]`, `{"a": 1}`), else taken as a string.

The spec keeps them as one canonical JSON object text: keys sorted, compact separators. A
string is hashable (the capture cache key holds `TrainSpec.flat()`, so it changes with
them) and goes through `flat()`, corpus records and HTTP bodies unchanged; JSON carries the
lists (`target_modules`, `layers_to_transform`) and dicts (`rank_pattern`) a `k=v,k=v` text
could not without a grammar of its own.

`--peft-config FILE` is a saved PEFT config (an adapter_config.json, or the folder that
holds one) read with peft's own loader (`PeftConfig.from_json_file`: JSON, no code, no Hub
download) and built by peft (`PeftConfig.from_peft_type`, which checks it): its
`peft_type` picks the method, and the fields it sets away from the config class's defaults
become args. Dropped: bookkeeping (`base_model_name_or_path`: see `saved_base_model`,
`revision`, `peft_version`, `auto_mapping`) and `inference_mode` (a saved adapter says
true, which would freeze it: memgnn predicts training).

peft is imported only where a field must be checked against its config classes.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import os
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Any

from memgnn.predictor.spec.choices import PEFT_PROMPTS

__all__ = [
    "args_dict",
    "args_text",
    "check_args",
    "config_class",
    "known_fields",
    "lora_option_field",
    "parse_pairs",
    "peft_type",
    "read_saved_config",
    "saved_base_model",
]

CONFIG_NAME = "adapter_config.json"  # peft.utils.CONFIG_NAME
# PeftConfig fields that are no training setting: not args (a saved config's are dropped)
_BOOKKEEPING = ("base_model_name_or_path", "revision", "peft_version", "auto_mapping")
_NOT_ARGS = (*_BOOKKEEPING, "peft_type", "inference_mode", "runtime_config")
# the --lora-* options (AdapterSpec fields) and the config fields each may map onto, in
# order of preference ("{m}": the method's name: vera_dropout, randlora_alpha, ...)
_LORA_FIELDS = {
    "r": ("r",),
    "alpha": ("lora_alpha", "alpha", "{m}_alpha"),
    "dropout": ("lora_dropout", "{m}_dropout"),
    "targets": ("target_modules",),
}


def peft_type(method: str) -> str:
    """peft's `PeftType` value of a memgnn method name (`dora` is LoRA with use_dora)."""
    return "LORA" if method == "dora" else method.upper()


def _import_peft() -> Any:
    try:
        import peft  # heavy optional dependency (memgnn[peft]): imported where needed
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ValueError("--peft needs the peft library: install memgnn[peft]") from exc
    return peft


def config_class(method: str) -> type:
    """The peft config class of `method` (`LoraConfig` for lora and dora)."""
    _import_peft()
    from peft.mapping import PEFT_TYPE_TO_CONFIG_MAPPING

    for kind, cls in PEFT_TYPE_TO_CONFIG_MAPPING.items():
        if kind.value == peft_type(method):
            return cls
    raise ValueError(f"--peft {method}: the installed peft has no {peft_type(method)} method")


def known_fields(method: str) -> tuple[str, ...]:
    """The config fields `--peft-arg` may set for `method` (its dataclass fields)."""
    return tuple(
        f.name for f in dataclasses.fields(config_class(method)) if f.name not in _NOT_ARGS
    )


def lora_option_field(method: str, option: str) -> str | None:
    """The config field of `method` a --lora-* option (`r`, `alpha`, `dropout`,
    `targets`) sets, or None where the method has none."""
    if method in ("lora", "dora"):
        return _LORA_FIELDS[option][0]
    fields = set(known_fields(method))
    for name in _LORA_FIELDS[option]:
        name = name.format(m=method)
        if name in fields:
            return name
    return None


def _json_value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def parse_pairs(pairs: Iterable[str]) -> dict[str, Any]:
    """`["num_virtual_tokens=20", "target_modules=[\"q_proj\"]"]` -> a dict; the value is
    JSON where it parses, else the string."""
    out: dict[str, Any] = {}
    for pair in pairs:
        if not isinstance(pair, str) or "=" not in pair:
            raise ValueError(f"--peft-arg takes NAME=VALUE, got {pair!r}")
        name, value = (s.strip() for s in pair.split("=", 1))
        if not name.isidentifier():
            raise ValueError(f"--peft-arg {pair!r}: {name!r} is no config field name")
        if name in out:
            raise ValueError(f"--peft-arg {name} given twice")
        out[name] = _json_value(value)
    return out


def _check_json(value: Any, where: str) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"--peft-arg {where}: {value} is not a finite number")
    if isinstance(value, Mapping):
        for k, v in value.items():
            if not isinstance(k, str):
                raise ValueError(f"--peft-arg {where}: keys must be strings, got {k!r}")
            _check_json(v, where)
    elif isinstance(value, list | tuple):
        for v in value:
            _check_json(v, where)
    elif not (value is None or isinstance(value, bool | int | float | str)):
        raise ValueError(f"--peft-arg {where}: {type(value).__name__} is no JSON value")


def args_text(value: Any) -> str:
    """The canonical form of args: "" (none) or a compact JSON object with sorted keys.
    Takes that text, a mapping, or `k=v` pairs (a list, or one `k=v` string)."""
    if value is None or value == "":
        return ""
    if isinstance(value, str):
        text = value.strip()
        if not text.startswith("{"):
            value = parse_pairs([text])
        else:
            try:
                value = json.loads(text)
            except ValueError as exc:
                raise ValueError(f"--peft-arg: bad JSON object {text[:80]!r}: {exc}") from exc
    elif isinstance(value, list | tuple):
        value = parse_pairs(value)
    if not isinstance(value, Mapping):
        raise ValueError(f"peft args are a JSON object or NAME=VALUE pairs, got {value!r}")
    for name, v in value.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"--peft-arg: {name!r} is no config field name")
        _check_json(v, name)
    if not value:
        return ""
    return json.dumps(dict(value), sort_keys=True, separators=(",", ":"))


def args_dict(text: str) -> dict[str, Any]:
    """The args of a canonical text (`args_text`)."""
    return json.loads(text) if text else {}


def check_args(method: str, args: Mapping[str, Any], typed: Iterable[str] = ()) -> None:
    """Unknown field names are refused naming the known ones, the `typed` ones (what a
    user gave as --peft-arg) must have their default's type; then peft builds the config
    (its own checks: a ValueError naming the method)."""
    known = known_fields(method)
    unknown = sorted(set(args) - set(known))
    if unknown:
        raise ValueError(
            f"--peft-arg {', '.join(unknown)}: {config_class(method).__name__} has no such "
            f"field; its fields: {', '.join(known)}"
        )
    hints = typing.get_type_hints(config_class(method))
    for name in typed:
        _check_type(name, args[name], hints.get(name))
    kwargs = dict(args) | ({"use_dora": True} if method == "dora" else {})
    if method in PEFT_PROMPTS:  # checked as for a causal LM; the model's task is set later
        kwargs.setdefault("task_type", "CAUSAL_LM")
    try:
        config_class(method)(**kwargs)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"--peft {method} --peft-arg: {exc}") from exc


_SIMPLE = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}


def _check_type(name: str, value: Any, hint: Any) -> None:
    """A value of the field's annotated type where that is bool, int, float or str, or
    Optional of one (peft's dataclasses do not check them; other types are left to peft)."""
    options = (
        typing.get_args(hint)
        if typing.get_origin(hint) in (typing.Union, types.UnionType)
        else (hint,)
    )
    simple = [t for t in options if t is not type(None)]
    if len(simple) != 1 or simple[0] not in _SIMPLE:
        return
    kind = simple[0]
    if value is None and type(None) in options:
        return
    if kind is bool:
        ok = isinstance(value, bool)
    elif kind is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    else:
        ok = isinstance(value, kind) and not isinstance(value, bool)
    if not ok:
        raise ValueError(f"--peft-arg {name}={json.dumps(value)}: expected {_SIMPLE[kind]}")


def _config_file(path: str) -> str:
    if os.path.isdir(path):
        path = os.path.join(path, CONFIG_NAME)
    if not os.path.isfile(path):
        raise ValueError(f"--peft-config {path}: no such file (an {CONFIG_NAME} or its folder)")
    return path


def _plain(value: Any) -> Any:
    """A config field's value as JSON data (sets sorted into lists, enums by value)."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, set | frozenset):
        return sorted(_plain(v) for v in value)
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _plain(dataclasses.asdict(value))
    return value


def read_saved_config(source: str | Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """(method, args) of a saved PEFT config: a path (the file or its folder) or its
    loaded JSON mapping. The fields equal to the class's defaults are left out."""
    peft = _import_peft()
    if isinstance(source, str):
        path = _config_file(source)
        try:
            raw = peft.PeftConfig.from_json_file(path)
        except (OSError, ValueError) as exc:
            raise ValueError(f"--peft-config {source}: not a JSON file: {exc}") from exc
    else:
        raw = dict(source)
    where = f"--peft-config {source}" if isinstance(source, str) else "a saved PEFT config"
    if not isinstance(raw, Mapping) or "peft_type" not in raw:
        raise ValueError(f"{where}: no peft_type (is it an {CONFIG_NAME}?)")
    kind = str(raw["peft_type"]).upper()
    from peft.mapping import PEFT_TYPE_TO_CONFIG_MAPPING

    if kind not in {k.value for k in PEFT_TYPE_TO_CONFIG_MAPPING}:
        raise ValueError(f"{where}: peft_type {raw['peft_type']!r} is no method of peft")
    kwargs = {k: v for k, v in raw.items() if k not in ("runtime_config",)}
    try:
        config = peft.PeftConfig.from_peft_type(**kwargs)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: peft cannot build it: {exc}") from exc
    method = "dora" if kind == "LORA" and getattr(config, "use_dora", False) else kind.lower()
    args = {}
    for f in dataclasses.fields(config):
        value = _plain(getattr(config, f.name))
        if f.name in _NOT_ARGS or value == _plain(_field_default(f)):
            continue
        if method == "dora" and f.name == "use_dora":
            continue
        args[f.name] = value
    return method, args


def _field_default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def saved_base_model(path: str) -> str | None:
    """The `base_model_name_or_path` a saved PEFT config names (the model the adapter was
    trained on), or None: what a front end may use when no model is given."""
    try:
        with open(_config_file(path)) as f:
            raw = json.load(f)
    except (OSError, ValueError):
        return None
    name = raw.get("base_model_name_or_path") if isinstance(raw, dict) else None
    return name if isinstance(name, str) and name else None
