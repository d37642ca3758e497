"""The runtime memory governor: predicts each step's peak before it runs and keeps it fitting.

    gov = MemoryGovernor(make_bundle("varlen"), TrainSpec(), device="emulated",
                         capacity_bytes=512 << 20)
    for batch in gov.batches(samples):      # token-budget batches per length bucket
        record = gov.step(batch)            # forward, backward, optimizer; never OOMs twice

or, with your own loader's batches, `gov.step(batch, step_fn)` where `step_fn(model, batch)`
returns the loss, or `for plan in gov.plan(batch): with plan: ...` to run forward, backward
and the optimizer yourself (`serving.governor.loop`). The step graph is captured once per
configuration (`serving.governor.graphs`); each step's peak for its actual shape is a
cached, corrected prediction (`serving.governor.correction`); the decisions (micro-batch,
accumulation, checkpointing, precision) come from `serving.governor.policy`. In `step` the
governor owns backward and the optimizer, so it can split a batch into micro-batches
(gradients accumulate, weighted by micro-batch size, and the optimizer steps once per batch)
and, on a real `torch.OutOfMemoryError`, free everything, restore a safe configuration and
re-run the same batch in smaller pieces: no sample is skipped or seen twice by the
optimizer. Live peaks feed the residual correction; AMP overflow, utilization tiers,
fragmentation and recompute overhead raise alerts (`serving.governor.observe`); every step
leaves a `StepRecord`.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from typing import Any

import torch
from memgnn.predictor.ir.graph import StepGraph
from memgnn.predictor.memory.base import MemoryModel
from memgnn.predictor.spec.bundle import ModelBundle, default_blocks
from memgnn.predictor.spec.train import TrainSpec
from memgnn.serving.governor.alerts import Alert, AlertBook, StepRecord
from memgnn.serving.governor.batching import (
    LengthBuckets,
    TokenBatcher,
    default_sizes,
    even_chunks,
    pad_collate,
    sample_length,
    split,
)
from memgnn.serving.governor.build import (
    default_optimizer,
    make_predictor,
    make_scaler,
    place_model,
)
from memgnn.serving.governor.checks import check_optimizer
from memgnn.serving.governor.config import GovernorConfig
from memgnn.serving.governor.devices import GovernedDevice, resolve_device
from memgnn.serving.governor.graphs import StepGraphs
from memgnn.serving.governor.loop import StepPlan, plans
from memgnn.serving.governor.observe import Observer
from memgnn.serving.governor.policy import Decision, Policy
from memgnn.serving.governor.runtime import CheckpointToggles, ElasticPrecision, OverflowTracker
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor

log = logging.getLogger(__name__)

__all__ = ["GovernorConfig", "MemoryGovernor", "StepRecord"]

# Governor overhead is this thread's CPU time: wall time on a shared machine also counts the
# scheduler's preemptions, which are not the governor's cost.
_cpu = time.thread_time

LossFn = Callable[[nn.Module, Any], torch.Tensor]
Phase = str  # idle | forward | optimizer | done


class MemoryGovernor:
    """See the module docstring. `model` is a `ModelBundle` (built on the device here) or a
    live `nn.Module` (then pass `bundle=` or `graph=` for predictions, and `loss_fn`)."""

    def __init__(
        self,
        model: ModelBundle | nn.Module,
        train: TrainSpec | None = None,
        *,
        device: str | GovernedDevice = "emulated",
        capacity_bytes: int | None = None,
        config: GovernorConfig | None = None,
        bundle: ModelBundle | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        loss_fn: LossFn | None = None,
        predictor: MemoryModel | None = None,
        graph: StepGraph | None = None,
        scaler: Any = None,
        sizes_of: Callable[[Any], dict[str, int]] | None = None,
    ) -> None:
        self.config = config or GovernorConfig()
        self.train = (train or TrainSpec()).with_options(steps="both", grad_accum=1)
        self.device: GovernedDevice = resolve_device(device, capacity_bytes)
        self.capacity = int(self.device.capacity_bytes)
        self.bundle, self.model = place_model(model, bundle, self.device, self.train)
        self.loss_fn = loss_fn or (self.bundle.loss if self.bundle is not None else None)
        self.sizes_of = sizes_of or default_sizes
        blocks_of = (self.bundle.blocks if self.bundle else None) or default_blocks
        self.toggles = CheckpointToggles(blocks_of(self.model))
        self.toggles.set(self.train.activations.checkpointing)
        if optimizer is not None:
            check_optimizer(optimizer, self.model, self.train)
        self.optimizer = optimizer or default_optimizer(self.model, self.device, self.train)
        self.optimizer.register_step_pre_hook(self._on_optimizer_step)
        precisions = self.config.policy.precision or [self.train.numerics.precision]
        if scaler is None:
            scaler = make_scaler(self.device, self.train, precisions)
        self.scaler = scaler
        self.elastic = ElasticPrecision(self.model)
        self.overflow = OverflowTracker(self.config.alerts.overflow_window)
        self.predictor = make_predictor(predictor, self.device, self.config)
        self.graphs = StepGraphs(
            self.bundle,
            self.train,
            target=self.device.target,
            sm=self.device.sm,
            cache_dir=self.config.cache_dir,
            fixed=graph,
        )
        self.buckets = LengthBuckets.from_config(self.config.batching)
        self.policy = Policy(
            self.predictor,
            self.graphs,
            self.train,
            self.config.policy,
            capacity=self.capacity,
            device=self.device.profile,
            metric=self.config.metric,
            n_blocks=len(self.toggles.blocks),
        )
        self.alerts = AlertBook(self.config.alerts.cooldown, self.config.on_alert)
        self.base_graph = self.graph_for(self.train)  # captured once, at start
        self.observer = self._make_observer()
        self.governs_batching = False  # batches() forms the batches (token-budget mode)
        self.precision = self.train.numerics.precision
        self.last_loss: float | None = None
        self._sizes_asked: dict[tuple[int | None, int], int] = {}
        self._batching_s = 0.0  # governor time spent forming batches since the last step
        self._phase: Phase = "idle"  # where in the step an OOM happened
        self._overflowed = False  # the scaler skipped the last optimizer step
        self._last_shape: tuple[int | None, int, str] | None = None  # for defragmentation
        if self.config.prepare_all:
            self.prepare()
        self.observer.reset_peak()

    # ---- construction ----------------------------------------------------------------------
    def _make_observer(self) -> Observer:
        return Observer(
            self.config,
            device=self.device,
            predictor=self.predictor,
            policy=self.policy,
            alerts=self.alerts,
            toggles=self.toggles,
            elastic=self.elastic,
            overflow=self.overflow,
            base_graph=self.base_graph,
        )

    def _on_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._phase = "optimizer"  # from here on an OOM cannot be rolled back

    # ---- what the run has seen (owned by the observer) -------------------------------------
    @property
    def step_count(self) -> int:
        return self.observer.step_count

    @property
    def totals(self) -> dict[str, float]:
        return self.observer.totals

    @property
    def records(self) -> deque[StepRecord]:
        return self.observer.records

    # ---- graphs and predictions ----------------------------------------------------------
    @property
    def limit(self) -> int:
        return self.policy.limit

    def graph_for(self, train: TrainSpec) -> StepGraph:
        """The captured step for a (precision, checkpointing, G=1 | G>=2) configuration."""
        return self.graphs(train)

    def prepare(self) -> None:
        """Capture every graph of the search space now instead of on first use."""
        self.graphs.prepare(self.policy.precisions, self.policy.checkpointing)

    def predict(self, sizes: dict[str, int]) -> dict[str, int]:
        """Corrected prediction and bound for the base configuration at `sizes`."""
        return {
            "predicted_peak_bytes": self.predictor.predicted(self.base_graph, sizes),
            "upper_bound_bytes": self.predictor.bound(self.base_graph, sizes),
            "limit_bytes": self.limit,
        }

    # ---- batching ------------------------------------------------------------------------
    def batch_size_for(self, bucket: int | None) -> int:
        """Samples per batch for a length bucket: the plan's micro-batch, or the effective
        batch when `keep_effective_batch` (then `step` splits it)."""
        if self.config.batching.keep_effective_batch:
            return int(self.config.batching.effective_batch or 1)
        key = (bucket, self.step_count)
        got = self._sizes_asked.get(key)
        if got is None:  # the batcher asks once per sample: decide once per bucket and step
            t0 = _cpu()
            if len(self._sizes_asked) > 4096:
                self._sizes_asked.clear()
            got = self._sizes_asked[key] = self.policy.decide(bucket, None, self.step_count).micro
            self._batching_s += _cpu() - t0  # counted in the next step's overhead
        return got

    def batches(
        self,
        samples: Iterable[Any],
        *,
        collate: Callable[[list[Any], int], Any] = pad_collate,
        length_of: Callable[[Any], int] = sample_length,
    ) -> Iterator[Any]:
        """Token-budget batches: samples grouped by length bucket, each batch as large as
        the bucket's plan allows, padded to the bucket's length; every sample once."""
        self.governs_batching = True
        batcher = TokenBatcher(self.buckets, self.batch_size_for, length_of)
        for bucket, group in batcher(samples):
            yield collate(group, bucket)

    # ---- one optimizer step --------------------------------------------------------------
    def step(self, batch: Any, step_fn: LossFn | None = None) -> StepRecord:
        """One optimizer step over every sample of `batch` (see the module docstring)."""
        t0 = _cpu()
        fn = step_fn or self.loss_fn
        if fn is None:
            raise ValueError("no loss: pass step_fn(model, batch) -> loss")
        sizes, n, bucket, decision = self._decide(batch)
        overhead = _cpu() - t0 + self._take_batching_s()
        retries, run_t0 = 0, time.perf_counter()
        while (failure := self._attempt(batch, n, decision, fn)) is not None:
            t1 = _cpu()
            retries += 1
            decision = self._rollback(bucket, n, decision, failure, retries)
            overhead += _cpu() - t1
        return self._finish(batch, sizes, bucket, decision, retries, run_t0, overhead)

    def plan(self, batch: Any) -> Iterator[StepPlan]:
        """The user-owned loop: plans for one optimizer step over `batch`, a smaller one
        after each OOM (see `serving.governor.loop`)."""
        return plans(self, batch)

    def _decide(self, batch: Any) -> tuple[dict[str, int], int, int | None, Decision]:
        """Sizes, samples, bucket and the applied decision for the next step over `batch`."""
        symbols = self.base_graph.symbols
        sizes = {k: v for k, v in self.sizes_of(batch).items() if k in symbols or k == "B"}
        n, seq = sizes["B"], sizes.get("S")
        bucket = self.buckets(seq) if seq is not None else None
        decision = self.policy.decide(bucket, n, self.step_count)
        if not decision.fits:
            self.alerts.emit(
                Alert(
                    step=self.step_count,
                    kind="predicted_oom",
                    level="error",
                    message=(
                        f"{sizes} is predicted over the limit even at micro-batch "
                        f"{decision.micro} with {decision.checkpointing} checkpointing "
                        f"({decision.bound_bytes} > {self.limit} bytes): trying anyway"
                    ),
                    value=float(decision.bound_bytes),
                )
            )
        self._apply(decision)
        self._defragment(bucket, decision)
        return sizes, n, bucket, decision

    def _take_batching_s(self) -> float:
        """Governor time spent forming batches since the last step (counted in its overhead)."""
        out, self._batching_s = self._batching_s, 0.0
        return out

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
    ) -> StepRecord:
        run_s = time.perf_counter() - run_t0
        self.policy.on_success(bucket, decision.micro)
        if overflow is None:
            overflow, self._overflowed = self._overflowed, False
        return self.observer.after_step(
            batch,
            sizes,
            bucket,
            decision,
            retries=retries,
            run_s=run_s,
            overhead_s=overhead,
            overflow=overflow,
            scaler=self.scaler,
            count_avoided=not self.governs_batching,
        )

    def _defragment(self, bucket: int | None, decision: Decision) -> None:
        """Before a step of a new shape that must reuse cached blocks (its bound is over what
        the device has never reserved), release the cached free segments: blocks split for
        other shapes are what variable lengths fragment, and an OOM there is avoidable."""
        shape = (bucket, decision.micro, decision.checkpointing)
        previous, self._last_shape = self._last_shape, shape
        if not self.config.defragment or shape == previous:
            return
        free_device = self.capacity - self.device.memory_reserved()
        needs = decision.bound_bytes - self.device.memory_allocated()
        if needs > free_device and self.device.memory_reserved() > self.device.memory_allocated():
            self.device.empty_cache()
            self.observer.count("defragmentations")

    def _apply(self, decision: Decision) -> None:
        self.toggles.set(decision.checkpointing)
        self.precision = decision.precision
        if self.precision == "amp-fp16" and self.scaler is None:
            self.scaler = torch.amp.GradScaler(device=self.device.torch_device.type)

    def _autocast(self) -> contextlib.AbstractContextManager:
        dtype = {"amp-bf16": torch.bfloat16, "amp-fp16": torch.float16}.get(self.precision)
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.torch_device.type, dtype=dtype)

    def _attempt(self, batch: Any, n: int, decision: Decision, fn: LossFn) -> str | None:
        """Run the step; on OOM free everything it held and return the error text."""
        self._phase = "forward"
        try:
            self._run(batch, n, even_chunks(n, decision.micro), fn)
            return None
        except torch.OutOfMemoryError as exc:
            message = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            if self._phase == "optimizer":  # parameters may be half updated: cannot redo
                raise
        # outside the except block: the traceback (and the tensors its frames hold) is gone
        self._recover()
        return message

    def _recover(self) -> None:
        """After an OOM before the optimizer step: drop the partial gradients, the scaler's
        per-step state, and whatever the failed attempt left in the device's cache."""
        self.toggles.in_backward = False
        self.optimizer.zero_grad(set_to_none=True)
        if isinstance(self.scaler, torch.amp.GradScaler):
            self.scaler._per_optimizer_states.pop(id(self.optimizer), None)  # unscale_ again
        self.device.recover()

    def _run(self, batch: Any, n: int, chunks: list[int], fn: LossFn) -> None:
        pieces = split(batch, chunks) if len(chunks) > 1 else [batch]
        total, fake = 0.0, False
        for piece, size in zip(pieces, chunks):
            micro = self.device.transfer(piece)
            with self.device.context():
                with self._autocast():
                    loss = fn(self.model, micro)
                weight = size / n
                scaled = loss * weight if len(chunks) > 1 else loss
                if self.scaler is not None:
                    scaled = self.scaler.scale(scaled)
                self.toggles.in_backward = True
                scaled.backward()
                self.toggles.in_backward = False
            fake = isinstance(loss, FakeTensor)  # a fake-executing device computes no loss
            total += 0.0 if fake else float(loss.detach()) * weight
            del loss, scaled, micro
        self._phase = "optimizer"
        with self.device.context():
            if self.scaler is not None:
                before = float(self.scaler.get_scale())
                self.scaler.step(self.optimizer)
                self.scaler.update()
                self._overflowed = self.overflow.observe(before, float(self.scaler.get_scale()))
            else:
                self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        self._phase = "done"
        self.last_loss = None if fake else total

    def _rollback(
        self, bucket: int | None, n: int, failed: Decision, failure: str, retries: int
    ) -> Decision:
        self.observer.count("ooms")
        sizes = self.policy.sizes(bucket, failed.micro)
        graph = self.policy.graph(failed.checkpointing, failed.precision, failed.grad_accum)
        raw = self.predictor.raw(graph, sizes).upper_bound_bytes
        self.predictor.corrector.learn_oom(raw, self.capacity)
        last_resort = failed.checkpointing == "full" or not self.toggles.blocks
        if retries > self.config.max_retries or (failed.micro == 1 and last_resort):
            raise torch.OutOfMemoryError(
                f"governor: step {self.step_count} still OOMs after {retries - 1} rollback(s) "
                f"at micro-batch {failed.micro}: {failure}"
            )
        decision = self.policy.on_oom(bucket, failed, self.step_count, n)
        same = (decision.micro, decision.checkpointing) == (failed.micro, failed.checkpointing)
        if same and failed.micro == 1:  # nothing smaller: checkpoint every block, searched or not
            decision = replace(decision, checkpointing="full", fits=False)
        self.observer.count("rollbacks")
        self.alerts.emit(
            Alert(
                step=self.step_count,
                kind="oom",
                level="warning",
                message=(
                    f"OOM at micro-batch {failed.micro} x {failed.grad_accum} "
                    f"({failed.checkpointing}, {failed.precision}): rolled back to "
                    f"{decision.micro} x {decision.grad_accum} ({decision.checkpointing}); "
                    f"re-running the same {n} samples. {failure}"
                ),
            ),
            force=True,
        )
        self._apply(decision)
        return decision

    # ---- reporting -----------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        """Totals, per-bucket plans, correction state, alert counts (JSON-ready)."""
        return self.observer.summary()
