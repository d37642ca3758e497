"""A Hugging Face `Trainer` callback for the memory governor (`memgnn[transformers]`).

    gov = MemoryGovernor(model, train, bundle=bundle, device="cuda")
    callback = GovernorTrainerCallback(gov)
    args = callback.configure(args, {"S": 512})    # plan batch size + accumulation first
    trainer = Trainer(model=model, args=args, callbacks=[callback], ...)

- `configure(args, sizes)` (before the Trainer is built: it reads the batch size in its
  constructor) sets `per_device_train_batch_size` to the governor's plan for `sizes` and
  `gradient_accumulation_steps` so that their product stays what `args` asked for.
- A forward pre-hook sees each training micro-batch's `input_ids` shape: its peak is
  predicted and more blocks are checkpointed if that makes it fit.
- `on_step_end`: the peak is measured on the governor's device, the prediction corrected,
  alerts raised; `on_log` adds the step record to the Trainer's logs and log history
  (`governor/...`). The Trainer calls its own reporters (mlflow, tensorboard, ...) before
  user callbacks, so to report every record there use `GovernorConfig(on_record=
  mlflow_sink())` (or any sink of your own).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import torch
from memgnn.serving.governor.core import MemoryGovernor
from memgnn.serving.governor.integrations.monitor import StepMonitor

log = logging.getLogger(__name__)

try:
    from transformers import TrainerCallback
except ImportError:  # pragma: no cover - depends on the environment
    TrainerCallback = object  # type: ignore[assignment,misc]
    _HAVE_TRANSFORMERS = False
else:
    _HAVE_TRANSFORMERS = True

LOGGED = ("predicted_bytes", "bound_bytes", "measured_allocated_bytes", "utilization",
          "correction", "micro_batch", "tier_level", "overhead_ms")  # fmt: skip


class GovernorTrainerCallback(TrainerCallback):  # type: ignore[misc,valid-type]
    def __init__(self, governor: MemoryGovernor, *, prefix: str = "governor/") -> None:
        if not _HAVE_TRANSFORMERS:
            raise ImportError("GovernorTrainerCallback needs transformers: memgnn[transformers]")
        self.gov, self.prefix = governor, prefix
        self.monitor = StepMonitor(governor)
        self.records: list[Any] = []
        self._hook: Any = None
        self._last: Any = None

    def configure(self, args: Any, sizes: dict[str, int]) -> Any:
        """`args` with the planned per-device batch and accumulation (B x G kept)."""
        effective = args.per_device_train_batch_size * args.gradient_accumulation_steps
        seq = sizes.get("S")
        bucket = self.gov.buckets(seq) if seq is not None else None
        b = min(self.gov.policy.decide(bucket, None, self.gov.step_count).micro, effective)
        g = max(1, -(-effective // b))
        log.info("governor: per-device batch %d x accumulation %d (effective %d)", b, g, b * g)
        try:
            return replace(args, per_device_train_batch_size=b, gradient_accumulation_steps=g)
        except (TypeError, ValueError):  # older TrainingArguments: set in place
            args.per_device_train_batch_size, args.gradient_accumulation_steps = b, g
            return args

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kw: Any):
        if model is not None and self._hook is None:
            self._hook = model.register_forward_pre_hook(self._pre_forward, with_kwargs=True)

    def _pre_forward(self, module: Any, args: tuple, kwargs: dict) -> None:
        if not module.training:
            return
        ids = kwargs.get("input_ids")
        if ids is None and args and isinstance(args[0], torch.Tensor):
            ids = args[0]
        if isinstance(ids, torch.Tensor) and ids.dim() >= 2:
            self.monitor.see({"B": int(ids.shape[0]), "S": int(ids.shape[1])})

    def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any):
        self.monitor.begin()

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any):
        record = self.monitor.end()
        if record is not None:
            self.records.append(record)
            self._last = record

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any):
        if logs is None or self._last is None:
            return
        metrics = self._last.metrics()
        extra = {f"{self.prefix}{k}": metrics[k] for k in LOGGED if k in metrics}
        logs.update(extra)  # reporters after this callback see them
        history = getattr(state, "log_history", None)
        if history and history[-1].get("step") == state.global_step:
            history[-1].update(extra)  # the Trainer stored its copy before calling on_log

    def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any):
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
