"""What a learned answer may claim: hard floors, and the range the model was trained on.

A learned correction is only as good as the corpus behind it. Two rules keep an answer
honest far from that corpus:

- **Floors.** The liveness sweep's tensor peak is bytes the step really holds at once
  (exact, rounded to the CUDA allocator's 512-byte blocks on a GPU), so `allocated` is
  never predicted below it; `reserved` is at least that rounded up to whole 2 MiB
  segments (every segment the caching allocator reserves is a multiple of 2 MiB), and
  `device_total` at least reserved plus the profile's CUDA context.
- **Training range.** The model card's `training_range` records the largest batch B and
  the largest tokens (product of the input sizes) in the training split, and optionally
  the [min, max] of each query feature. A query beyond the batch range is answered with
  the correction learned at the range's edge (same graph, same other sizes), applied to
  the analytic estimate at the real size: monotone in B wherever the analytic estimate
  is, instead of whatever the network does outside what it saw. Every answer lists in
  `breakdown["extrapolated"]` why it is outside the range ([] when inside).
- **Exact answers stay exact.** Where the sweep *is* the label, a learned correction can
  only move the answer off it, so none is applied (`exact_reason`). Per (target, metric):
  a CPU target's `allocated` is the liveness sweep of the storages the step creates (the
  `cpu` backend measures a real step with the same recorder: `benchmarks/sim_vs_cpu.py`,
  32 of 32 configs to the byte outside AMP), so it is exact for a graph with one path,
  no data-dependent sizes and no autocast (AMP's weight-cast cache made up to 0.055%
  of difference there). A graph with branches or data-dependent sizes is exact per path,
  but which path the data takes is not, so the learned model still answers. On a GPU
  profile no metric is exact from the sweep (kernel scratch, workspaces and the caching
  allocator's segments): the exact answer there is the allocator replay
  (`predictor.answer.exact.ReplayModel`).
- **Out of distribution, said and bounded without the network.** A query outside the
  training range, a graph with ops outside the vocabulary, or a head correction outside
  the corrections measured in the calibration corpus (`calibration.outside_range`) gets
  the group's network-free fallback bound (the analytic sweep times a calibrated constant:
  `calibration.served_bound_log`) instead of the network's, and `breakdown["trust"]`
  (`trust_fields`) says whether the answer is in distribution, why not, and which bound
  it carries.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from memgnn.predictor.memory.features import QUERY_COLUMNS

__all__ = [
    "SEGMENT",
    "batch_cap",
    "exact_reason",
    "extrapolation_notes",
    "floors",
    "training_range",
    "trust_fields",
]

SEGMENT = 2 << 20  # every caching-allocator segment is a multiple of 2 MiB


def floors(tensor_peak: float, is_gpu: bool, context_bytes: int) -> np.ndarray:
    """Bytes each metric (allocated, reserved, device_total) is at least, given the
    sweep's exact tensor peak (already block-rounded on a GPU)."""
    peak = float(tensor_peak)
    if not is_gpu:
        return np.array([peak, peak, peak])
    reserved = math.ceil(peak / SEGMENT) * SEGMENT
    return np.array([peak, float(reserved), float(reserved + context_bytes)])


def exact_reason(graph: Any, is_gpu: bool, metric: str) -> str | None:
    """Why the sweep's answer for `metric` on this graph and target is exact, or None
    where it is not (see the module docstring: CPU allocated bytes of a one-path graph
    without data-dependent sizes or autocast)."""
    if is_gpu or metric != "allocated":
        return None
    if len(graph.paths) != 1 or graph.data_symbols:
        return None
    if str(graph.train.get("precision", "fp32")).startswith("amp"):
        return None
    return (
        "cpu allocated bytes of a one-path step: the liveness sweep is the step's tensor "
        "peak, no learned correction applied"
    )


def _unlog(value: float, scale: float) -> int:
    """Inverse of `features.log_scale` (rounded to the nearest int)."""
    return round(2.0 ** (value * scale) - 1.0)


def training_range(q: np.ndarray) -> dict[str, Any]:
    """The card's `training_range` from the training split's query features [R, F]."""
    cols = {name: k for k, name in enumerate(QUERY_COLUMNS)}
    lo, hi = q.min(axis=0), q.max(axis=0)
    return {
        "B": [_unlog(lo[cols["log_b"]], 16), _unlog(hi[cols["log_b"]], 16)],
        "tokens": [_unlog(lo[cols["log_tokens"]], 40), _unlog(hi[cols["log_tokens"]], 40)],
        "query_features": {"min": lo.astype(float).tolist(), "max": hi.astype(float).tolist()},
        "source": "training split query features",
    }


