"""What the governor changes on a live model: checkpointed blocks, layer precision, AMP.

- `CheckpointToggles` wraps each repeated block's forward once; `set(n)` checkpoints the
  first n blocks (n < 0: all) from the next step on, with the non-reentrant checkpointing
  a capture with `checkpointing="blocks:N"` records. It also times recomputation (inner
  forwards that run during backward), so the recompute overhead can be measured.
- `OverflowTracker` watches a GradScaler: a scale drop after `update()` is an overflow (the
  optimizer step was skipped). It keeps the rate over a window.
- `ElasticPrecision` moves numerically sensitive layers (norms, softmax, the logits head)
  back to fp32 under autocast: their forward runs with autocast off on fp32 inputs.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

log = logging.getLogger(__name__)

_NORM_TYPES: tuple[type[nn.Module], ...] = (
    nn.LayerNorm,
    nn.GroupNorm,
    nn.modules.batchnorm._BatchNorm,
    nn.Softmax,
    nn.LogSoftmax,
    *((nn.RMSNorm,) if hasattr(nn, "RMSNorm") else ()),
)
_HEAD_NAMES = ("head", "lm_head", "classifier", "out", "logits", "score")


class CheckpointToggles:
    def __init__(self, blocks: list[nn.Module]) -> None:
        self.blocks = blocks
        self.enabled = [False] * len(blocks)
        self.in_backward = False
        self.recompute_seconds = 0.0
        for i, block in enumerate(blocks):
            self._wrap(i, block)

    def _wrap(self, i: int, block: nn.Module) -> None:
        from torch.utils.checkpoint import checkpoint

        inner = block.forward

        def timed(*args: Any, **kwargs: Any) -> Any:
            if not self.in_backward:
                return inner(*args, **kwargs)
            t0 = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.recompute_seconds += time.perf_counter() - t0

        def forward(*args: Any, **kwargs: Any) -> Any:
            if self.enabled[i] and torch.is_grad_enabled():
                return checkpoint(timed, *args, use_reentrant=False, **kwargs)
            return inner(*args, **kwargs)

        block.forward = forward

    @property
    def count(self) -> int:
        return sum(self.enabled)

    def set(self, spec: str) -> None:
        """Apply a TrainSpec checkpointing string: none | full | blocks:N."""
        if spec == "none":
            n = 0
        elif spec == "full":
            n = len(self.blocks)
        else:
            n = min(int(spec.split(":", 1)[1]), len(self.blocks))
        if n and not self.blocks:
            raise ValueError("the model has no repeated blocks to checkpoint")
        self.enabled = [i < n for i in range(len(self.blocks))]

    def take_recompute_seconds(self) -> float:
        out, self.recompute_seconds = self.recompute_seconds, 0.0
        return out


class OverflowTracker:
    """Overflow events of a GradScaler over the last `window` optimizer steps."""

    def __init__(self, window: int = 100) -> None:
        if window < 1:
            raise ValueError("overflow window must be >= 1")
        self.events: deque[bool] = deque(maxlen=window)
        self.total = 0

    def observe(self, scale_before: float, scale_after: float) -> bool:
        overflow = scale_after < scale_before
        self.events.append(overflow)
        self.total += overflow
        return overflow

    @property
    def recent(self) -> int:
        return sum(self.events)

    @property
    def rate(self) -> float:
        return self.recent / len(self.events) if self.events else 0.0


def sensitive_modules(model: nn.Module) -> dict[str, nn.Module]:
    """Norms, softmax modules, and the output head (by name, else the last Linear)."""
    out: dict[str, nn.Module] = {}
    last_linear: tuple[str, nn.Module] | None = None
    for name, m in model.named_modules():
        if isinstance(m, _NORM_TYPES) or "norm" in type(m).__name__.lower():
            out[name] = m
        if isinstance(m, nn.Linear):
            last_linear = (name, m)
    heads = [n for n, m in model.named_modules() if n.split(".")[-1] in _HEAD_NAMES and n]
    if heads:
        top = min(heads, key=lambda n: n.count("."))
        out[top] = dict(model.named_modules())[top]
    elif last_linear is not None:
        out[last_linear[0]] = last_linear[1]
    return {n: m for n, m in out.items() if not any(n.startswith(p + ".") for p in out)}


class ElasticPrecision:
    """Runs chosen modules in fp32 under autocast (see module docstring)."""

    def __init__(self, model: nn.Module, pick: Callable[[nn.Module], dict] | None = None):
        self.model = model
        self.candidates = (pick or sensitive_modules)(model)
        self.promoted: list[str] = []
        self._originals: dict[str, Callable] = {}

    def promote(self) -> list[str]:
        """Move every candidate to fp32; returns the names newly promoted."""
        new = [n for n in self.candidates if n not in self.promoted]
        for name in new:
            module = self.candidates[name]
            inner = module.forward
            self._originals[name] = inner

            def forward(*args: Any, _inner=inner, **kwargs: Any) -> Any:
                device = _device_type(args)
                with torch.autocast(device_type=device, enabled=False):
                    return _inner(*_to_fp32(args), **_to_fp32(kwargs))

            module.forward = forward
        self.promoted.extend(new)
        if new:
            log.info("elastic precision: %d module(s) back to fp32: %s", len(new), new)
        return new

    def demote(self) -> None:
        for name, inner in self._originals.items():
            self.candidates[name].forward = inner
        self._originals.clear()
        self.promoted.clear()


def _device_type(args: Any) -> str:
    for a in args:
        if isinstance(a, torch.Tensor):
            return a.device.type
    return "cpu"


def _to_fp32(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.float() if x.is_floating_point() and x.dtype != torch.float32 else x
    if isinstance(x, dict):
        return {k: _to_fp32(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_to_fp32(v) for v in x)
    return x
