"""A Lightning callback for the memory governor (`pip install memgnn[lightning]`).

    gov = MemoryGovernor(lit_module.model, train, bundle=bundle, device="cuda")
    trainer = L.Trainer(callbacks=[GovernorCallback(gov, plan_sizes={"S": 512})])

- `on_fit_start`: with `plan_sizes`, sets the module's (or datamodule's) `batch_size` to the
  governor's plan for those sizes, like Lightning's BatchSizeFinder but on predictions; with
  `effective_batch`, sets `trainer.accumulate_grad_batches` so B x G stays that value.
- before each batch: the peak of its actual shape is predicted; more blocks are checkpointed
  if that is what makes it fit (Lightning owns the loop, so batches are not split).
- after each optimizer step: the peak is measured (the device the governor reads), the
  prediction corrected, alerts raised, AMP overflow tracked (16-mixed's GradScaler), and the
  record logged through `pl_module.log_dict` under `governor/`.
"""

from __future__ import annotations

import logging
from typing import Any

from memgnn.serving.governor.core import MemoryGovernor
from memgnn.serving.governor.integrations.monitor import StepMonitor

log = logging.getLogger(__name__)

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:  # pragma: no cover - depends on the environment
    Callback = None  # type: ignore[assignment,misc]

LOGGED = ("predicted_bytes", "bound_bytes", "utilization", "correction", "micro_batch",
          "tier_level", "overhead_ms")  # fmt: skip

if Callback is not None:

    class GovernorCallback(Callback):
        def __init__(
            self,
            governor: MemoryGovernor,
            *,
            plan_sizes: dict[str, int] | None = None,
            effective_batch: int | None = None,
            batch_size_attr: str = "batch_size",
            log_metrics: bool = True,
        ) -> None:
            super().__init__()
            if effective_batch is not None and effective_batch < 1:
                raise ValueError("effective_batch must be >= 1")
            self.gov = governor
            self.plan_sizes, self.effective_batch = plan_sizes, effective_batch
            self.batch_size_attr, self.log_metrics = batch_size_attr, log_metrics
            self.monitor = StepMonitor(governor)
            self.planned: int | None = None
            self.records: list[Any] = []

        def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
            scaler = getattr(getattr(trainer, "precision_plugin", None), "scaler", None)
            self.monitor.scaler = scaler
            if self.plan_sizes is None:
                return
            seq = self.plan_sizes.get("S")
            bucket = self.gov.buckets(seq) if seq is not None else None
            b = self.planned = self.gov.policy.decide(bucket, None, self.gov.step_count).micro
            target = _holder(trainer, pl_module, self.batch_size_attr)
            if target is not None:
                setattr(target, self.batch_size_attr, b)
                log.info("governor: %s.%s = %d", type(target).__name__, self.batch_size_attr, b)
            if self.effective_batch is not None:
                trainer.accumulate_grad_batches = max(1, -(-self.effective_batch // b))

        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, idx: int) -> None:
            if self.monitor._t0 is None:
                self.monitor.begin()
            self.monitor.see(batch)

        def on_train_batch_end(
            self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, idx: int
        ) -> None:
            accumulate = max(1, int(getattr(trainer, "accumulate_grad_batches", 1)))
            last = getattr(trainer.fit_loop.epoch_loop.batch_progress, "is_last_batch", False)
            if (idx + 1) % accumulate and not last:
                return
            record = self.monitor.end()
            if record is None:
                return
            self.records.append(record)
            if self.log_metrics:
                metrics = record.metrics()
                pl_module.log_dict(
                    {f"governor/{k}": metrics[k] for k in LOGGED if k in metrics},
                    on_step=True,
                    on_epoch=False,
                    batch_size=record.samples,
                )

else:  # pragma: no cover - depends on the environment

    class GovernorCallback:  # type: ignore[no-redef]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            raise ImportError("GovernorCallback needs Lightning: pip install memgnn[lightning]")


def _holder(trainer: Any, pl_module: Any, attr: str) -> Any:
    """The object whose `attr` the train dataloader reads: the datamodule, else the module."""
    dm = getattr(trainer, "datamodule", None)
    if dm is not None and hasattr(dm, attr):
        return dm
    if hasattr(pl_module, attr):
        return pl_module
    hparams = getattr(pl_module, "hparams", None)
    if hparams is not None and attr in hparams:
        return hparams
    log.warning("governor: no %r attribute on the module or datamodule to set", attr)
    return None
