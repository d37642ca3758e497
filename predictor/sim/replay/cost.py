"""What one exact replay costs in this process: the JIT's state and a measured per-event rate.

`auto` routing (`predictor.answer.exact.decide`) replays a request only when its cost fits
the budget. Two things the fixed estimate (``overhead_s + seconds_per_event x events``)
does not see:

- the compiled core's JIT. A process's first replay loads numba's machine code from the
  on-disk cache (``cache=True``: 2.19 s) or, with no cache, compiles it (67.59 s), both
  measured by ``benchmarks/replay_speed.py`` (``benchmarks/results/replay_speed.md``, "JIT
  warm-up"). `jit_state` tells which of ``warm`` (compiled in this process), ``cached``
  (machine code on disk for today's source) and ``cold`` (a compile) the next call meets;
- the machine's load. `ReplayCost` keeps a running factor, measured / estimated seconds,
  over the replays this process ran warm (an exponentially weighted mean), so a loaded
  machine's slower replays raise the estimate and a quiet one's lower it. A replay that
  compiled or loaded the JIT is not counted: that time is not per event.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

__all__ = ["JIT_STATES", "REPLAY_COST", "CostEstimate", "ReplayCost", "jit_state"]

JIT_STATES = ("warm", "cached", "cold")


_warm = False


def jit_state() -> str:
    """``warm``: the replay kernel is compiled in this process; ``cached``: numba's
    on-disk cache holds machine code for today's source (a first call loads it);
    ``cold``: a first call compiles it."""
    global _warm
    if _warm:  # compiled code stays loaded: no need to ask numba again (~0.1 ms a call)
        return "warm"
    from memgnn.predictor.sim.replay import core

    kernel = core.run_events
    if kernel.signatures:
        _warm = True
        return "warm"
    try:  # numba has no public call for this: its cache's index, as a first call reads it
        index = kernel._cache._cache_file._load_index()
    except Exception:  # an unreadable or unknown cache layout: assume a compile
        log.debug("numba cache index unreadable", exc_info=True)
        return "cold"
    return "cached" if index else "cold"


@dataclass(frozen=True, slots=True)
class CostEstimate:
    """One replay's estimated seconds, and what it is made of."""

    seconds: float  # replay + JIT
    replay_seconds: float  # the prior estimate x the measured factor
    jit_seconds: float  # 0 when warm
    jit: str
    factor: float  # measured / prior estimate (1.0 before any measured replay)
    samples: int  # warm replays measured in this process

    def to_dict(self) -> dict[str, Any]:
        return {
            "estimated_ms": round(self.seconds * 1e3, 3),
            "replay_ms": round(self.replay_seconds * 1e3, 3),
            "jit_ms": round(self.jit_seconds * 1e3, 3),
            "jit": self.jit,
            "factor": round(self.factor, 4),
            "samples": self.samples,
        }


class ReplayCost:
    """A running measured / estimated factor over this process's warm replays.

    `observe(estimated_s, seconds)` after each warm replay; `factor` starts at 1.0 (the
    prior constants unchanged) and moves by ``weight`` towards each new ratio. Thread-safe:
    the server replays on worker threads."""

    def __init__(self, *, weight: float = 0.3) -> None:
        if not 0 < weight <= 1:
            raise ValueError(f"weight must be in (0, 1], got {weight}")
        self.weight = weight
        self._lock = threading.Lock()
        self.factor = 1.0
        self.samples = 0

    def observe(self, estimated_s: float, seconds: float) -> None:
        """One warm replay took `seconds` where the prior estimated `estimated_s`."""
        if not estimated_s > 0 or not seconds >= 0:
            raise ValueError(f"need estimated_s > 0 and seconds >= 0, got {estimated_s}, {seconds}")
        ratio = seconds / estimated_s
        with self._lock:
            first = self.samples == 0
            self.factor = ratio if first else self.factor + self.weight * (ratio - self.factor)
            self.samples += 1
        log.debug("replay %.2f ms, estimated %.2f ms: factor %.3f", seconds * 1e3,
                  estimated_s * 1e3, self.factor)  # fmt: skip

    def estimate(self, prior_s: float, *, jit: str, jit_load_s: float, jit_compile_s: float
                 ) -> CostEstimate:  # fmt: skip
        """`prior_s` (the fixed-constant estimate) scaled by the measured factor, plus what
        the JIT costs in state `jit`."""
        if jit not in JIT_STATES:
            raise ValueError(f"unknown JIT state {jit!r}; expected one of {JIT_STATES}")
        with self._lock:
            factor, samples = self.factor, self.samples
        extra = {"warm": 0.0, "cached": jit_load_s, "cold": jit_compile_s}[jit]
        replay_s = prior_s * factor
        return CostEstimate(seconds=replay_s + extra, replay_seconds=replay_s, jit_seconds=extra,
                            jit=jit, factor=factor, samples=samples)  # fmt: skip

    def reset(self) -> None:
        with self._lock:
            self.factor, self.samples = 1.0, 0


REPLAY_COST = ReplayCost()  # the process's own: every ReplayModel measures into it
