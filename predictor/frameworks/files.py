"""Loading a framework config file safely: JSON, YAML or TOML text, never a pickle.

- YAML through `yaml.SafeLoader` (no Python objects are built), with a duplicated key
  refused: PyYAML would keep the last one silently, and a run's key must not vanish.
- TOML through `tomllib` (Python 3.11+) or `tomli`, JSON through `json`.
- A pickled `training_args.bin` (what `Trainer.save_model` writes next to a checkpoint) is
  refused without being opened as a pickle: unpickling runs arbitrary code. The error says
  how to export the arguments as JSON instead.

Errors are `UserError`s naming the file and, for malformed text, the line.
`flatten` turns nested mappings into dotted keys ("optimizer.lr") for the readers.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import yaml
from memgnn.predictor.errors import UserError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10: the backport (pyproject: tomli on < 3.11)
    import tomli as tomllib

__all__ = ["EXPORT_HINT", "flatten", "load_file", "text_kind"]

EXPORT_HINT = (
    "export the arguments as JSON instead: in the training script, "
    "`open('training_args.json', 'w').write(trainer.args.to_json_string())` "
    "(or `json.dump(args.to_dict(), f)`), then give that file"
)
# the first bytes of a pickle (protocol 2+) and of torch.save's zip container
_PICKLE_MAGIC = (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05", b"PK\x03\x04")
_BINARY_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
_TOML_LINE = re.compile(r"\(at line (\d+), column (\d+)\)")


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a mapping with the same key twice."""


def _unique_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False):
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        line = key_node.start_mark.line + 1
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"key {key!r} appears twice (lines {seen[key]} and {line})",
                key_node.start_mark,
            )
        seen[key] = line
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_mapping)


def text_kind(path: Path) -> str:
    """json | yaml | toml from the file name; yaml for anything else that is text."""
    suffix = path.suffix.lower()
    if suffix == ".json":
        return "json"
    if suffix == ".toml":
        return "toml"
    return "yaml"


def _refuse_pickle(path: Path, head: bytes) -> None:
    if path.suffix.lower() in _BINARY_SUFFIXES or head.startswith(_PICKLE_MAGIC):
        raise UserError(
            f"{path}: a pickled file (like Trainer's training_args.bin) is not read: "
            f"unpickling runs arbitrary code; {EXPORT_HINT}"
        )


def load_file(path: str | Path, kind: str | None = None) -> dict[str, Any]:
    """The top-level mapping of a JSON/YAML/TOML config file (`kind` from the name when
    not given). A UserError names the file for anything unreadable."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"config file not found: {p}")
    raw = p.read_bytes()
    _refuse_pickle(p, raw[:8])
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{p}: not a UTF-8 text file ({exc.reason} at byte {exc.start})") from None
    kind = kind or text_kind(p)
    data = _parse(p, text, kind)
    if not isinstance(data, dict):
        what = "empty" if data is None else f"a {type(data).__name__}"
        raise UserError(f"{p}: the top level must be a mapping of keys to values, got {what}")
    bad = [k for k in data if not isinstance(k, str)]
    if bad:
        raise UserError(f"{p}: keys must be strings, got {bad[0]!r}")
    return data


def _parse(p: Path, text: str, kind: str) -> Any:
    if kind == "json":
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise UserError(
                f"{p}: not valid JSON: line {exc.lineno}, column {exc.colno}: {exc.msg}"
            ) from None
    if kind == "toml":
        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            m = _TOML_LINE.search(str(exc))
            where = f"line {m[1]}, column {m[2]}: " if m else ""
            message = _TOML_LINE.sub("", str(exc)).strip()
            raise UserError(f"{p}: not valid TOML: {where}{message}") from None
    if kind != "yaml":
        raise ValueError(f"unknown file kind {kind!r}; expected json, yaml or toml")
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = exc.problem or exc.context or "malformed"
        raise UserError(f"{p}: not valid YAML: {where}{problem}") from None
    except yaml.YAMLError as exc:
        raise UserError(f"{p}: not valid YAML: {exc}") from None


def flatten(
    data: Mapping[str, Any], *, atomic: Collection[str] = (), prefix: str = ""
) -> dict[str, Any]:
    """Nested mappings as dotted keys: {"optimizer": {"lr": 1}} -> {"optimizer.lr": 1}.
    Keys in `atomic` (dotted) keep their mapping whole; an empty mapping is one key."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping) and value and dotted not in atomic:
            out.update(flatten(value, atomic=atomic, prefix=dotted + "."))
        else:
            out[dotted] = value
    return out