def _tokens(sizes: Mapping[str, int], symbols: Any) -> int:
    return math.prod(int(v) for k, v in sizes.items() if k in symbols)


def batch_cap(sizes: Mapping[str, int], symbols: Any, rng: Mapping[str, Any]) -> int | None:
    """The largest B inside the range at these other sizes (None: no B or no range)."""
    if "B" not in sizes or "B" not in symbols or not rng.get("B"):
        return None
    cap = int(rng["B"][1])
    if rng.get("tokens"):
        other = _tokens({k: v for k, v in sizes.items() if k != "B"}, symbols)
        cap = min(cap, max(1, int(rng["tokens"][1]) // max(other, 1)))
    return max(cap, 1)


def extrapolation_notes(
    sizes: Mapping[str, int],
    symbols: Any,
    rng: Mapping[str, Any],
    features: np.ndarray | None = None,
) -> list[str]:
    """Why a query lies outside the training range, one sentence each ([] if inside)."""
    notes = []
    b = sizes.get("B")
    cap = batch_cap(sizes, symbols, rng)
    if cap is not None and b is not None and b > cap:
        notes.append(
            f"B={b} is beyond the corpus's range (B <= {rng['B'][1]}, at most "
            f"{rng.get('tokens', [0, '?'])[1]} tokens): the correction learned at B={cap} "
            "is applied to the analytic estimate"
        )
    if rng.get("tokens"):
        per_sample = _tokens({k: v for k, v in sizes.items() if k != "B"}, symbols)
        if per_sample > int(rng["tokens"][1]):
            notes.append(
                f"{per_sample} tokens per sample is above the corpus's largest "
                f"{rng['tokens'][1]} (the correction is the network's extrapolation)"
            )
    span = rng.get("query_features")
    if span is not None and features is not None:
        lo, hi = np.asarray(span["min"]), np.asarray(span["max"])
        eps = 1e-6 + 1e-3 * (hi - lo)
        outside = np.flatnonzero((features < lo - eps) | (features > hi + eps))
        skip = {"log_b", "log_tokens"}  # said above in words
        names = [QUERY_COLUMNS[k] for k in outside if QUERY_COLUMNS[k] not in skip]
        if names:
            notes.append(f"query features outside the training range: {', '.join(names)}")
    return notes


def trust_fields(
    *,
    exact: str | None,
    notes: list[str],
    unknown_ops: list[str],
    cal: Mapping[str, Any] | None,
    fell_back: bool,
    correction_outside: bool,
) -> dict[str, Any]:
    """`breakdown["trust"]`: {in_distribution, reasons, bound} for one answer. `notes` are
    its `extrapolation_notes`, `correction_outside` whether the head's correction was
    outside the calibration's `correction_range`, `fell_back` whether the bound is the
    network-free fallback."""
    if exact is not None:
        return {"in_distribution": True, "reasons": [], "bound": "exact (the sweep)"}
    reasons = list(notes)
    if unknown_ops:
        reasons.append(f"ops outside the model's vocabulary: {', '.join(unknown_ops)}")
    if correction_outside and cal and cal.get("correction_range"):
        lo, hi = cal["correction_range"]
        reasons.append(
            f"the network's correction is outside the x{math.exp(lo):.3g}..x{math.exp(hi):.3g} "
            "measured / analytic seen in calibration: clipped into it"
        )
    miss = (cal or {}).get("target_miss")
    at = f"at {miss:.0%} miss" if miss is not None else "at an unrecorded miss rate"
    if fell_back and cal and cal.get("form") == "derived":
        bound = f"network-free fallback: the reserved one + CUDA context (calibrated {at})"
    elif fell_back:
        q = float(cal["fallback"]["q"])  # type: ignore[index]
        bound = (
            f"network-free fallback: analytic x {math.exp(q):.4g} (calibrated {at} on "
            "unseen families)"
        )
    elif cal:
        form = "reserved bound + CUDA context" if cal["form"] == "derived" else cal["form"]
        bound = f"calibrated ({form}) {at} on unseen families"
    else:
        bound = "the head's own (no bound calibration in the model card)"
    return {"in_distribution": not reasons, "reasons": reasons, "bound": bound}
