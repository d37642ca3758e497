"""Memory limits a verdict or a plan is judged against: a budget in bytes, or a threshold.

Two ways to say how much memory a step may use, mutually exclusive:
- `--budget`: bytes (`68GB`, `64GiB`, `8e9`) or a fraction of the device (`85%`, `0.85`),
  read by `parse_budget`;
- `--threshold F`: a fraction 0 < F <= 1 of the device's memory (`device_total_bytes` of
  the device profile, the figure nvidia-smi reports), as a governor or an HF user says
  "stay under 85% of the card".
`resolve_limit` turns either into a `MemoryLimit`; `MemoryLimit.verdict` says whether a
predicted bound fits under it and by how much. With neither, an answer on a GPU is still
judged: against `DEFAULT_THRESHOLD` of the device (`default_limit`, source "default"), the
line a governor keeps to, and against the whole device (`fits_device`).
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass
from typing import Any

from memgnn.predictor.errors import UserError

__all__ = ["DEFAULT_THRESHOLD", "MemoryLimit", "default_limit", "parse_budget", "resolve_limit"]

# The share of a GPU a step may plan to use when the user names no limit: the rest covers
# what no step graph holds (the CUDA context outside nvidia-smi's per-process figure, NCCL
# buffers, fragmentation after long runs). The governor's default threshold too.
DEFAULT_THRESHOLD = 0.85

_UNITS = {
    "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
}  # fmt: skip
_BUDGET_RE = re.compile(r"^([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*(%|[kmgt]i?b|b)?$")


def parse_budget(text: str, device_total: int | None) -> int:
    """A memory budget in bytes from the CLI's text, with explicit semantics:

    - a byte size with a unit: `24GiB`, `8GB`, `512MiB`, `100B`;
    - a whole number of bytes of at least 1024 without a unit: `8000000000`, `8e9`;
    - a fraction of the device's total: a percentage `50%`, or a number with a decimal
      point in (0, 1]: `0.5`, `1.0`.
    A bare small integer (`1`, `2`: one byte or the whole device?) is ambiguous and
    refused, like anything non-finite, non-positive or unreadable (`UserError`)."""
    s = text.strip().lower().replace(" ", "")
    m = _BUDGET_RE.match(s)
    if m is None:
        raise UserError(
            f"cannot read a budget from {text!r}: give bytes with a unit (24GiB, 8GB), "
            "a percentage of the device (50%) or a fraction (0.5)"
        )
    number, unit = m.group(1), m.group(2)
    value = float(number)
    if not math.isfinite(value) or value > 1 << 80:
        raise UserError(f"budget {text!r} is not a finite number of bytes")
    if value <= 0:
        raise UserError(f"budget must be positive, got {text!r}")
    fraction = None
    if unit == "%":
        fraction = value / 100
    elif unit is None and "." in number and "e" not in number:
        fraction = value
    if fraction is not None:
        if fraction > 1:
            raise UserError(f"budget {text!r} is a fraction of the device above 1 (100%)")
        if not device_total:
            raise UserError(f"budget {text!r} is a fraction, but the device has no total")
        return int(device_total * fraction)
    if unit is None and value < 1024:
        raise UserError(
            f"budget {text!r} is ambiguous: write 100% (or 1.0) for the whole device, or "
            f"bytes with a unit ({number}B, {number}GiB)"
        )
    return int(value * _UNITS[unit or "b"])


@dataclass(kw_only=True, slots=True)
class MemoryLimit:
    """What a bound is compared with: `limit_bytes` = `budget_bytes` x `threshold`."""

    budget_bytes: int  # the device's total under --threshold, else the --budget given
    threshold: float = 1.0  # the fraction of `budget_bytes` a bound may reach
    source: str = "budget"  # budget | threshold | default (neither given): what set it

    def __post_init__(self) -> None:
        if self.budget_bytes <= 0:
            raise ValueError(f"budget must be positive, got {self.budget_bytes}")
        if not 0 < self.threshold <= 1:
            raise ValueError(f"threshold must be in (0, 1], got {self.threshold}")
        if self.source not in ("budget", "threshold", "default"):
            raise ValueError(f"unknown limit source {self.source!r}")

    @property
    def limit_bytes(self) -> int:
        return int(self.budget_bytes * self.threshold)

    def verdict(self, bound_bytes: int) -> dict[str, Any]:
        """Whether `bound_bytes` fits under the limit, and the headroom (negative: over);
        for a limit that is a share of the device, also whether it fits the whole device."""
        out = asdict(self) | {
            "limit_bytes": self.limit_bytes,
            "fits": bound_bytes <= self.limit_bytes,
            "headroom_bytes": self.limit_bytes - bound_bytes,
        }
        if self.source != "budget":  # budget_bytes is the device's total
            out["fits_device"] = bound_bytes <= self.budget_bytes
        return out


def default_limit(device_total: int | None) -> MemoryLimit | None:
    """The limit of an answer that names none: `DEFAULT_THRESHOLD` of a GPU's memory."""
    if not device_total:
        return None
    return MemoryLimit(budget_bytes=device_total, threshold=DEFAULT_THRESHOLD, source="default")


def resolve_limit(
    *,
    budget: str | int | None,
    threshold: float | None,
    device_total: int | None,
    device: str = "",
    names: tuple[str, str] = ("--budget", "--threshold"),
    required: bool = False,
) -> MemoryLimit | None:
    """The limit set by exactly one of a budget (text as `parse_budget` reads it, or bytes)
    and a threshold (a fraction of `device_total`); None when neither is given and not
    `required`. `names` are the two options as the caller spells them, for the errors."""
    budget_name, threshold_name = names
    if budget is not None and threshold is not None:
        raise UserError(
            f"{budget_name} and {threshold_name} are mutually exclusive: give the budget "
            f"({budget_name} 68GB) or a fraction of the device's memory ({threshold_name} "
            "0.85), not both"
        )
    if budget is None and threshold is None:
        if required:
            raise UserError(
                f"give {budget_name} (bytes, e.g. 68GB) or {threshold_name} (a fraction of "
                "the device's memory, e.g. 0.85)"
            )
        return None
    if threshold is not None:
        if isinstance(threshold, bool) or not math.isfinite(threshold) or not 0 < threshold <= 1:
            raise UserError(f"{threshold_name} must be a fraction in (0, 1], got {threshold!r}")
        if not device_total:
            raise UserError(
                f"{threshold_name} is a fraction of the device's memory, but device "
                f"{device or '?'!r} has no memory total; give {budget_name} in bytes"
            )
        return MemoryLimit(budget_bytes=device_total, threshold=threshold, source="threshold")
    if isinstance(budget, int) and not isinstance(budget, bool):
        if budget <= 0:
            raise UserError(f"{budget_name} must be positive, got {budget}")
        return MemoryLimit(budget_bytes=budget)
    return MemoryLimit(budget_bytes=parse_budget(str(budget), device_total))
