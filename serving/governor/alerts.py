"""Alerts, per-step records and sinks (mlflow metrics, `/samples` posts) for the governor.

Tiers on memory utilization (peak / device capacity): `log` at 70%, `optimize` at 80% (the
governor re-plans at once and stops growing for a window), `pause` at 90% (the governor
calls the user's pause callback, then shrinks). Other alerts: fragmentation (largest free
cached block / free reserved bytes under 30%), recompute overhead over 35%, AMP overflow
rate over 1%, OOMs and rollbacks. Each alert is logged, kept, and handed to `on_alert`.
An alert kind repeats at most once per `cooldown` steps (tier changes always report).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

log = logging.getLogger(__name__)

__all__ = [
    "TIERS",
    "Alert",
    "AlertBook",
    "AlertConfig",
    "HttpSampleSink",
    "StepRecord",
    "mlflow_sink",
    "tier_of",
]

TIERS = ("ok", "log", "optimize", "pause")
_LEVELS = {"info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


@dataclass(kw_only=True, slots=True)
class AlertConfig:
    """When the governor alerts, and what it does about AMP overflow."""

    tiers: tuple[float, float, float] = (0.70, 0.80, 0.90)  # log | optimize | pause
    fragmentation_warn: float = 0.30
    fragmentation_min_free: float = 0.05  # of capacity: less free cache is not worth a warning
    recompute_warn: float = 0.35
    overflow_window: int = 100
    overflow_alert_rate: float = 0.01
    overflow_sustained: int = 3  # overflows in the window that move sensitive layers to fp32
    elastic_precision: bool = True
    cooldown: int = 50  # an alert kind repeats at most once per this many steps

    def __post_init__(self) -> None:
        t1, t2, t3 = self.tiers
        if not 0 < t1 <= t2 <= t3 <= 1.5:
            raise ValueError(f"tiers must be increasing fractions, got {self.tiers}")
        if not 0 <= self.fragmentation_warn <= 1 or not 0 <= self.fragmentation_min_free <= 1:
            raise ValueError("fragmentation_warn and fragmentation_min_free must be in [0, 1]")
        if self.recompute_warn <= 0:
            raise ValueError("recompute_warn must be > 0")
        if self.overflow_window < 1 or self.overflow_sustained < 1:
            raise ValueError("overflow_window and overflow_sustained must be >= 1")
        if not 0 <= self.overflow_alert_rate <= 1:
            raise ValueError("overflow_alert_rate must be in [0, 1]")
        if self.cooldown < 0:
            raise ValueError("alert cooldown must be >= 0")


@dataclass(kw_only=True, slots=True)
class Alert:
    step: int
    kind: str  # tier | fragmentation | recompute | overflow | oom | precision
    level: str  # info | warning | error
    message: str
    value: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(kw_only=True, slots=True)
class StepRecord:
    """What the governor decided and saw for one optimizer step (all bytes)."""

    step: int
    samples: int
    tokens: int
    sizes: dict[str, int]
    bucket: int | None
    micro_batch: int
    grad_accum: int
    checkpointing: str
    precision: str
    predicted_bytes: int
    bound_bytes: int
    limit_bytes: int
    capacity_bytes: int
    measured_allocated_bytes: int | None = None
    measured_reserved_bytes: int | None = None
    utilization: float = 0.0
    tier: str = "ok"
    correction: float = 1.0
    oom_retries: int = 0
    overflow: bool = False
    loss_scale: float | None = None
    recompute_fraction: float | None = None
    fragmentation: float | None = None
    overhead_ms: float = 0.0  # the governor's own CPU time for this step
    step_ms: float = 0.0
    alerts: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def metrics(self) -> dict[str, float]:
        """The numeric fields, for metric loggers (mlflow and the like)."""
        out: dict[str, float] = {}
        for k, v in self.to_dict().items():
            if isinstance(v, bool):
                out[k] = float(v)
            elif isinstance(v, (int, float)) and k != "step":
                out[k] = float(v)
        out["tier_level"] = float(TIERS.index(self.tier))
        return out


def tier_of(utilization: float, tiers: tuple[float, float, float]) -> str:
    level = sum(utilization >= t for t in tiers)
    return TIERS[level]


class AlertBook:
    """Emits alerts with per-kind cooldown; keeps the last `keep` of them."""

    def __init__(
        self,
        cooldown: int = 50,
        on_alert: Callable[[Alert], None] | None = None,
        keep: int = 1000,
    ) -> None:
        self.cooldown, self.on_alert, self.keep = cooldown, on_alert, keep
        self.alerts: list[Alert] = []
        self._last: dict[str, int] = {}
        self.counts: dict[str, int] = {}

    def emit(self, alert: Alert, *, force: bool = False) -> bool:
        last = self._last.get(alert.kind)
        if not force and last is not None and alert.step - last < self.cooldown:
            return False
        self._last[alert.kind] = alert.step
        self.counts[alert.kind] = self.counts.get(alert.kind, 0) + 1
        self.alerts.append(alert)
        if len(self.alerts) > self.keep:
            del self.alerts[: len(self.alerts) - self.keep]
        log.log(_LEVELS[alert.level], "step %d [%s] %s", alert.step, alert.kind, alert.message)
        if self.on_alert is not None:
            self.on_alert(alert)
        return True


def mlflow_sink(prefix: str = "governor/") -> Callable[[StepRecord], None]:
    """An `on_record` callback that logs each record's metrics to the active mlflow run."""
    import mlflow

    def sink(record: StepRecord) -> None:
        if mlflow.active_run() is None:
            return
        metrics = {f"{prefix}{k}": v for k, v in record.metrics().items()}
        mlflow.log_metrics(metrics, step=record.step)

    return sink


