"""Live corrections that no single writer controls (issue 27).

A writer is a write credential's name (`ServeConfig.writers`; the single `token` is the
writer "token", anonymous writes the writer "anonymous"). A correction is made in two
steps:

1. Each writer's own correction, from its own last `window` samples (`correction_from`:
   ratios measured / predicted clipped to [1/max_scale, max_scale], the log of their
   median shrunk by n / (n + prior); the bound's log is log max(1, max bound ratio)).
   A writer's window is its own, so a flood from one writer cannot push the others'
   samples out.
2. The writers' log-corrections are combined: their median, then clamped to
   +-k x log(`writer_max_scale`), where k counts the writers whose own correction points
   the same way as the median (and never past log(`max_scale`)).

What that guarantees, whatever one writer sends and however often:
- alone, one writer moves an answer by at most `writer_max_scale` (1.25x by default),
  either way; k writers that agree move it by at most `writer_max_scale`**k;
- among others, one writer cannot take the median outside the range of the other
  writers' own corrections: a hostile writer among three honest ones is outvoted.

The same two steps make the bound's scale (>= 1: the bound is never lowered).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence

from memgnn.predictor.answer.types import Correction

DEFAULT_PRIOR = 1.0  # see ServeConfig.correction_prior
DEFAULT_MAX_SCALE = 4.0  # ServeConfig.correction_max_scale
DEFAULT_WRITER_MAX_SCALE = 1.25  # ServeConfig.correction_writer_max_scale
UNKNOWN_WRITER = "unknown"  # samples stored before they named their writer


def writer_log_scales(
    peak_ratios: Sequence[float],
    bound_ratios: Sequence[float],
    *,
    prior: float = DEFAULT_PRIOR,
    max_scale: float = DEFAULT_MAX_SCALE,
) -> tuple[float, float]:
    """One writer's (log peak scale, log bound scale >= 0) from its window of ratios."""
    if not peak_ratios:
        return 0.0, 0.0
    if prior < 0 or max_scale < 1:
        raise ValueError(f"need prior >= 0 and max_scale >= 1, got {prior}, {max_scale}")

    def clip(r: float) -> float:
        return min(max(r, 1.0 / max_scale), max_scale)

    n = len(peak_ratios)
    median = statistics.median(clip(r) for r in peak_ratios)
    peak = n / (n + prior) * math.log(median)
    bound = math.log(max(1.0, max(clip(r) for r in bound_ratios)))
    return peak, bound


def combine(logs: Sequence[float], *, writer_max_scale: float, max_scale: float) -> float:
    """The writers' log-corrections combined (see the module docstring)."""
    if not logs:
        return 0.0
    median = statistics.median(logs)
    if median == 0:
        return 0.0
    agreeing = sum(1 for x in logs if x * median > 0)
    reach = min(agreeing * math.log(writer_max_scale), math.log(max_scale))
    return max(-reach, min(reach, median))


def correction_of_writers(
    windows: Iterable[tuple[Sequence[float], Sequence[float]]],
    *,
    prior: float = DEFAULT_PRIOR,
    max_scale: float = DEFAULT_MAX_SCALE,
    writer_max_scale: float = DEFAULT_WRITER_MAX_SCALE,
) -> Correction:
    """The correction of several writers' windows (peak ratios, bound ratios), one per
    writer, each newest first and at most `window` long."""
    if not 1 <= writer_max_scale <= max_scale:
        raise ValueError(
            f"need 1 <= writer_max_scale <= max_scale, got {writer_max_scale}, {max_scale}"
        )
    peaks, bounds, samples = [], [], 0
    for peak_ratios, bound_ratios in windows:
        if not peak_ratios:
            continue
        peak, bound = writer_log_scales(peak_ratios, bound_ratios, prior=prior, max_scale=max_scale)
        peaks.append(peak)
        bounds.append(bound)
        samples += len(peak_ratios)
    if not samples:
        return Correction()
    peak = combine(peaks, writer_max_scale=writer_max_scale, max_scale=max_scale)
    bound = combine(bounds, writer_max_scale=writer_max_scale, max_scale=max_scale)
    return Correction(
        peak_scale=math.exp(peak),
        bound_scale=max(1.0, math.exp(bound)),
        samples=samples,
        writers=len(peaks),
        writer_max_scale=writer_max_scale,
        max_scale=max_scale,
        capped=abs(peak) < abs(statistics.median(peaks)) - 1e-12
        or abs(bound) < abs(statistics.median(bounds)) - 1e-12,
    )


__all__ = [
    "DEFAULT_MAX_SCALE",
    "DEFAULT_PRIOR",
    "DEFAULT_WRITER_MAX_SCALE",
    "UNKNOWN_WRITER",
    "combine",
    "correction_of_writers",
    "writer_log_scales",
]
