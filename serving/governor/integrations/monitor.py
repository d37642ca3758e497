"""The governor for loops it does not own (Lightning, the Hugging Face Trainer).

When a framework runs forward, backward and the optimizer itself, the governor cannot split
a batch or re-run it after an OOM; it can still predict every micro-batch before it runs,
checkpoint more blocks when a batch would not fit, measure the peak after each optimizer
step (residual correction, samples), track AMP overflow, raise alerts and leave a
`StepRecord`. `StepMonitor` is that part, shared by the callbacks:

    monitor.begin()                 # an optimizer step starts
    monitor.see(batch_or_sizes)     # before each micro-batch: predict, maybe checkpoint more
    record = monitor.end()          # after the optimizer step: measure, correct, alert
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from memgnn.serving.governor.alerts import Alert, StepRecord
from memgnn.serving.governor.core import MemoryGovernor
from memgnn.serving.governor.policy import Decision

log = logging.getLogger(__name__)

__all__ = ["StepMonitor"]


class StepMonitor:
    def __init__(self, governor: MemoryGovernor, scaler: Any = None) -> None:
        self.gov = governor
        self.scaler = scaler
        self._shapes: list[dict[str, int]] = []
        self._t0: float | None = None
        self._scale: float | None = None
        self._overhead = 0.0
        self._decision: Decision | None = None

    def begin(self) -> None:
        self._shapes, self._t0, self._overhead = [], time.perf_counter(), 0.0
        self._decision = None
        if self.scaler is not None:
            self._scale = float(self.scaler.get_scale())

    def sizes(self, batch: Any) -> dict[str, int]:
        if isinstance(batch, Mapping) and all(isinstance(v, int) for v in batch.values()):
            sizes = dict(batch)
        else:
            sizes = self.gov.sizes_of(batch)
        symbols = self.gov.base_graph.symbols
        return {k: v for k, v in sizes.items() if k in symbols or k == "B"}

    def see(self, batch: Any) -> Decision:
        """Predict one micro-batch; checkpoint more blocks if that is what makes it fit."""
        t0 = time.thread_time()
        if self._t0 is None:
            self.begin()
        gov, policy = self.gov, self.gov.policy
        sizes = self.sizes(batch)
        self._shapes.append(sizes)
        n, seq = sizes["B"], sizes.get("S")
        bucket = gov.buckets(seq) if seq is not None else None
        chosen = policy.config_for(bucket, n, 1)
        if chosen is None:
            ckpt = "full" if "full" in policy.checkpointing else policy.checkpointing[-1]
            chosen = (ckpt, gov.precision, policy.bound(bucket, n, ckpt, gov.precision, 1))
            gov.alerts.emit(
                Alert(
                    step=gov.step_count,
                    kind="predicted_oom",
                    level="error",
                    message=(
                        f"micro-batch {sizes} is predicted at {chosen[2]} bytes, over the "
                        f"limit {gov.limit} even with {ckpt} checkpointing: lower the batch "
                        "size (the framework owns the loop, so the governor cannot split it)"
                    ),
                    value=float(chosen[2]),
                )
            )
        gov.toggles.set(chosen[0])
        decision = Decision(
            micro=n,
            grad_accum=1,
            checkpointing=chosen[0],
            precision=gov.precision,
            bound_bytes=chosen[2],
            fits=chosen[2] <= gov.limit,
        )
        if self._decision is None or decision.bound_bytes > self._decision.bound_bytes:
            self._decision = decision
        self._overhead += time.thread_time() - t0
        return decision

    def end(self) -> StepRecord | None:
        """Close the optimizer step: measure, correct, alert; None if no batch was seen."""
        if not self._shapes or self._decision is None or self._t0 is None:
            self._t0 = None
            return None
        gov, obs = self.gov, self.gov.observer
        run_s = time.perf_counter() - self._t0
        largest = max(self._shapes, key=lambda s: s["B"] * s.get("S", 1))
        dec = self._decision
        dec.grad_accum = len(self._shapes)
        sizes = {**largest, "B": largest["B"] * len(self._shapes)}
        overflow = False
        if self.scaler is not None and self._scale is not None:
            overflow = gov.overflow.observe(self._scale, float(self.scaler.get_scale()))
        bucket = gov.buckets(largest["S"]) if "S" in largest else None
        # real token counts are not visible from a callback: records count B x S
        record = obs.after_step(
            None,
            sizes,
            bucket,
            dec,
            retries=0,
            run_s=run_s,
            overhead_s=self._overhead,
            overflow=overflow,
            scaler=gov.scaler if gov.scaler is not None else self.scaler,
            count_avoided=not gov.governs_batching,
        )
        self._t0 = None
        return record
