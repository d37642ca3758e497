"""The loop the user owns: the governor says what to run, the user runs it.

    for batch in loader:
        for plan in gov.plan(batch):        # one plan; after an OOM, a smaller one, same batch
            with plan:                      # an OOM inside (before optimizer.step) rolls back
                for mb in plan.micro_batches:
                    with plan.autocast():
                        loss = loss_fn(model, mb.batch)
                    scaler.scale(loss * mb.weight).backward()
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad(set_to_none=True)
        record = plan.record                # what was decided and measured (a StepRecord)

`MemoryGovernor.plan(batch)` decides the micro-batch size, accumulation, checkpointing and
precision as `step` does (the checkpointing is applied to the model before the plan is
yielded; the precision is `plan.autocast()`), and yields a `StepPlan` whose `micro_batches`
are the batch's pieces on the device, each with its gradient weight (size / batch). Leaving
`with plan` normally is the end of the optimizer step: the peak is measured, the prediction
corrected, alerts raised, the record kept. An `OutOfMemoryError` raised inside before the
optimizer step (the governor sees it through a step pre-hook on its optimizer) is caught:
gradients are zeroed, the device's cache released, the decision rolled back, and the
iterator yields a smaller plan for the same samples, so the optimizer still sees each sample
once. An OOM after `optimizer.step()` began is raised (parameters may be half updated).
Pass the `GradScaler` you use as `MemoryGovernor(..., scaler=)` so that skipped steps
(overflow) are tracked; on a rollback its per-optimizer state is reset, so `unscale_` may
be called again. Names bound inside the block (`loss`) keep their tensors until rebound;
an OOM in backward therefore leaves the failed graph alive until the next forward assigns
`loss` again, and the governor's retry starts with that much less room.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Protocol

import torch
from memgnn.serving.governor.alerts import StepRecord
from memgnn.serving.governor.batching import even_chunks, split
from memgnn.serving.governor.devices import GovernedDevice
from memgnn.serving.governor.policy import Decision
from memgnn.serving.governor.runtime import CheckpointToggles, OverflowTracker

log = logging.getLogger(__name__)

__all__ = ["MicroBatch", "StepPlan", "plans"]


class _Governor(Protocol):
    """What a plan needs of `MemoryGovernor` (which implements it; no import cycle)."""

    device: GovernedDevice
    scaler: Any
    overflow: OverflowTracker
    toggles: CheckpointToggles
    _phase: str

    def _decide(self, batch: Any) -> tuple[dict[str, int], int, int | None, Decision]: ...
    def _take_batching_s(self) -> float: ...
    def _autocast(self) -> contextlib.AbstractContextManager: ...
    def _recover(self) -> None: ...
    def _rollback(
        self, bucket: int | None, n: int, failed: Decision, failure: str, retries: int
    ) -> Decision: ...
    def _finish(
        self,
        batch: Any,
        sizes: dict[str, int],
        bucket: int | None,
        decision: Decision,
        retries: int,
        run_t0: float,
        overhead: float,
        overflow: bool | None = None,
    ) -> StepRecord: ...


@dataclass(frozen=True, slots=True)
class MicroBatch:
    batch: Any  # this piece of the batch, on the device
    size: int  # samples in it
    weight: float  # size / samples in the whole batch: multiply the loss by it


@dataclass(slots=True)
class StepPlan:
    """One attempt at one optimizer step (see the module docstring)."""

    decision: Decision
    micro_batches: list[MicroBatch]
    attempt: int  # 0, then 1, 2, ... after rollbacks
    record: StepRecord | None = None
    failure: str | None = None  # the OOM text, when this attempt rolled back
    _gov: _Governor | None = field(default=None, repr=False)
    _scale: float | None = field(default=None, repr=False)
    _context: Any = field(default=None, repr=False)

    @property
    def micro_batch(self) -> int:
        return self.decision.micro

    @property
    def grad_accum(self) -> int:
        return self.decision.grad_accum

    @property
    def checkpointing(self) -> str:
        return self.decision.checkpointing

    @property
    def precision(self) -> str:
        return self.decision.precision

    def autocast(self) -> contextlib.AbstractContextManager:
        """torch.autocast for the plan's precision (a no-op for fp32)."""
        assert self._gov is not None
        return self._gov._autocast()

    def __enter__(self) -> StepPlan:
        gov = self._gov
        assert gov is not None, "a StepPlan comes from MemoryGovernor.plan()"
        gov._phase = "forward"
        gov.toggles.in_backward = False
        self._scale = float(gov.scaler.get_scale()) if gov.scaler is not None else None
        self._context = gov.device.context()
        self._context.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        gov = self._gov
        assert gov is not None
        self._context.__exit__(exc_type, exc, tb)
        if exc is None:
            gov._phase = "done"
            return False
        if not isinstance(exc, torch.OutOfMemoryError) or gov._phase == "optimizer":
            return False  # not ours, or parameters may be half updated: cannot redo
        self.failure = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return True  # the iterator recovers (outside the exception) and re-plans


def plans(gov: _Governor, batch: Any) -> Iterator[StepPlan]:
    """`MemoryGovernor.plan`: the attempts at one optimizer step over `batch`."""
    t0 = time.thread_time()
    sizes, n, bucket, decision = gov._decide(batch)
    overhead = time.thread_time() - t0 + gov._take_batching_s()
    run_t0, retries = time.perf_counter(), 0
    while True:
        chunks = even_chunks(n, decision.micro)
        pieces = split(batch, chunks) if len(chunks) > 1 else [batch]
        weights = [c / n if len(chunks) > 1 else 1.0 for c in chunks]
        micro = [
            MicroBatch(batch=gov.device.transfer(p), size=c, weight=w)
            for p, c, w in zip(pieces, chunks, weights)
        ]
        plan = StepPlan(decision=decision, micro_batches=micro, attempt=retries, _gov=gov)
        del pieces, micro
        yield plan
        if plan.failure is None:
            if gov._phase != "done":
                raise RuntimeError("use each plan as a context manager: `with plan: ...`")
            overflow = False
            if gov.scaler is not None and plan._scale is not None:
                overflow = gov.overflow.observe(plan._scale, float(gov.scaler.get_scale()))
            plan.micro_batches = []
            plan.record = gov._finish(
                batch, sizes, bucket, decision, retries, run_t0, overhead, overflow=overflow
            )
            return
        t1 = time.thread_time()
        plan.micro_batches = []
        gov._recover()
        retries += 1
        decision = gov._rollback(bucket, n, decision, plan.failure, retries)
        overhead += time.thread_time() - t1
