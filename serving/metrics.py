"""Prometheus text exposition, hand-written (no client library): request counters and
latency histograms per endpoint, plus gauges the app supplies when scraped.

Each uvicorn worker process counts its own requests (as prometheus_client does without
its multiprocess mode); gauges read from the database (samples stored) are global.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterable

BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(pairs: Iterable[tuple[str, str]]) -> str:
    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in pairs)
    return "{" + inner + "}" if inner else ""


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


class _Histogram:
    __slots__ = ("counts", "total", "n")

    def __init__(self) -> None:
        self.counts = [0] * len(BUCKETS)
        self.total = 0.0
        self.n = 0

    def observe(self, seconds: float) -> None:
        i = bisect.bisect_left(BUCKETS, seconds)
        if i < len(BUCKETS):
            self.counts[i] += 1
        self.total += seconds
        self.n += 1


class Metrics:
    """Thread-safe request metrics; `render(gauges)` writes the exposition text."""

    def __init__(self, prefix: str = "memgnn") -> None:
        self.prefix = prefix
        self._lock = threading.Lock()
        self._requests: dict[tuple[str, str, str], int] = {}
        self._latency: dict[tuple[str, str], _Histogram] = {}
        self._counters: dict[str, int] = {}

    def observe(self, endpoint: str, method: str, status: int, seconds: float) -> None:
        with self._lock:
            key = (endpoint, method, str(status))
            self._requests[key] = self._requests.get(key, 0) + 1
            hist = self._latency.get((endpoint, method))
            if hist is None:
                hist = self._latency[(endpoint, method)] = _Histogram()
            hist.observe(seconds)

    def inc(self, name: str, by: int = 1) -> None:
        with self._lock:
            self._counters[name] = self._counters.get(name, 0) + by

    def counter(self, name: str) -> int:
        with self._lock:
            return self._counters.get(name, 0)

    def render(self, gauges: dict[str, tuple[str, float, dict[str, str]]] | None = None) -> str:
        """`gauges`: name -> (help, value, labels)."""
        p = self.prefix
        lines = [
            f"# HELP {p}_http_requests_total HTTP requests by endpoint, method and status.",
            f"# TYPE {p}_http_requests_total counter",
        ]
        with self._lock:
            requests = sorted(self._requests.items())
            latency = sorted((k, list(h.counts), h.total, h.n) for k, h in self._latency.items())
            counters = sorted(self._counters.items())
        for (endpoint, method, status), n in requests:
            labels = _labels([("endpoint", endpoint), ("method", method), ("status", status)])
            lines.append(f"{p}_http_requests_total{labels} {n}")
        name = f"{p}_http_request_duration_seconds"
        lines += [f"# HELP {name} HTTP request latency.", f"# TYPE {name} histogram"]
        for (endpoint, method), counts, total, n in latency:
            base = [("endpoint", endpoint), ("method", method)]
            cumulative = 0
            for le, c in zip(BUCKETS, counts):
                cumulative += c
                lines.append(f"{name}_bucket{_labels([*base, ('le', repr(le))])} {cumulative}")
            lines.append(f"{name}_bucket{_labels([*base, ('le', '+Inf')])} {n}")
            lines.append(f"{name}_sum{_labels(base)} {total:.9f}")
            lines.append(f"{name}_count{_labels(base)} {n}")
        for cname, value in counters:
            lines += [f"# TYPE {p}_{cname} counter", f"{p}_{cname} {value}"]
        for gname, (help_text, value, labels) in sorted((gauges or {}).items()):
            lines += [
                f"# HELP {p}_{gname} {help_text}",
                f"# TYPE {p}_{gname} gauge",
                f"{p}_{gname}{_labels(sorted(labels.items()))} {_number(value)}",
            ]
        return "\n".join(lines) + "\n"
