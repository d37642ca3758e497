"""What a framework's config file says, in memgnn's terms: the reading every reader returns.

A reader (`hf`, `torchtune`, `torchtitan`, `axolotl`, `litgpt`) walks a file key by key
with a `Builder`: each key it understands is `read` (its dotted path as the file spells
it, its value, and what it became: `--precision bf16`, `--batch 4`, or "no memory effect:
logging"); a key that changes memory in a way memgnn does not model yet is a warning that
says what the answer assumes instead; a key nobody knows is a warning too. `Builder.result`
refuses to finish while a key of the file is accounted for nowhere, so no key is dropped
silently. Framework defaults the run uses although the file does not state them (TRL's
gradient checkpointing, torchtitan's selective activation checkpointing) are `KeyRead`s
with `default=True`.

`merge_options` lays the command line's explicit flags over a reading's options and says
which flag overrode which key of the file; `spec_options` keeps the options a `TrainSpec`
takes and names the rest.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from memgnn.predictor.spec.train import BY_NAME, TrainSpec

__all__ = [
    "FORMATS",
    "Builder",
    "ConfigReading",
    "KeyRead",
    "flag_text",
    "is_off",
    "merge_options",
    "merge_sizes",
    "size_flag",
    "spec_options",
]

FORMATS = ("hf", "trl", "torchtune", "torchtitan", "axolotl", "litgpt")
# option dest -> its command-line flag, where that is not "--" + dest with dashes
_FLAGS = {"set_to_none": "--zero-grad"}
# options that only mean something with several GPUs (`TrainSpec._check_parallel`)
_PARALLEL = ("sharding", "grad_sync", "hsdp_shard_size", "fsdp_reshard_after_forward")
_SIZE_FLAGS = {"B": "--batch", "S": "--seq"}


@dataclass(kw_only=True, slots=True)
class KeyRead:
    """One key of the file: its dotted path as the file spells it, its value as read, and
    what it became in memgnn's terms (or why nothing). `default`: the file does not state
    the key; the framework's default applies and the run uses it."""

    key: str
    value: Any
    became: str
    default: bool = False


@dataclass(kw_only=True, slots=True)
class ConfigReading:
    """A framework config file read as a memgnn run.

    `options` are memgnn option dests (the `dest` of memgnn/cli/options.py's flags) with values;
    `sources` names, per option, the file's key(s) it came from ("gradient_accumulation_
    steps: 8"), so an override can say what it replaced. `model` is a memgnn model spec
    (`hf:ORG/NAME`) when the file names the model."""

    format: str
    path: str
    model: str | None = None
    model_args: dict[str, str] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    keys: list[KeyRead] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    sources: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise ValueError(f"unknown config format {self.format!r}; expected one of {FORMATS}")

    def key(self, name: str) -> KeyRead:
        """The reading of the file's key `name` (a KeyError names it if there is none)."""
        for k in self.keys:
            if k.key == name:
                return k
        raise KeyError(f"{self.path} has no key {name!r} in its reading")


def flag_text(dest: str, value: Any) -> str:
    """`--grad-accum 8`, `--zero-grad zero`, `--hold-outputs`: the flag a user would give."""
    flag = _FLAGS.get(dest, "--" + dest.replace("_", "-"))
    if dest == "set_to_none":
        return f"{flag} {'none' if value else 'zero'}"
    if dest == "hold_outputs":
        return flag if value else f"(no {flag})"
    if isinstance(value, bool):
        return f"{flag} {'true' if value else 'false'}"
    return f"{flag} {value}"


_OFF = (None, False, "", "none", "no", "false", "disabled", "off")


def is_off(value: Any) -> bool:
    """A switch that is off: false, null, 0, empty, or a word for none."""
    if isinstance(value, str):
        return value.strip().lower() in _OFF
    if isinstance(value, (list, tuple, dict)):
        return not value
    return value is None or value is False or (not isinstance(value, bool) and value == 0)


def _lookup(table: Mapping[str, Any], key: str) -> Any:
    """`table[key]`, else the entry of the longest "prefix.*" that covers `key` (a section
    left empty, `key: null`, is covered by "key.*")."""
    if key in table:
        return table[key]
    parts = key.split(".")
    for n in range(len(parts), 0, -1):
        found = table.get(".".join(parts[:n]) + ".*")
        if found is not None:
            return found
    return None


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def size_flag(symbol: str, value: int) -> str:
    """`--batch 4`, `--seq 2048`, `--dim T=16`."""
    flag = _SIZE_FLAGS.get(symbol)
    return f"{flag} {value}" if flag else f"--dim {symbol}={value}"


