"""``PYTORCH_CUDA_ALLOC_CONF`` text <-> :class:`predictor.sim.allocator.AllocatorConfig`.

The syntax is PyTorch's: ``key:value`` pairs separated by commas, e.g.
``expandable_segments:True,max_split_size_mb:128``. Keys that shape the device
allocator are parsed; the pinned-memory keys (which do not) are accepted and ignored;
anything else is an error naming the key.
"""

from __future__ import annotations

from typing import Any

from memgnn.predictor.errors import UserError
from memgnn.predictor.sim.allocator import AllocatorConfig, MiB

__all__ = ["allocator_config", "parse_alloc_conf", "recorded_alloc_conf"]

_NO_EFFECT = {
    "pinned_use_cuda_host_register",
    "pinned_num_register_threads",
    "pinned_use_background_threads",
    "release_lock_on_cudamalloc",
}
_KEYS = (
    "backend",
    "expandable_segments",
    "max_split_size_mb",
    "max_non_split_rounding_mb",
    "garbage_collection_threshold",
    "roundup_power2_divisions",
)


def _bool(key: str, value: str) -> bool:
    if value not in ("True", "False", "true", "false", "1", "0"):
        raise UserError(f"alloc conf {key} must be True or False, got {value!r}")
    return value in ("True", "true", "1")


def _number(key: str, value: str, cast=int) -> Any:
    try:
        return cast(value)
    except ValueError:
        raise UserError(f"alloc conf {key} must be a number, got {value!r}") from None


def parse_alloc_conf(text: str) -> dict[str, Any]:
    """``AllocatorConfig`` keyword arguments for a conf string (``""`` = the defaults)."""
    out: dict[str, Any] = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        key, sep, value = (p.strip() for p in item.partition(":"))
        if not sep or not value:
            raise UserError(f"alloc conf item {item!r} is not key:value")
        if key in _NO_EFFECT:
            continue
        if key not in _KEYS:
            known = ", ".join(_KEYS)
            raise UserError(f"unknown alloc conf key {key!r} (known: {known})")
        if key == "backend":
            if value != "native":
                raise UserError(f"only backend:native is simulated, got backend:{value}")
        elif key == "expandable_segments":
            out["expandable_segments"] = _bool(key, value)
        elif key == "max_split_size_mb":
            out["max_split_size"] = _number(key, value) * MiB
        elif key == "max_non_split_rounding_mb":
            out["max_non_split_rounding"] = _number(key, value) * MiB
        elif key == "garbage_collection_threshold":
            out["garbage_collection_threshold"] = _number(key, value, float)
        elif value.startswith("["):
            raise UserError(
                "roundup_power2_divisions per size interval ([...]) is not simulated; "
                "give one power of two"
            )
        else:
            out["roundup_power2_divisions"] = _number(key, value)
    return out


def allocator_config(
    text: str, *, capacity_bytes: int | None = None, memory_fraction: float | None = None
) -> AllocatorConfig:
    """The simulator's config for ``text``; invalid values raise ValueError naming them.

    ``memory_fraction`` is ``torch.cuda.set_per_process_memory_fraction`` (of
    ``capacity_bytes``); PyTorch's ``garbage_collection_threshold`` acts only with one."""
    return AllocatorConfig(
        capacity_bytes=capacity_bytes, memory_fraction=memory_fraction, **parse_alloc_conf(text)
    )


def recorded_alloc_conf(settings: dict[str, Any] | None) -> str:
    """The conf string of a snapshot's ``allocator_settings`` ("" = defaults / unknown)."""
    if not settings:
        return ""
    if settings.get("PYTORCH_CUDA_ALLOC_CONF"):
        return str(settings["PYTORCH_CUDA_ALLOC_CONF"])
    parts = []
    mss = settings.get("max_split_size", -1)
    if isinstance(mss, int) and 0 < mss < (1 << 62):
        parts.append(f"max_split_size_mb:{mss // MiB}")
    gc = settings.get("garbage_collection_threshold", 0.0) or 0.0
    if gc > 0:
        parts.append(f"garbage_collection_threshold:{gc}")
    if settings.get("expandable_segments"):
        parts.append("expandable_segments:True")
    div = settings.get("roundup_power2_divisions")
    values = set(div.values()) if isinstance(div, dict) else {div or 0}
    values.discard(0)
    if len(values) > 1:
        raise UserError("the recording used per-interval roundup_power2_divisions (not simulated)")
    if values:
        parts.append(f"roundup_power2_divisions:{values.pop()}")
    return ",".join(parts)
