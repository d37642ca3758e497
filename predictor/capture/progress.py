"""How long a capture has run and about how long it has left, on the `predictor.progress`
logger (the CLI shows it on stderr).

`with Progress("capturing gpt2"):` says that the block is still running after `first`
seconds, then every `every` seconds, and when it ends; a block faster than `first` says
nothing. Inside it, the capture's step observer (`StepProgress`) reports at each phase
change an estimate of the seconds its step has left (`report_left`): the seconds per
weighted phase so far (counted from the step's first phase: building the model before it
is not step work), times the weighted phases still to run. The weights (`PHASE_WEIGHTS`,
`FIRST_STEP_WEIGHT`) are what a capture measured; assembling the graph after the step is
not counted, so the estimate is a little short.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from typing import Any

__all__ = ["FIRST_STEP_WEIGHT", "PHASE_WEIGHTS", "Progress", "StepProgress", "report_left"]

_progress = logging.getLogger("predictor.progress")
_current: contextvars.ContextVar[Progress | None] = contextvars.ContextVar(
    "memgnn_progress", default=None
)

# seconds of each phase relative to a forward, and of a path's first step relative to the
# next (fake tensors' dispatch cache is cold in the first), from the phase times of
# capturing hf:HuggingFaceTB/SmolLM2-360M (fp32, blocks mode, steps 0 and 1, 2 loaded
# cores): forward 11.8 s then 5.4 s, backward 12.5 s then 6.1 s, optimizer and zero_grad
# 1.0 s then 0.4 s; a cProfile of hf:meta-llama/Llama-3.2-1B agrees (backward / forward
# 1.25)
PHASE_WEIGHTS = {"forward": 1.0, "backward": 1.15, "optimizer": 0.1}
FIRST_STEP_WEIGHT = 2.2


class Progress:
    """See the module docstring."""

    first = 2.0
    every = 10.0

    def __init__(self, what: str):
        self.what = what
        self._left: tuple[float, float] | None = None  # (seconds left, when reported)
        self._finished = threading.Event()
        self._t0 = 0.0
        self._said = False
        self._token: contextvars.Token | None = None

    def left(self, seconds: float) -> None:
        """The work has about `seconds` left from now."""
        self._left = (max(float(seconds), 0.0), time.perf_counter())

    def message(self, now: float | None = None) -> str:
        now = time.perf_counter() if now is None else now
        text = f"{self.what} ... ({now - self._t0:.0f} s"
        if self._left is not None:
            seconds, at = self._left
            if (remaining := seconds - (now - at)) >= 1:
                text += f", about {remaining:.0f} s left"
        return text + ")"

    def _beat(self) -> None:
        wait = self.first
        while not self._finished.wait(wait):
            self._said = True
            _progress.info("%s", self.message())
            wait = self.every

    def __enter__(self) -> Progress:
        self._t0 = time.perf_counter()
        self._token = _current.set(self)
        threading.Thread(target=self._beat, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._finished.set()
        if self._token is not None:
            _current.reset(self._token)
        if self._said and exc[0] is None:
            _progress.info("%s: done in %.1f s", self.what, time.perf_counter() - self._t0)


def report_left(seconds: float) -> None:
    """Tell the running `Progress` (if any, in this context) the seconds left."""
    progress = _current.get()
    if progress is not None:
        progress.left(seconds)


class StepProgress:
    """A step observer that passes every call on to `inner` and, at each phase change,
    reports the seconds left (`report_left`) of `steps` steps of `micro` micro-steps
    (a forward and a backward each) and an optimizer step each: the seconds per weighted
    phase so far times the weight still to run. Nothing before a forward has finished."""

    def __init__(self, inner: Any, steps: int, micro: int, clock: Any = time.perf_counter):
        self.inner = inner
        self._clock = clock
        w = PHASE_WEIGHTS
        one = micro * (w["forward"] + w["backward"]) + w["optimizer"]
        self._total = one * (FIRST_STEP_WEIGHT + max(steps - 1, 0))
        self._done = 0.0
        self._steps_seen = 0
        self._running: str | None = None
        self._t0: float | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def on_phase(self, phase: str, step: int, micro: int) -> None:
        now = self._clock()
        if self._t0 is None:
            self._t0 = now
        if self._running in PHASE_WEIGHTS:
            scale = FIRST_STEP_WEIGHT if self._steps_seen <= 1 else 1.0
            self._done += PHASE_WEIGHTS[self._running] * scale
            if self._done > 0:
                rate = (now - self._t0) / self._done
                report_left(rate * max(self._total - self._done, 0.0))
        if phase == "input" and micro == 0:
            self._steps_seen += 1
        self._running = phase
        self.inner.on_phase(phase, step, micro)
