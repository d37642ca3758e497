"""Options: each training-spec field declared once, with what the front ends need of it.

A spec group is a `@dataclass(kw_only=True, slots=True)` whose fields are made by `opt`:
the default, the flat option name (the CLI flag's dest, the key of a record or a flat JSON
body), the help text, and the allowed values (`choices`, bounds, a pattern). The command
line (`memgnn.cli.options`), the HTTP schema (`serving.schemas`) and the benchmark rows are
built from `Option`s, so adding a field is one `opt(...)` plus its semantics.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Option", "append_items", "group_options", "opt"]

_KEY = "memgnn.option"
CLI_KINDS = ("value", "switch", "bool", "append", "none")


@dataclass(frozen=True, slots=True)
class Option:
    """One leaf of a spec: where it lives (`group`.`field`) and how it is spelled outside.

    `name` is the flat option name (unique across the spec); `flag` the command-line flag
    (`--lora-r`); `cli` how the flag takes its value: ``value`` (`--lora-r 16`), ``switch``
    (present = True), ``bool`` (`true|false`), ``append`` (repeatable `--peft-arg k=v`:
    the option holds a JSON object text, each flag one item, see `append_items`), ``none``
    (no flag: JSON only);
    `cli_values` maps the flag's words to values where they differ (`--zero-grad none|zero`
    -> set_to_none True|False). `lo`/`hi` bound numbers (`hi_open`: strictly below),
    `max_length` strings, `pattern` is a regular expression a string must match (checked
    by the HTTP schema; the spec's own `__post_init__` says what is wrong)."""

    name: str
    group: str
    field: str
    default: Any
    type: type
    help: str
    choices: tuple[Any, ...] | None = None
    flag: str = ""
    cli: str = "value"
    cli_values: dict[str, Any] | None = None
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    max_length: int | None = None
    pattern: str | None = None

    def __post_init__(self) -> None:
        if self.cli not in CLI_KINDS:
            raise ValueError(f"option {self.name}: cli must be one of {CLI_KINDS}")
        if self.cli != "none" and not self.flag.startswith("--"):
            raise ValueError(f"option {self.name}: a flag starts with --, got {self.flag!r}")

    @property
    def dest(self) -> str:
        """The argparse dest of the flag (`--zero-grad` -> zero_grad)."""
        return self.flag[2:].replace("-", "_") if self.flag else self.name


def opt(default: Any, *, name: str, help: str, type: type | None = None, **meta: Any) -> Any:
    """A spec field: `default` and its `Option` metadata (group and field filled in by
    `group_options`). `flag` defaults to the name's dashes (`lora_r` -> `--lora-r`)."""
    meta.setdefault("flag", "--" + name.replace("_", "-") if meta.get("cli") != "none" else "")
    info = {"name": name, "help": help, "type": type or builtin_type(default), **meta}
    return field(default=default, metadata={_KEY: info})


def builtin_type(value: Any) -> type:
    for t in (bool, int, float, str):
        if isinstance(value, t):
            return t
    raise TypeError(f"an option's default must be bool, int, float or str, got {value!r}")


def group_options(group_name: str, cls: type) -> Iterator[Option]:
    """The `Option`s of a spec group's fields, in declaration order."""
    for f in dataclasses.fields(cls):
        info = f.metadata.get(_KEY)
        assert info is not None, f"{cls.__name__}.{f.name} is not declared with opt()"
        yield Option(group=group_name, field=f.name, default=f.default, **info)


def append_items(value: str) -> list[str]:
    """An ``append`` option's JSON object text as the `NAME=VALUE` words of its repeated
    flag (VALUE as JSON): the inverse of parsing them (`peft_args.parse_pairs`)."""
    items = json.loads(value) if value else {}
    return [f"{k}={json.dumps(v, separators=(',', ':'))}" for k, v in items.items()]