class Builder:
    """Collects one file's reading. `flat` is the file as dotted key -> value; `take`
    marks a key as handled; `result` checks that every key of `flat` was handled."""

    def __init__(self, fmt: str, path: str, flat: Mapping[str, Any]) -> None:
        self.reading = ConfigReading(format=fmt, path=path)
        self.flat = dict(flat)
        self._handled: set[str] = set()

    # -- the file's keys ---------------------------------------------------------------
    def has(self, key: str) -> bool:
        return key in self.flat

    def get(self, key: str, default: Any = None) -> Any:
        return self.flat.get(key, default)

    def unhandled(self) -> list[str]:
        return [k for k in self.flat if k not in self._handled]

    def read(self, key: str, became: str, *, value: Any = None) -> None:
        """Record the file's `key` (its value from the file unless given) as `became`."""
        self._handled.add(key)
        shown = self.flat[key] if key in self.flat and value is None else value
        self.reading.keys.append(KeyRead(key=key, value=shown, became=became))

    def given(self, key: str) -> bool:
        """The file has `key` with a value (`key: null` means the framework's default)."""
        return self.flat.get(key) is not None

    def default(self, key: str, value: Any, became: str) -> None:
        """A key the file leaves out (or sets to null) whose framework default the run uses."""
        if key in self.flat:  # `key: null`: the file's key, read as the default
            self.read(key, f"null: {became}", value=None)
            return
        self.reading.keys.append(KeyRead(key=key, value=value, became=became, default=True))

    def warn(self, text: str, *, key: str | None = None) -> None:
        """A warning; with `key`, the file's key is accounted for by it."""
        if key is not None:
            self._handled.add(key)
        if text not in self.reading.warnings:
            self.reading.warnings.append(text)

    def number(self, key: str, kind: type = int, value: Any = None) -> Any:
        """The file's `key` (or `value`) as an int/float; a ValueError names the key."""
        raw = self.flat.get(key) if value is None else value
        parsed = raw
        if isinstance(raw, str):  # a number written as text ("8", "1e-4")
            try:
                parsed = float(raw)
            except ValueError:
                parsed = None
        ok = isinstance(parsed, (int, float)) and not isinstance(parsed, bool)
        if not ok or (kind is int and not float(parsed).is_integer()):
            want = "an integer" if kind is int else "a number"
            raise ValueError(f"{key} must be {want}, got {raw!r}")
        return kind(parsed)

    def no_effect(self, key: str, why: str) -> None:
        self.read(key, f"no memory effect: {why}")

    def feature(self, key: str, what: str, assumes: str) -> None:
        """A memory-relevant switch memgnn does not model: read as off when the file has
        it off, else a warning naming `what` it is and what the answer `assumes`."""
        value = self.flat[key]
        if is_off(value):
            self.read(key, f"off (as the answer assumes): {what}")
        else:
            if not assumes.startswith("the answer"):
                assumes = f"the answer assumes {assumes}"
            self.warn(f"{key}: {_show(value)}: {what} is not modelled yet; {assumes}", key=key)

    def finish(
        self,
        no_effect: Mapping[str, str],
        features: Mapping[str, tuple[str, str]] | None = None,
    ) -> ConfigReading:
        """Account for every key not yet handled by the reader's tables: `no_effect` (key or
        "prefix.*" -> why) and `features` (key or "prefix.*" -> (what it is, what the
        answer assumes));
        anything else is unknown. Returns the reading."""
        features = features or {}
        for key in self.unhandled():
            feature = _lookup(features, key)
            if feature is not None:
                self.feature(key, *feature)
                continue
            why = _lookup(no_effect, key)
            if why is not None:
                self.no_effect(key, why)
            else:
                self.unknown(key)
        return self.result()

    def unknown(self, key: str) -> None:
        self.warn(
            f"unknown key {key}: not read; the answer does not know whether it changes memory",
            key=key,
        )

    # -- what the run becomes ------------------------------------------------------------
    def option(self, dest: str, value: Any, source: str) -> str:
        """Set memgnn option `dest` from the file's `source` ("key: value"); returns the
        flag text for a `became`."""
        if dest not in BY_NAME and dest != "peft_config":
            raise AssertionError(f"reader bug: {dest!r} is no memgnn option")
        self.reading.options[dest] = value
        self.reading.sources[dest] = source
        return flag_text(dest, value)

    def compile_switch(self, key: str, mode: str, what: str, *, static: str = "") -> None:
        """The file's torch.compile switch `key`, which compiles the model or each block
        (`mode`, `what`: how the framework does it): off, or `--compile MODE` where memgnn models
        it with the other options read (`TrainSpec`'s `_check_compile`), else a
        warning that the answer is the eager step's. `static`: why every batch has one
        shape (dynamo's first, static-shape compile is the only one): `--compile-dynamic
        false` with the switch, dropped again where compile is not read."""
        value = self.flat[key]
        if is_off(value):
            self.read(key, "off")
            return
        if static:
            self.option("compile_dynamic", False, static)
        self._compile_switch(key, value, mode, what)
        if static and self.reading.options.get("compile") != mode:  # refused: eager
            self.reading.options.pop("compile_dynamic", None)
            self.reading.sources.pop("compile_dynamic", None)

    def _compile_switch(self, key: str, value: Any, mode: str, what: str) -> None:
        # what --compile is modelled with is said in one place: TrainSpec's _check_compile
        options = {k: v for k, v in self.reading.options.items() if k in BY_NAME}
        if "gpus" not in options:  # the query's: as many as the parallelism read needs
            tp = int(options.get("tp", 1))
            options["gpus"] = tp if options.get("sharding", "none") == "none" else 8 * tp
        refused = f"--compile {mode} with "
        try:
            TrainSpec.of(**(options | {"compile": mode}))
        except ValueError as exc:  # another option's own error is the reading's to report
            if str(exc).startswith(refused):
                self.warn(
                    f"{key}: {_show(value)}: torch.compile with {str(exc)[len(refused) :]}; "
                    "the answer is the eager step's",
                    key=key,
                )
                return
        self.read(key, self.option("compile", mode, f"{key}: {_show(value)}") + f" ({what})")

    def size(self, symbol: str, value: Any, source: str) -> str:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{self.reading.path}: {source}: a size must be an integer >= 1")
        self.reading.sizes[symbol] = value
        self.reading.sources[symbol] = source
        return size_flag(symbol, value)

    def model(self, spec: str, source: str) -> str:
        self.reading.model = spec
        self.reading.sources["model"] = source
        return f"--model {spec}"

    def model_arg(self, name: str, value: str, source: str) -> str:
        self.reading.model_args[name] = value
        self.reading.sources[f"model_arg:{name}"] = source
        return f"--model-arg {name}={value}"

    def result(self) -> ConfigReading:
        left = self.unhandled()
        if left:  # a reader bug, not a user error: every key must be read, warned or unknown
            raise AssertionError(f"reader left keys unaccounted for: {left}")
        return self.reading


