"""The governor's predictions: cached per (graph, sizes), corrected online from measurements.

`ResidualCorrector` keeps an exponentially weighted estimate of log(measured / predicted)
over live samples: its mean moves predictions toward what the device measures, its spread
(z standard deviations) widens the bound, and an OOM puts a floor under the bound factor
(the step that failed needed more than the device had), which fades as later steps succeed
(the bucket that failed keeps its ceiling; see `serving.governor.policy`).
`GovernedPredictor` wraps any `MemoryModel`: each (graph, sizes) is predicted once (the
learned model's head-only path, `encode` once per graph then `predict_encoded`, when the
model has it), and the corrected values are served from the cache in microseconds. It is
itself a `MemoryModel`, so `predictor.plan.search.plan` searches on corrected predictions unchanged.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from memgnn.predictor.ir.graph import StepGraph
from memgnn.predictor.memory.base import MemoryModel, Prediction, Query

log = logging.getLogger(__name__)


@dataclass(kw_only=True, slots=True)
class CorrectorConfig:
    alpha: float = 0.2  # weight of each new sample in the running estimates
    z: float = 2.0  # standard deviations of the log-ratio added to the bound
    max_factor: float = 4.0  # clamp: a wild sample must not stop training
    min_factor: float = 0.25
    floor_decay: float = 0.99  # the OOM floor fades by this per later sample

    def __post_init__(self) -> None:
        if not 0 < self.alpha <= 1:
            raise ValueError(f"alpha must be in (0, 1], got {self.alpha}")
        if self.z < 0:
            raise ValueError(f"z must be >= 0, got {self.z}")
        if not 0 < self.min_factor <= 1 <= self.max_factor:
            raise ValueError("need 0 < min_factor <= 1 <= max_factor")
        if not 0 < self.floor_decay <= 1:
            raise ValueError(f"floor_decay must be in (0, 1], got {self.floor_decay}")


class ResidualCorrector:
    """measured ~ factor x predicted, learned online (see module docstring)."""

    def __init__(self, config: CorrectorConfig | None = None) -> None:
        self.config = config or CorrectorConfig()
        self.n = 0
        self.mean = 0.0  # EW mean of log(measured / predicted)
        self.var = 0.0  # EW variance of the same
        self.floor = 0.0  # bound factor at least this (from OOMs)
        self.version = 0  # bumps whenever the factors change

    def update(self, predicted: float, measured: float) -> None:
        if predicted <= 0 or measured <= 0:
            return
        r = math.log(measured / predicted)
        if self.n == 0:
            self.mean, self.var = r, 0.0
        else:
            a = self.config.alpha
            d = r - self.mean
            self.mean += a * d
            self.var = (1 - a) * (self.var + a * d * d)
        self.n += 1
        self.floor *= self.config.floor_decay  # the OOM evidence ages as steps succeed
        self.version += 1

    def learn_oom(self, predicted: float, needed_at_least: float) -> None:
        """A step predicted at `predicted` OOMed: it needed more than `needed_at_least`."""
        if predicted > 0:
            self.floor = max(self.floor, needed_at_least / predicted)
            self.version += 1

    def _clamp(self, f: float) -> float:
        return min(max(f, self.config.min_factor), self.config.max_factor)

    @property
    def factor(self) -> float:
        """Mean correction: corrected prediction = factor x raw prediction."""
        return self._clamp(math.exp(self.mean)) if self.n else 1.0

    @property
    def bound_factor(self) -> float:
        """Upper-bound correction (mean + z sd, never under the OOM floor)."""
        f = math.exp(self.mean + self.config.z * math.sqrt(self.var)) if self.n else 1.0
        return max(self._clamp(f), self.floor)

    def state(self) -> dict[str, float]:
        return {
            "samples": self.n,
            "factor": round(self.factor, 5),
            "bound_factor": round(self.bound_factor, 5),
            "floor": round(self.floor, 5),
        }


def _scaled(p: Prediction, k: int) -> Prediction:
    breakdown = dict(p.breakdown) if isinstance(p.breakdown, dict) else p.breakdown
    if isinstance(breakdown, dict):
        if isinstance(breakdown.get("step_peaks"), dict):
            breakdown["step_peaks"] = {s: v * k for s, v in breakdown["step_peaks"].items()}
        if breakdown.get("workspace_and_context_bytes"):
            breakdown["workspace_and_context_bytes"] *= k
    return replace(
        p,
        predicted_peak_bytes=p.predicted_peak_bytes * k,
        upper_bound_bytes=p.upper_bound_bytes * k,
        breakdown=breakdown,
    )


class GovernedPredictor:
    """A cached, corrected `MemoryModel` for one device profile and metric."""

    def __init__(
        self,
        model: MemoryModel,
        *,
        device: str,
        metric: str | None,
        corrector: ResidualCorrector | None = None,
        margin: float = 0.0,
        scenario: str = "worst",
        scale: int = 1,
    ) -> None:
        if margin < 0:
            raise ValueError(f"margin must be >= 0, got {margin}")
        self.model = model
        self.version = getattr(model, "version", "unknown")
        self.device, self.metric, self.scenario = device, metric, scenario
        self.corrector = corrector or ResidualCorrector()
        self.margin = margin
        self.scale = scale  # a device that counts every byte `scale` times (EmulatedDevice)
        self.steady = False  # set after the first optimizer step
        self.metric_name = metric or "allocated"  # what the model's predictions measure
        self._raw: dict[tuple[int, tuple[tuple[str, int], ...]], Prediction] = {}
        self._graphs: dict[int, StepGraph] = {}  # keeps cached graphs alive (ids stay valid)
        self._embeddings: dict[int, Any] = {}
        self._head_only = hasattr(model, "encode") and hasattr(model, "predict_encoded")
        self.model_calls = 0

    # ---- raw predictions ------------------------------------------------------------------
    def raw(self, graph: StepGraph, sizes: dict[str, int]) -> Prediction:
        key = (id(graph), tuple(sorted(sizes.items())))
        got = self._raw.get(key)
        if got is None:
            got = self._call(graph, [self._query(sizes)])[0]
            self.metric_name = got.metric
            if self.scale != 1:
                got = _scaled(got, self.scale)
            self._raw[key] = got
        return got

    def _query(self, sizes: dict[str, int]) -> Query:
        return Query(
            sizes=dict(sizes), device=self.device, metric=self.metric, scenario=self.scenario
        )

    def _call(self, graph: StepGraph, queries: Sequence[Query]) -> list[Prediction]:
        self._graphs[id(graph)] = graph
        self.model_calls += len(queries)
        if self._head_only:
            emb = self._embeddings.get(id(graph))
            if emb is None:
                emb = self._embeddings[id(graph)] = self.model.encode(graph)
            return list(self.model.predict_encoded(emb, graph, queries))
        return list(self.model.predict(graph, queries))

    @staticmethod
    def step_ratio(p: Prediction, which: str) -> float:
        """Peak of one step kind ("first" | "steady") / overall peak, from the breakdown's
        step peaks (1.0 when the model does not report them)."""
        steps = p.breakdown.get("step_peaks") if isinstance(p.breakdown, dict) else None
        if isinstance(steps, dict) and steps.get(which):
            top = max(v for v in steps.values() if isinstance(v, (int, float)))
            if top > 0:
                return min(1.0, steps[which] / top)
        return 1.0

    def raw_peak(
        self, graph: StepGraph, sizes: dict[str, int], which: str | None = None
    ) -> tuple[int, int]:
        """(predicted, upper bound) before correction, for a step kind: "first", "steady",
        or None = the max over both until `steady` is set (the first step is behind us),
        the steady state after."""
        p = self.raw(graph, sizes)
        which = which or ("steady" if self.steady else None)
        r = self.step_ratio(p, which) if which else 1.0
        return int(p.predicted_peak_bytes * r), int(p.upper_bound_bytes * r)

    def raw_peak_near(
        self, graph: StepGraph, sizes: dict[str, int], which: str | None = None, grid: int = 16
    ) -> tuple[int, int]:
        """`raw_peak` with S interpolated between multiples of `grid` (both cached): a
        per-step prediction for any actual length costs two cache lookups once warm. The
        peak is convex in S (a max of polynomials with non-negative coefficients), so the
        chord is an upper bound; it is exact on the grid."""
        seq = sizes.get("S")
        if seq is None or seq % grid == 0 or seq < grid:
            return self.raw_peak(graph, sizes, which)
        lo_s = seq - seq % grid
        lo = self.raw_peak(graph, {**sizes, "S": lo_s}, which)
        hi = self.raw_peak(graph, {**sizes, "S": lo_s + grid}, which)
        w = (seq - lo_s) / grid
        return int(lo[0] + w * (hi[0] - lo[0])), int(lo[1] + w * (hi[1] - lo[1]))

    # ---- corrected values ----------------------------------------------------------------
    def predicted(self, graph: StepGraph, sizes: dict[str, int], near: bool = False) -> int:
        raw = self.raw_peak_near(graph, sizes) if near else self.raw_peak(graph, sizes)
        return int(raw[0] * self.corrector.factor)

    def bound(self, graph: StepGraph, sizes: dict[str, int], near: bool = False) -> int:
        raw = self.raw_peak_near(graph, sizes) if near else self.raw_peak(graph, sizes)
        return int(raw[1] * self.corrector.bound_factor * (1.0 + self.margin))

    def predict(self, graph: StepGraph, queries: Sequence[Query]) -> list[Prediction]:
        """MemoryModel interface (for `plan`): corrected predictions and bounds."""
        out = []
        for q in queries:
            raw = self.raw(graph, q.sizes)
            out.append(
                replace(
                    raw,
                    predicted_peak_bytes=self.predicted(graph, q.sizes),
                    upper_bound_bytes=self.bound(graph, q.sizes),
                    model_version=f"{raw.model_version}+governor",
                )
            )
        return out

    def cache_size(self) -> int:
        return len(self._raw)
