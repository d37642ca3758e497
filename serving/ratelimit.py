"""Bounds on anonymous expensive work: a per-client token bucket and a server-wide slot count.

`POST /snapshots/replay` stores nothing, so it needs no token (a user debugging an OOM
should not need write rights), but each call unpickles and replays a file of up to the
body limit: seconds of CPU and hundreds of MB. Without a bound, one client could keep every
worker busy. So each client (its writer name when it presents a valid token, else its
address) gets `rate_per_min` calls a minute with bursts of `burst`, and at most `slots`
replays run at once across clients; past either the answer is 429 with `Retry-After`
(seconds), at once, never queued.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

__all__ = ["Limited", "RateLimit", "RateLimiter"]


class Limited(Exception):
    """Over a limit: `retry_after_s` until a call would be taken; `what` says which."""

    def __init__(self, what: str, retry_after_s: float):
        super().__init__(what)
        self.what = what
        self.retry_after_s = retry_after_s


@dataclass(kw_only=True, slots=True)
class RateLimit:
    """Calls a minute per client (`rate_per_min`, with bursts of `burst`) and at once
    across clients (`slots`)."""

    rate_per_min: float = 30.0
    burst: int = 8
    slots: int = 1

    def __post_init__(self) -> None:
        if not (isinstance(self.rate_per_min, int | float) and self.rate_per_min > 0):
            raise ValueError(f"rate_per_min must be > 0, got {self.rate_per_min!r}")
        if not math.isfinite(self.rate_per_min):
            raise ValueError(f"rate_per_min must be finite, got {self.rate_per_min!r}")
        for name in ("burst", "slots"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")


class RateLimiter:
    """`RateLimit` enforced: `with limiter.take(client): ...` or `Limited`. Thread-safe.
    At most `max_clients` buckets are kept (the fullest are dropped first: a full bucket
    is the same as none)."""

    def __init__(
        self, limit: RateLimit, *, clock: Callable[[], float] = time.monotonic,
        max_clients: int = 10_000,
    ) -> None:  # fmt: skip
        self.limit = limit
        self._clock = clock
        self._max_clients = max_clients
        self._buckets: dict[str, tuple[float, float]] = {}  # client -> (tokens, at)
        self._busy = 0
        self._lock = threading.Lock()

    def _tokens(self, client: str, now: float) -> float:
        tokens, at = self._buckets.get(client, (float(self.limit.burst), now))
        return min(float(self.limit.burst), tokens + (now - at) * self.limit.rate_per_min / 60)

    def acquire(self, client: str) -> None:
        """Take one call for `client` and one slot, or raise `Limited` (nothing taken);
        `release()` gives the slot back."""
        with self._lock:
            now = self._clock()
            tokens = self._tokens(client, now)
            if tokens < 1:
                wait = (1 - tokens) * 60 / self.limit.rate_per_min
                raise Limited(
                    f"more than {self.limit.rate_per_min:g} calls a minute from {client}", wait
                )
            if self._busy >= self.limit.slots:
                raise Limited(f"{self._busy} replays already running (the server's limit)", 1.0)
            self._buckets[client] = (tokens - 1, now)
            if len(self._buckets) > self._max_clients:
                fullest = max(self._buckets, key=lambda c: self._tokens(c, now))
                del self._buckets[fullest]
            self._busy += 1

    def release(self) -> None:
        with self._lock:
            assert self._busy > 0, "release without acquire"
            self._busy -= 1

    @contextmanager
    def take(self, client: str) -> Iterator[None]:
        self.acquire(client)
        try:
            yield
        finally:
            self.release()
