"""Which path answers a request (`method`: replay | gnn | analytic), and the replay's JIT.

`/predict` and `/plan` take ``method`` (``auto``, ``replay``, ``gnn``, ``analytic``) and
``replay_budget_ms`` like the CLI: ``auto`` replays a graph's schedule through the
compiled allocator (`predictor.answer.exact.ReplayModel`, the simulator's exact bytes)
when its estimated cost fits the budget, and asks the served model otherwise.

The compiled core is numba code: a process's first replay compiles it (50-80 s on a cold
cache). `ReplayWarmup` does that in a background thread at server start, so requests are
served meanwhile. The decision while it warms:

- ``auto`` does not wait: the served model answers (``method`` says ``gnn``) and the
  breakdown's ``replay_skipped`` says why;
- ``replay`` asked for by name waits for the warm-up (up to ``warmup_wait_s``; past it
  the request fails with 503 and says the replay is still compiling): the caller wants
  the exact bytes, not a fast guess.

Without a warm-up (``Route.warmup`` None), ``auto`` counts the JIT's first call in its
estimate (`predictor.answer.exact.decide`), so a cold process answers by the model rather
than blow the budget on a compile. Every answer's ``breakdown["route"]`` says which path
ran and why, with the estimate it was decided on.

`/healthz` reports the warm-up's state (``cold``, ``warming``, ``warm``, ``failed``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from memgnn.predictor.answer.exact import Choice, ExactConfig, ReplayModel, decide
from memgnn.predictor.answer.predict import skipped
from memgnn.predictor.answer.types import GraphEntry
from memgnn.predictor.ir.vocab import METHOD_CHOICES
from memgnn.serving.graphs import RequestError

log = logging.getLogger(__name__)

__all__ = [
    "ReplayWarmup",
    "Route",
    "choose",
    "plan_exact",
    "warm_replay",
]

STATES = ("cold", "warming", "warm", "failed")


def warm_replay() -> None:
    """Compile the replay kernel: one tiny trace through the same entry point the exact
    path uses (`replay_trace_fast`), so its machine code is ready (or loaded from
    numba's on-disk cache) before a request needs it."""
    from memgnn.predictor.sim.allocator import AllocatorConfig
    from memgnn.predictor.sim.replay.trace import replay_trace_fast

    events = [("mark", "forward", 0), ("alloc", 0, 4096), ("alloc", 1, 3 << 20),
              ("free", 0, 0), ("mark", "backward", 1), ("free", 1, 0)]  # fmt: skip
    replay_trace_fast(events, AllocatorConfig(capacity_bytes=1 << 34))


class ReplayWarmup:
    """A background warm-up of the replay JIT (`warm`, default `warm_replay`)."""

    def __init__(self, warm: Callable[[], None] = warm_replay):
        self._warm = warm
        self._done = threading.Event()
        self._lock = threading.Lock()
        self.state = "cold"
        self.seconds: float | None = None
        self.error: str | None = None

    def start(self) -> ReplayWarmup:
        with self._lock:
            if self.state != "cold":
                return self
            self.state = "warming"
        threading.Thread(target=self._run, name="replay-warmup", daemon=True).start()
        return self

    def _run(self) -> None:
        t0 = time.perf_counter()
        try:
            self._warm()
            state, error = "warm", None
        except Exception as exc:  # the server keeps serving by the model; /healthz says so
            log.exception("replay warm-up failed")
            state, error = "failed", f"{type(exc).__name__}: {exc}"
        self.seconds = round(time.perf_counter() - t0, 3)
        self.state, self.error = state, error
        log.info("replay JIT %s after %.1f s", state, self.seconds)
        self._done.set()

    @property
    def warm(self) -> bool:
        return self.state == "warm"

    def wait(self, timeout_s: float) -> bool:
        """Block until warm (True) or failed / past `timeout_s` (False); starts a cold one."""
        self.start()
        self._done.wait(timeout_s)
        return self.warm

    def to_dict(self) -> dict[str, Any]:
        return {"state": self.state, "seconds": self.seconds, "error": self.error}


@dataclass(kw_only=True, slots=True)
class Route:
    """How one request is answered: the method asked for, its budget, the warm-up."""

    method: str = "auto"
    budget_ms: float = 250.0
    warmup: ReplayWarmup | None = None  # None: replay without a warm-up (compiles inline)
    wait_s: float = 300.0

    def __post_init__(self) -> None:
        if self.method not in METHOD_CHOICES:
            raise ValueError(f"unknown method {self.method!r}")
        if not self.budget_ms >= 0:
            raise ValueError(f"replay_budget_ms must be >= 0, got {self.budget_ms}")

    @property
    def exact_config(self) -> ExactConfig:
        return ExactConfig(budget_s=self.budget_ms / 1e3)


def choose(route: Route, entry: GraphEntry) -> Choice:
    """The path for a graph's queries, and why (`skipped` tells an ``auto`` that did not
    replay)."""
    choice = decide(route.method, entry.graph, route.exact_config)
    if route.warmup is None or route.warmup.warm:
        return choice
    warm_fits = choice.cost.replay_seconds <= choice.budget_s  # the JIT is all that is over
    if route.method == "auto" and (choice.method == "replay" or warm_fits):
        why = f"replay JIT {route.warmup.state} (see /healthz): answered by the model"
        return replace(choice, method="gnn", reason=why)
    if choice.method != "replay":
        return choice
    if not route.warmup.wait(route.wait_s):
        raise RequestError(
            f"the exact replay is not ready (JIT {route.warmup.state}"
            f"{': ' + route.warmup.error if route.warmup.error else ''}); retry, or ask "
            "method 'gnn'",
            status=503,
            loc=("body", "method"),
        )
    return choice


def plan_exact(route: Route, entry: GraphEntry, is_gpu: bool) -> tuple[Any, str, str | None]:
    """For `/plan`: (exact model deciding the steps near the limit or None, the method
    that decides them, why the replay was skipped). ``auto`` replays near the limit when
    one replay of `entry`'s graph (a variant of the search) fits the budget and the JIT is
    warm; ``replay`` always (waiting for the JIT); ``gnn`` and ``analytic`` never. A CPU
    target has no allocator to replay (the sweep is its answer)."""
    if route.method in ("gnn", "analytic"):
        return None, route.method, None
    if not is_gpu:
        return None, "gnn", "cpu target: no allocator to replay"
    choice = choose(route, entry)
    exact = ReplayModel(config=route.exact_config) if choice.method == "replay" else None
    return exact, choice.method, skipped(choice)