def merge_options(
    reading: ConfigReading, explicit: Mapping[str, Any]
) -> tuple[dict[str, Any], list[str]]:
    """The file's options overridden by the flags the user gave explicitly, and a note per
    override ("--grad-accum 4 overrides the file's gradient_accumulation_steps: 8").

    Sharding needs the GPU count, which the launcher (torchrun, accelerate, tune run)
    states, not the file: the file's sharding options are dropped, with a note, unless the
    merged options have `gpus` >= 2."""
    merged = dict(reading.options)
    notes: list[str] = []
    for dest, value in explicit.items():
        if dest in merged and merged[dest] != value:
            source = reading.sources.get(dest, dest)
            notes.append(f"{flag_text(dest, value)} overrides the file's {source}")
        merged[dest] = value
    if merged.get("gpus", 1) < 2:
        dropped = [d for d in _PARALLEL if d in merged and d not in explicit]
        if dropped and merged.get("sharding", "none") != "none":
            notes.append(
                f"the file's {reading.sources.get('sharding', 'sharding')} shards over "
                "several GPUs, but their number is the launcher's, not the file's: give "
                "--gpus N; the answer is one GPU's (no sharding)"
            )
        for d in dropped:
            merged.pop(d)
    return merged, notes


def merge_sizes(
    reading: ConfigReading, explicit: Mapping[str, int]
) -> tuple[dict[str, int], list[str]]:
    """The file's sizes (B, S, ...) overridden by --batch / --seq / --dim, with notes."""
    merged = dict(reading.sizes)
    notes = []
    for symbol, value in explicit.items():
        if symbol in merged and merged[symbol] != value:
            source = reading.sources.get(symbol, symbol)
            notes.append(f"{size_flag(symbol, value)} overrides the file's {source}")
        merged[symbol] = value
    return merged, notes


def spec_options(options: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The options a `TrainSpec` has a field for, and the names of those it has none for.
    (`peft_config`, an adapter's raw config, is one: `AdapterSpec.config` reads it.)"""
    fields = set(BY_NAME)
    kept = {k: v for k, v in options.items() if k in fields}
    return kept, sorted(k for k in options if k not in fields)
