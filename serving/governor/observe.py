"""After each governed step: measure, correct, alert, record.

Every `sample_every` steps the device's peak since the last sample (`max_memory_reserved`
for a `reserved` prediction, else `max_memory_allocated`; the emulated device and the CPU
tracker answer the same calls) is compared with the raw prediction for the shapes that ran:
the residual corrector learns the ratio, and the sample goes to `on_sample` (e.g. a
`/samples` poster). Utilization tiers, fragmentation, recompute overhead and AMP overflow
raise alerts; sustained overflow moves sensitive layers to fp32 when the budget allows.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any

import torch
from memgnn.predictor.ir.graph import StepGraph
from memgnn.serving.governor.alerts import Alert, AlertBook, StepRecord, tier_of
from memgnn.serving.governor.config import GovernorConfig
from memgnn.serving.governor.correction import GovernedPredictor
from memgnn.serving.governor.devices import GovernedDevice
from memgnn.serving.governor.policy import Decision, Policy
from memgnn.serving.governor.runtime import CheckpointToggles, ElasticPrecision, OverflowTracker

log = logging.getLogger(__name__)

__all__ = ["Observer"]

_HALF = ("float16", "bfloat16")
TOTALS = ("steps", "samples", "tokens", "ooms", "rollbacks", "ooms_avoided", "defragmentations")


class Observer:
    """Owns what a run has seen: the step count, the totals, the records, the peak-period
    state of the live samples. The governor reads them; only `count` and `after_step`
    change them."""

    def __init__(
        self,
        config: GovernorConfig,
        *,
        device: GovernedDevice,
        predictor: GovernedPredictor,
        policy: Policy,
        alerts: AlertBook,
        toggles: CheckpointToggles,
        elastic: ElasticPrecision,
        overflow: OverflowTracker,
        base_graph: StepGraph,
    ) -> None:
        self.config, self.device, self.predictor, self.policy = config, device, predictor, policy
        self.alerts, self.toggles, self.elastic = alerts, toggles, elastic
        self.overflow_tracker, self.base_graph = overflow, base_graph
        self.capacity = int(device.capacity_bytes)
        self.step_count = 0
        self.totals: dict[str, float] = {k: 0 for k in TOTALS}
        self.totals["overhead_ms"] = 0.0
        self.records: deque[StepRecord] = deque(maxlen=config.keep_records)
        self.tier = "ok"
        self._period_pred = 0  # largest raw prediction since the last sample
        self._samples = 0
        self._calibrated = False  # the scaler had a step without overflow
        self._graph_ids: dict[int, str] = {}
        self._reserved_at_reset = 0
        self._scaler: Any = None

    def count(self, total: str, n: int = 1) -> None:
        self.totals[total] += n

    def reset_peak(self) -> None:
        """Start a measurement period: the device's peaks from now on."""
        self.device.reset_peak_memory_stats()
        self._reserved_at_reset = self.device.memory_reserved()
        self._period_pred = 0

    def after_step(
        self,
        batch: Any,
        sizes: dict[str, int],
        bucket: int | None,
        dec: Decision,
        *,
        retries: int,
        run_s: float,
        overhead_s: float,
        overflow: bool = False,
        scaler: Any = None,
        count_avoided: bool = True,
    ) -> StepRecord:
        """Record one finished optimizer step. `overflow`: the scaler skipped it;
        `count_avoided`: the batch is the user's (not formed by the governor)."""
        t0 = time.thread_time()
        cfg, pred = self.config, self.predictor
        self._scaler = scaler
        self.step_count += 1
        step = self.step_count
        n = sizes["B"]
        micro = -(-n // dec.grad_accum)
        actual = {**self.policy.cfg.sizes, **{k: v for k, v in sizes.items() if k != "B"}}
        actual["B"] = micro
        graph = self.policy.graph(dec.checkpointing, dec.precision, dec.grad_accum)
        raw_peak = pred.raw_peak_near(graph, actual, "steady" if pred.steady else "first")[0]
        self._period_pred = max(self._period_pred, raw_peak)
        record = StepRecord(
            step=step,
            samples=n,
            tokens=_tokens(batch, n, sizes),
            sizes=dict(sizes),
            bucket=bucket,
            micro_batch=micro,
            grad_accum=dec.grad_accum,
            checkpointing=dec.checkpointing,
            precision=dec.precision,
            predicted_bytes=pred.predicted(graph, actual, near=True),
            bound_bytes=pred.bound(graph, actual, near=True),
            limit_bytes=self.policy.limit,
            capacity_bytes=self.capacity,
            oom_retries=retries,
            overflow=overflow,
            loss_scale=float(scaler.get_scale()) if scaler is not None else None,
            step_ms=run_s * 1e3,
        )
        if step % cfg.sample_every == 0:
            self._sample(record, graph, actual)
        else:
            record.utilization = record.predicted_bytes / self.capacity
        record.correction = pred.corrector.factor
        self._tiers(record, bucket)
        self._recompute(record, run_s)
        self._amp(record, graph, actual)
        base = self.policy.base
        changed = (dec.grad_accum, dec.checkpointing, dec.precision) != (
            1,
            base.activations.checkpointing,
            base.numerics.precision,
        )
        if retries == 0 and changed and count_avoided:
            self._count_avoided(n, sizes)
        pred.steady = True  # the first step (optimizer state creation) is behind us
        self.totals["steps"] += 1
        self.totals["samples"] += n
        self.totals["tokens"] += record.tokens
        record.overhead_ms = (overhead_s + time.thread_time() - t0) * 1e3  # CPU time
        self.totals["overhead_ms"] += record.overhead_ms
        self.records.append(record)
        if cfg.on_record is not None:
            cfg.on_record(record)
        return record

    def summary(self) -> dict[str, Any]:
        states = sorted(self.policy.states.items(), key=lambda kv: kv[0] or 0)
        return {
            **self.totals,
            "overhead_ms_per_step": self.totals["overhead_ms"] / max(self.totals["steps"], 1),
            "correction": self.predictor.corrector.state(),
            "plans": {
                str(k): {
                    "micro_batch": st.micro,
                    "checkpointing": st.checkpointing,
                    "precision": st.precision,
                    "ceiling": st.ceiling,
                }
                for k, st in states
            },  # fmt: skip
            "alerts": dict(self.alerts.counts),
            "promoted_to_fp32": list(self.elastic.promoted),
            "capacity_bytes": self.capacity,
            "limit_bytes": self.policy.limit,
            "predictions_cached": self.predictor.cache_size(),
            "model_calls": self.predictor.model_calls,
        }

    # ---- live samples --------------------------------------------------------------------
    def _sample(self, record: StepRecord, graph: StepGraph, actual: dict[str, int]) -> None:
        cfg, dev = self.config, self.device
        alloc, reserved = dev.max_memory_allocated(), dev.max_memory_reserved()
        metric = self.predictor.metric_name
        measured = reserved if metric == "reserved" else alloc
        predicted = self._period_pred
        # A step that reserved nothing new ran inside the cache: its reserved peak is only an
        # upper bound of what it needed (censored), informative only when under the prediction.
        censored = metric == "reserved" and reserved <= self._reserved_at_reset
        if not censored or measured < predicted:
            self.predictor.corrector.update(predicted, measured)
        record.measured_allocated_bytes, record.measured_reserved_bytes = alloc, reserved
        record.utilization = measured / self.capacity
        self._samples += 1
        if self._samples % cfg.fragmentation_every == 0:
            self._fragmentation(record)
        if cfg.on_sample is not None:
            payload = self._sample_payload(graph, actual, predicted, measured, alloc, reserved)
            if getattr(cfg.on_sample, "wants_graph", False):
                cfg.on_sample(payload, graph)
            else:
                cfg.on_sample(payload)
        self.reset_peak()

    def _sample_payload(self, graph, actual, predicted, measured, alloc, reserved) -> dict:
        gid = self._graph_ids.get(id(graph))
        if gid is None:
            gid = self._graph_ids[id(graph)] = graph.graph_id
        return {
            "graph_id": gid,
            "model": graph.model.get("name"),
            "train": graph.train,
            "device": self.device.profile,
            "capacity_bytes": self.capacity,
            "sizes": dict(actual),
            "metric": self.predictor.metric_name,
            "scenario": self.config.scenario,
            "predicted_peak_bytes": int(predicted),
            "measured_peak_bytes": int(measured),
            "measured_allocated_bytes": int(alloc),
            "measured_reserved_bytes": int(reserved),
            "model_version": self.predictor.version,
            "step": self.step_count,
        }

    def _fragmentation(self, record: StepRecord) -> None:
        cfg, alerts = self.config, self.config.alerts
        stats = self.device.memory_stats()
        free = stats.get("free_reserved_bytes", 0)
        frac = stats.get("fragmentation", 1.0)
        record.fragmentation = frac
        if free >= alerts.fragmentation_min_free * self.capacity and (
            frac < alerts.fragmentation_warn
        ):
            msg = (
                f"fragmentation: largest free block is {frac:.0%} of {free} free reserved "
                f"bytes (< {alerts.fragmentation_warn:.0%})"
            )
            if cfg.defragment:
                self.device.empty_cache()  # whole free segments back to the device
                msg += "; released the cached free segments"
            self._alert(record, "fragmentation", "warning", msg, frac)

    # ---- alerts ------------------------------------------------------------------------
    def _alert(
        self, record: StepRecord, kind: str, level: str, msg: str, value=None, *, force=False
    ):
        alert = Alert(step=record.step, kind=kind, level=level, message=msg, value=value)
        if self.alerts.emit(alert, force=force):
            record.alerts.append(f"{kind}: {msg}")

    def _tiers(self, record: StepRecord, bucket: int | None) -> None:
        cfg, policy = self.config, self.policy
        tier = record.tier = tier_of(record.utilization, cfg.alerts.tiers)
        changed, self.tier = tier != self.tier, tier
        if tier == "ok":
            return
        util = f"memory at {record.utilization:.0%} of {self.capacity} bytes"
        if tier == "log":
            if changed:
                self._alert(record, "tier", "info", f"{util} (tier log)", record.utilization)
        elif tier == "optimize":
            policy.force(bucket, record.step)
            if changed:
                msg = f"{util} (tier optimize): re-planning with the latest correction"
                self._alert(record, "tier", "warning", msg, record.utilization)
        else:
            msg = f"{util} (tier pause): pausing for the user callback, then shrinking"
            self._alert(record, "tier", "error", msg, record.utilization, force=True)
            if cfg.on_pause is not None:
                cfg.on_pause(record)
            policy.force(bucket, record.step, shrink=True)

    def _recompute(self, record: StepRecord, run_s: float) -> None:
        spent = self.toggles.take_recompute_seconds()
        if record.checkpointing == "none" or run_s <= 0:
            return
        frac = record.recompute_fraction = spent / run_s
        limit = self.config.alerts.recompute_warn
        if frac > limit:
            msg = f"recompute overhead {frac:.0%} of the step (> {limit:.0%})"
            self._alert(record, "recompute", "warning", msg, frac)

    def _amp(self, record: StepRecord, graph: StepGraph, actual: dict[str, int]) -> None:
        cfg = self.config.alerts
        if self._scaler is None:
            return
        if not record.overflow:
            self._calibrated = True
            return
        if not self._calibrated:  # the scaler is still finding its initial scale
            return
        tracker = self.overflow_tracker
        if (
            len(tracker.events) >= min(cfg.overflow_window, 20)
            and tracker.rate > cfg.overflow_alert_rate
        ):
            msg = (
                f"AMP overflow rate {tracker.rate:.1%} over {len(tracker.events)} steps "
                f"(> {cfg.overflow_alert_rate:.0%}): optimizer steps were skipped"
            )
            self._alert(record, "overflow", "warning", msg, tracker.rate)
        elastic, limit = self.elastic, self.policy.limit
        pending = [n for n in elastic.candidates if n not in elastic.promoted]
        if not cfg.elastic_precision or tracker.recent < cfg.overflow_sustained or not pending:
            return
        extra = self.fp32_extra_bytes(graph, actual, pending)
        needed = record.bound_bytes + int(extra * self.predictor.corrector.bound_factor)
        if needed <= limit:
            names = elastic.promote()
            msg = (
                f"sustained AMP overflow: {len(names)} sensitive module(s) back to fp32 "
                f"(+{extra} bytes predicted)"
            )
            self._alert(record, "precision", "warning", msg, float(extra), force=True)
        else:
            msg = (
                f"sustained AMP overflow, but no budget to move layers to fp32 "
                f"({needed} > {limit} bytes)"
            )
            self._alert(record, "precision", "error", msg, float(needed))

    def fp32_extra_bytes(self, graph: StepGraph, sizes: dict[str, int], modules: list[str]) -> int:
        """Bytes of half-precision storages the given modules create (fp32 doubles them)."""
        path = graph.paths[0]
        nbytes = graph.storage_bytes(0, graph.resolve_sizes(sizes))
        node_module = path.nodes["module"]
        prefixes = tuple(modules) + tuple(m + "." for m in modules)
        total = 0
        for u, (alloc, dtype) in enumerate(zip(path.storages["alloc"], path.storages["dtype"])):
            if alloc >= 0 and dtype in _HALF and node_module[alloc].startswith(prefixes):
                total += int(nbytes[u])
        return total

    def _count_avoided(self, n: int, sizes: dict[str, int]) -> None:
        """A step the user's own config (whole batch, base C and P) would have OOMed (only
        for the user's batches: under `batches()` the governor sized them itself)."""
        at = {**self.policy.cfg.sizes, **{k: v for k, v in sizes.items() if k != "B"}, "B": n}
        if self.predictor.predicted(self.base_graph, at, near=True) > self.capacity:
            self.totals["ooms_avoided"] += 1


def _tokens(batch: Any, n: int, sizes: dict[str, int]) -> int:
    lengths = batch.get("lengths") if isinstance(batch, dict) else None
    if isinstance(lengths, torch.Tensor):
        return int(lengths.sum())
    return n * sizes.get("S", 1)
