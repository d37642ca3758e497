"""A run as its framework states it: `--config FILE` (and the HTTP `config` field) read
into the request's model, training spec and sizes.

`RunConfig` is the file as a request carries it: a path on this machine, or its text and
name (what a client sends a service; the name's extension tells JSON, YAML or TOML), an
optional format (detected when None: `predictor.frameworks.read`), and a PEFT
`adapter_config.json` for an HF/TRL file. `apply_run_config` reads it and lays the
caller's explicit choices over it: a flag the user gave overrides the file's key, and the
answer says so (`ConfigReport.overrides`); every key the file has is listed with what it
became (`keys`), and every memory-relevant key memgnn does not model is a warning.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping, Sequence, Set
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from memgnn.predictor.answer.types import ModelRef
from memgnn.predictor.errors import UserError
from memgnn.predictor.frameworks.base import ConfigReading, merge_options, merge_sizes, spec_options
from memgnn.predictor.frameworks.read import read_config
from memgnn.predictor.spec.train import TrainSpec

__all__ = ["MAX_CONFIG_BYTES", "ConfigReport", "RunConfig", "apply_run_config"]

MAX_CONFIG_BYTES = 1 << 20  # a framework config is a few KiB; a MiB is past any real one


@dataclass(kw_only=True, slots=True)
class RunConfig:
    """A framework config file: `path` here, or `text` with its file `name`."""

    path: str | None = None
    text: str | None = None
    name: str = "config.yaml"
    format: str | None = None
    adapter_config: str | None = None  # a path with `path`, the file's text with `text`

    def __post_init__(self) -> None:
        if (self.path is None) == (self.text is None):
            raise UserError("a config is a path or a text, exactly one", loc=("config",))
        if self.text is not None:
            for what, text in (("text", self.text), ("adapter_config", self.adapter_config)):
                if text is not None and len(text.encode()) > MAX_CONFIG_BYTES:
                    raise UserError(f"config {what} over {MAX_CONFIG_BYTES} bytes",
                                    loc=("config", what))  # fmt: skip
            base = Path(self.name).name
            if not base or base in (".", "..") or base != self.name:
                raise UserError(f"config name must be a file name, got {self.name!r}",
                                loc=("config", "name"))  # fmt: skip

    @classmethod
    def from_path(cls, path: str | Path, format: str | None = None,  # noqa: A002
                  adapter_config: str | Path | None = None) -> RunConfig:  # fmt: skip
        return cls(path=str(path), format=format,
                   adapter_config=str(adapter_config) if adapter_config else None)  # fmt: skip

    def as_text(self) -> RunConfig:
        """The same file as text (what a client sends a service): an adapter_config.json
        beside an HF/TRL file travels with it, as `read_config` would find it here."""
        if self.text is not None:
            return self
        p = Path(self.path)
        if not p.is_file():
            raise UserError(f"config file not found: {p}", loc=("config",))
        side = (
            Path(self.adapter_config) if self.adapter_config else p.parent / "adapter_config.json"
        )
        adapter = side.read_text() if side.is_file() and side != p else None
        if self.adapter_config and adapter is None:
            raise UserError(f"adapter config not found: {side}", loc=("config",))
        return RunConfig(text=p.read_text(), name=p.name, format=self.format,
                         adapter_config=adapter)  # fmt: skip

    def read(self) -> ConfigReading:
        if self.path is not None:
            reading = read_config(self.path, self.format, adapter_config=self.adapter_config)
            reading.path = Path(self.path).name  # as a service names it: the same answer
            return reading
        with tempfile.TemporaryDirectory(prefix="memgnn-config-") as tmp:
            file = Path(tmp) / self.name
            file.write_text(self.text)
            side = None
            if self.adapter_config is not None:
                side = Path(tmp) / "adapter_config.json"
                side.write_text(self.adapter_config)
            try:
                reading = read_config(file, self.format, adapter_config=side)
            except UserError as exc:  # name the file as the user knows it, not the temp path
                raise UserError(str(exc).replace(str(file), self.name).replace(tmp + "/", ""),
                                loc=("config",)) from None  # fmt: skip
            reading.path = self.name
            return reading


@dataclass(kw_only=True, slots=True)
class ConfigReport:
    """What an answer took from a config file: each key and what it became, the
    memory-relevant keys not modelled (with what the answer assumes instead), and each
    explicit choice that overrode the file."""

    path: str
    format: str
    model: str | None
    keys: list[dict[str, Any]]
    warnings: list[str]
    overrides: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def apply_run_config(
    rc: RunConfig, *, model: ModelRef | None, train: TrainSpec, explicit: Set[str],
    sizes: Sequence[Mapping[str, int]],
) -> tuple[ModelRef, TrainSpec, list[dict[str, int]], ConfigReport]:  # fmt: skip
    """(model, training spec, each query's sizes, report) of the run the file states, with
    the caller's explicit options (`explicit`: the option names the caller set; their
    values from `train`) and each query's sizes over the file's."""
    reading = rc.read()
    given = {name: value for name, value in train.flat().items() if name in explicit}
    options, overrides = merge_options(reading, given)
    kept, unmodelled = spec_options(options)
    warnings = list(reading.warnings)
    warnings += [f"{name}: read from the file but not a memgnn option yet; the answer "
                 "assumes it away" for name in unmodelled]  # fmt: skip
    try:
        spec = TrainSpec.of(**kept)
    except ValueError as exc:
        raise UserError(f"{reading.path}: {exc}", loc=("config",)) from None
    merged_sizes, size_notes = [], []
    for one in sizes:
        merged, notes = merge_sizes(reading, dict(one))
        merged_sizes.append(merged)
        size_notes += [n for n in notes if n not in size_notes]
    if model is None:
        if reading.model is None:
            raise UserError(f"{reading.path} names no model: give one (--model / model.spec)",
                            loc=("model",))  # fmt: skip
        model = ModelRef(spec=reading.model, args=dict(reading.model_args))
    elif reading.model is not None and reading.model != model.spec:
        overrides.append(f"--model {model.spec} overrides the file's model {reading.model}")
    report = ConfigReport(
        path=reading.path, format=reading.format, model=reading.model,
        keys=[asdict(k) for k in reading.keys], warnings=warnings,
        overrides=overrides + size_notes,
    )  # fmt: skip
    return model, spec, merged_sizes, report
