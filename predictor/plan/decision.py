"""The reasoning behind a plan's choice, in the terms users reason in: state and activations.

A user sizing a run by hand says "28 GB of parameters and optimizer state, 1.2 GB of
activations per sample, so at most (68 - 28) / 1.2 = 33 samples fit". `Decision` gives
those numbers for a plan's candidate, measured on the same predictions the plan used:

- `state_bytes`: what the step keeps whatever the batch, the peak live bytes of the
  `parameter`, `gradient` and `optimizer_state` storages of the captured graph together
  (tensor bytes, one rank's shard under sharding), with each category's own peak;
- `per_sample_bytes`: the slope in B of the bound, (bound(B) - bound(1)) / (B - 1) between
  B = 1 and the chosen B (B = 2 when the choice is 1): what one more sample costs,
  activations and the temporaries that grow with them, in the plan's metric;
- `fixed_bytes`: the bound's intercept, bound(1) - slope: the state plus what does not
  grow with B (communication buffers, cuBLAS workspaces, allocator segments);
- `theoretical_max_batch`: floor((limit - fixed) / slope), the largest batch a straight
  line through those two points allows; the plan's own answer comes from the predictions
  at each batch (allocator rounding makes the real curve a staircase).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from memgnn.predictor.ir.graph import StepGraph
from memgnn.predictor.ir.vocab import CATEGORIES
from memgnn.predictor.memory.analytic import live_curve

__all__ = ["STATE_CATEGORIES", "Decision", "decide", "state_bytes"]

STATE_CATEGORIES = ("parameter", "gradient", "optimizer_state")


@dataclass(kw_only=True, slots=True)
class Decision:
    state_bytes: int | None  # params + grads + optimizer state at their joint peak
    state_by_category: dict[str, int]
    per_sample_bytes: int | None  # slope of the bound in B
    fixed_bytes: int | None  # intercept of the bound in B
    theoretical_max_batch: int | None  # floor((limit - fixed) / per_sample)
    slope_batches: tuple[int, int] | None  # the two batch sizes the slope is taken between
    limit_bytes: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def state_bytes(graph: StepGraph, sizes: dict[str, int]) -> dict[str, int]:
    """Peak live tensor bytes of each state category over the step, and of all three
    together (`total`), at `sizes` (the state does not depend on them; every symbol of the
    graph needs a value all the same), the largest over the graph's paths."""
    resolved = graph.resolve_sizes(sizes)
    out = dict.fromkeys((*STATE_CATEGORIES, "total"), 0)
    for k, path in enumerate(graph.paths):
        nbytes = graph.storage_bytes(k, resolved)
        cats = np.asarray(path.storages["category"], dtype=np.int64)
        wanted = {name: [CATEGORIES.index(name)] for name in STATE_CATEGORIES}
        wanted["total"] = [CATEGORIES.index(name) for name in STATE_CATEGORIES]
        for name, idx in wanted.items():
            masked = np.where(np.isin(cats, idx), nbytes, 0)
            initial, live = live_curve(graph, k, masked)
            out[name] = max(out[name], initial, int(live.max()) if len(live) else 0)
    return out


def decide(bounds_at: Any, graph: Any, sizes: dict[str, int], batch: int, limit: int) -> Decision:
    """The `Decision` for a candidate at `batch`: `bounds_at((1, b))` gives the bounds the
    plan compares with `limit` at batch 1 and b, from one model (None where it cannot
    say, e.g. a guard fails)."""
    state = state_bytes(graph, {**sizes, "B": 1}) if isinstance(graph, StepGraph) else {}
    other = batch if batch > 1 else 2
    pair = bounds_at((1, other))
    slope = fixed = most = None
    if pair is not None:
        one, at = pair
        slope = round((at - one) / (other - 1))
        fixed = one - slope
        if slope > 0:
            most = max(0, (limit - fixed) // slope)
    return Decision(
        state_bytes=state.get("total"),
        state_by_category={k: v for k, v in state.items() if k != "total"},
        per_sample_bytes=slope,
        fixed_bytes=fixed,
        theoretical_max_batch=most,
        slope_batches=(1, other) if slope is not None else None,
        limit_bytes=limit,
    )
