"""The captured training steps the governor predicts on, one per configuration.

A configuration is (precision, checkpointing, G=1 | G>=2): accumulation steps 2..G repeat
step 2's live state exactly, so two captures cover every G. Each is captured once with
symbolic sizes (`predictor.capture.cache.capture_cached`, on disk under `cache_dir`), outside any
device's dispatch mode, or is the one graph given (`fixed`) for every configuration.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from memgnn.predictor.capture.cache import capture_cached
from memgnn.predictor.ir.graph import StepGraph
from memgnn.predictor.spec.bundle import ModelBundle
from memgnn.predictor.spec.train import TrainSpec
from torch.utils._python_dispatch import _disable_current_modes

log = logging.getLogger(__name__)

__all__ = ["StepGraphs"]


class StepGraphs:
    def __init__(
        self,
        bundle: ModelBundle | None,
        base: TrainSpec,
        *,
        target: str,
        sm: int,
        cache_dir: Path | None = None,
        fixed: StepGraph | None = None,
    ) -> None:
        if bundle is None and fixed is None:
            raise ValueError("the governor needs a ModelBundle (or graph=) to predict memory")
        self.bundle, self.base, self.fixed = bundle, base, fixed
        self.target, self.sm, self.cache_dir = target, sm, cache_dir
        self._graphs: dict[tuple[str, str, int], StepGraph] = {}

    def __call__(self, train: TrainSpec) -> StepGraph:
        """The captured step for `train`'s (precision, checkpointing, G=1 | G>=2)."""
        key = (
            train.numerics.precision,
            train.activations.checkpointing,
            min(train.loop.grad_accum, 2),
        )
        graph = self._graphs.get(key)
        if graph is None:
            graph = self.fixed if self.fixed is not None else self._capture(key)
            self._graphs[key] = graph
        return graph

    def _capture(self, key: tuple[str, str, int]) -> StepGraph:
        t0 = time.perf_counter()
        spec = self.base.with_options(precision=key[0], checkpointing=key[1])
        with _disable_current_modes():  # capture outside any device's dispatch mode
            graph = capture_cached(
                self.bundle,
                spec.with_options(grad_accum=key[2], steps="both"),
                target=self.target,
                sm=self.sm,
                directory=self.cache_dir,
            )
        log.info("step graph %s ready in %.1fs", key, time.perf_counter() - t0)
        return graph

    def prepare(self, precisions: list[str], checkpointing: list[str]) -> None:
        """Capture every configuration of a search space now instead of on first use."""
        for p in precisions:
            for c in checkpointing:
                for g in (1, 2):
                    self(self.base.with_options(precision=p, checkpointing=c, grad_accum=g))