class HttpSampleSink:
    """An `on_sample` callback that sends live samples to a memgnn service (`POST /samples`).

    Uses `serving.client.MemgnnClient` on a background thread, so a slow or absent server
    never stalls a training step: each step graph is uploaded once (`POST /graphs`), then
    every sample is posted with an idempotency key (run id + step). Failures are logged and
    the sample dropped. The governor hands this sink the graph too (`wants_graph`)."""

    wants_graph = True

    def __init__(self, url: str, *, token: str | None = None, timeout: float = 5.0) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"service URL must be http(s), got {url!r}")
        import uuid

        self.url, self.token, self.timeout = url, token, timeout
        self.run = uuid.uuid4().hex[:12]
        self.sent = self.failed = 0
        self._q: queue.Queue[tuple[dict[str, Any], Any] | None] = queue.Queue(maxsize=10_000)
        self._thread = threading.Thread(target=self._run, name="governor-samples", daemon=True)
        self._thread.start()

    def __call__(self, sample: dict[str, Any], graph: Any = None) -> None:
        try:
            self._q.put_nowait((sample, graph))
        except queue.Full:
            self.failed += 1

    def _run(self) -> None:
        from memgnn.serving.client import MemgnnClient

        uploaded: set[str] = set()
        with MemgnnClient(self.url, token=self.token, timeout=self.timeout) as client:
            while (item := self._q.get()) is not None:
                sample, graph = item
                try:
                    gid = sample["graph_id"]
                    if gid not in uploaded and graph is not None:
                        gid = client.upload_graph(graph)
                        uploaded.add(gid)
                    client.add_sample(
                        graph_id=gid,
                        sizes=sample["sizes"],
                        device=sample["device"],
                        metric=sample["metric"],
                        scenario=sample.get("scenario", "worst"),
                        measured_peak_bytes=int(sample["measured_peak_bytes"]),
                        key=f"{self.run}-{sample['step']}",
                    )
                    self.sent += 1
                except Exception as exc:  # noqa: BLE001 - a sink must never break training
                    self.failed += 1
                    log.warning("sending a sample to %s failed: %s", self.url, exc)

    def close(self) -> None:
        """Send what is queued, then stop."""
        self._q.put(None)
        self._thread.join(timeout=self.timeout * 4)
