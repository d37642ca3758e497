"""Test helpers: a governor on the emulated device from flat keyword settings."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import torch
from memgnn.predictor.memory.analytic import AnalyticModel
from memgnn.predictor.spec.train import TrainSpec
from memgnn.serving.governor import (
    AlertConfig,
    BatchingConfig,
    EmulatedDevice,
    GovernorConfig,
    MemoryGovernor,
    PolicyConfig,
)
from memgnn.serving.governor.demo import tiny_varlen_bundle

MiB = 1 << 20
_NESTED = {"policy": PolicyConfig, "batching": BatchingConfig, "alerts": AlertConfig}


def config(**flat: Any) -> GovernorConfig:
    """GovernorConfig from flat keys: each goes to the nested config that has that field."""
    nested: dict[str, dict[str, Any]] = {name: {} for name in _NESTED}
    top: dict[str, Any] = {}
    for key, value in flat.items():
        owner = next((n for n, c in _NESTED.items() if key in {f.name for f in fields(c)}), None)
        (nested[owner] if owner else top)[key] = value
    return GovernorConfig(**{n: _NESTED[n](**kw) for n, kw in nested.items()}, **top)


def governor(
    cache,
    *,
    capacity_mib: int = 512,
    train: TrainSpec | None = None,
    predictor: Any = None,
    bundle: Any = None,
    scale: int = 64,
    scaler: Any = None,
    **cfg: Any,
) -> MemoryGovernor:
    """The tiny varlen LM (or `bundle`) governed on a capped emulated device, analytic
    predictions, no checkpointing and lengths up to 256 unless told."""
    cfg.setdefault("checkpointing", ["none"])
    cfg.setdefault("max_length", 256)
    torch.manual_seed(0)
    return MemoryGovernor(
        bundle or tiny_varlen_bundle(),
        train or TrainSpec.of(optimizer_impl="foreach"),
        device=EmulatedDevice(capacity_mib * MiB, byte_scale=scale),
        config=config(cache_dir=cache, **cfg),
        predictor=predictor or AnalyticModel(),
        scaler=scaler,
    )
