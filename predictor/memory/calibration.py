"""The upper bound's calibration: a conformal quantile per (target kind, metric).

The head gives, per metric, a log correction ``mu`` and a log upper bound ``upper`` (a
pinball-loss quantile, ``upper - mu`` its spread ``s > 0``). Their coverage on unseen
families is what matters, and it differs by target and metric: a CPU step's allocated
bytes are the sweep's (no spread at all), a GPU's reserved bytes carry the caching
allocator's history. One shift per metric over both (the old calibration) made the bound
as loose as the worst of them everywhere.

`fit_group` takes held-out residuals of one group (cross-fitted: each scored by a head
that never saw its family) and picks the tightest of three split-conformal bounds at the
wanted miss rate, by their median margin over the residuals:

- ``shift``: ``upper + q``, q the conformal quantile of ``y - upper``;
- ``scaled``: ``mu + q * s``, q that of ``(y - mu) / s`` (larger where the head is unsure);
- ``plain``: ``mu + q``, q that of ``y - mu``;
- ``analytic``: ``q``, q that of ``y`` itself: the analytic sweep times a constant, no
  network in it. On unseen families it is often the tightest (corpus-v1, 4 leave-family-
  out folds at 2% miss: chosen for gpu/allocated in 3 of 4 folds, held-out median margin
  2.0% vs 3.8% with the head's forms only: `benchmarks/results/accuracy_bound.md`), since
  the head's spread learned on some families does not transfer to others.

A group may also be given a bound derived from another's (``derived``: the device total
is the reserved bytes plus the profile's CUDA context, so its bound is the reserved bound
plus the context, `derived_log`); that candidate, ``derived + q``, competes like the
others (corpus-v1 at 2% miss: sim-gpu device_total median margin 23.8% vs 43.1% for the
head's forms, `benchmarks/results/accuracy_bound.md`).

Every group also keeps that network-free bound as its ``fallback`` and the range of the
measured log corrections ``y`` over the calibration records (``correction_range``: how far
measured bytes ever were from the analytic sweep in the corpus). `served_bound_log`
applies a group's calibration the way the served model does: a head correction outside
that range (widened by ``RANGE_TOLERANCE``) is one no measurement supports and the
conformal quantile says nothing about (the network extrapolating: a 16x correction on a
config far from the corpus gave a 7.27 TiB bound; cross-fitted heads answer up to e^10 on
some unseen families), so such a record gets the fallback bound and its correction is
clipped into the range.

The result goes in the model card (``bound_calibration``: group -> {form, q, n, ...});
`bound_log` applies it. Groups are ``cpu/allocated``, ``gpu/allocated``, ``gpu/reserved``,
``gpu/device_total`` (`group_key`); a group without enough residuals falls back to the
head's own bound.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = [
    "FORMS",
    "MIN_RESIDUALS",
    "bound_log",
    "conformal_quantile",
    "derived_log",
    "fit_group",
    "group_key",
    "outside_range",
    "served_bound_log",
]

FORMS = ("shift", "scaled", "plain", "analytic", "derived")
MIN_RESIDUALS = 20  # below this a quantile at 1-2% miss says nothing: keep the head's bound
_EPS = 1e-6
RANGE_TOLERANCE = 0.02  # log units a correction may pass correction_range by


def group_key(is_gpu: bool, metric: str) -> str:
    return f"{'gpu' if is_gpu else 'cpu'}/{metric}"


def conformal_quantile(scores: np.ndarray, target_miss: float) -> float:
    """The split-conformal (1 - target_miss) quantile: the ceil((n + 1)(1 - miss))-th
    smallest score (the largest when n is too small for that rank)."""
    if not 0.0 < target_miss < 0.5:
        raise ValueError(f"target_miss must be in (0, 0.5), got {target_miss}")
    s = np.sort(np.asarray(scores, dtype=np.float64))
    if len(s) == 0:
        raise ValueError("no scores to take a quantile of")
    k = min(len(s), math.ceil((len(s) + 1) * (1.0 - target_miss))) - 1
    return float(s[k])


def derived_log(reserved_analytic, total_analytic, reserved_log_bound) -> np.ndarray:
    """The device total's log bound (relative to its analytic estimate) implied by the
    reserved one: reserved bound bytes plus the context (the two estimates' difference)."""
    res, tot = np.asarray(reserved_analytic, np.float64), np.asarray(total_analytic, np.float64)
    bound = res * np.exp(np.asarray(reserved_log_bound, np.float64)) + (tot - res)
    return np.log(np.maximum(bound, 1.0)) - np.log(np.maximum(tot, 1.0))


def _bound(form: str, q: float, mu: np.ndarray, upper: np.ndarray, derived=None) -> np.ndarray:
    if form == "derived":
        if derived is None:
            raise ValueError("a 'derived' bound needs the bound it derives from (derived_log)")
        return np.asarray(derived, dtype=np.float64) + q
    if form == "shift":
        return upper + q
    if form == "scaled":
        return mu + q * np.maximum(upper - mu, _EPS)
    if form == "plain":
        return mu + q
    if form == "analytic":
        return np.full_like(mu, q)
    raise ValueError(f"unknown bound form {form!r}; expected one of {FORMS}")


def fit_group(
    y: np.ndarray,
    mu: np.ndarray,
    upper: np.ndarray,
    target_miss: float,
    derived: np.ndarray | None = None,
) -> dict:
    """The tightest conformal bound of one group's held-out log residuals (see the module
    docstring): {form, q, n, target_miss, median_margin, candidates, fallback,
    correction_range}."""
    y, mu, upper = (np.asarray(a, dtype=np.float64) for a in (y, mu, upper))
    if not (len(y) == len(mu) == len(upper)):
        raise ValueError("y, mu and upper must have the same length")
    s = np.maximum(upper - mu, _EPS)
    scores = {"shift": y - upper, "scaled": (y - mu) / s, "plain": y - mu, "analytic": y}
    if derived is not None:
        derived = np.asarray(derived, dtype=np.float64)
        scores["derived"] = y - derived
    candidates = {}
    for form, sc in scores.items():
        q = conformal_quantile(sc, target_miss)
        margin = float(np.median(np.expm1(_bound(form, q, mu, upper, derived) - y)))
        candidates[form] = {"q": q, "median_margin": margin}
    best = min(candidates, key=lambda f: candidates[f]["median_margin"])
    return {
        "form": best,
        "q": candidates[best]["q"],
        "n": len(y),
        "target_miss": target_miss,
        "median_margin": candidates[best]["median_margin"],
        "candidates": candidates,
        "fallback": {"form": "analytic", "q": candidates["analytic"]["q"]},
        "correction_range": [float(y.min()), float(y.max())] if len(y) else None,
    }


def bound_log(
    mu: np.ndarray, upper: np.ndarray, cal: dict[str, Any] | None, derived=None
) -> np.ndarray:
    """The calibrated log upper bound of a group (`cal` one entry of the card's
    ``bound_calibration``; None: the head's bound as it is). Never below ``mu``."""
    mu, upper = np.asarray(mu, dtype=np.float64), np.asarray(upper, dtype=np.float64)
    if cal is None:
        return upper
    return np.maximum(_bound(cal["form"], float(cal["q"]), mu, upper, derived), mu)


def outside_range(mu: np.ndarray, cal: dict[str, Any] | None) -> np.ndarray:
    """Per record: its log correction lies outside the group's ``correction_range`` widened
    by ``RANGE_TOLERANCE`` (False where the calibration has none)."""
    mu = np.asarray(mu, dtype=np.float64)
    span = (cal or {}).get("correction_range")
    if not span:
        return np.zeros(mu.shape, dtype=bool)
    return (mu < span[0] - RANGE_TOLERANCE) | (mu > span[1] + RANGE_TOLERANCE)


def served_bound_log(
    mu: np.ndarray,
    upper: np.ndarray,
    cal: dict[str, Any] | None,
    ood: np.ndarray | None = None,
    derived: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(log correction, log bound, fell back) as served: records out of distribution
    (`ood`, or a correction outside ``correction_range``) get the correction clipped into
    that range and the network-free ``fallback`` bound, never below the correction;
    the others `bound_log` (`derived`: for a ``derived`` form; its fallback is the derived
    bound itself, `derived` then being made from the reserved fallback). Without a
    calibration (or a fallback in it) the head's bound stays and nothing falls back."""
    mu, upper = np.asarray(mu, dtype=np.float64), np.asarray(upper, dtype=np.float64)
    out = outside_range(mu, cal)
    if ood is not None:
        out = out | np.asarray(ood, dtype=bool)
    bound = bound_log(mu, upper, cal, derived)
    fallback = (cal or {}).get("fallback")
    if fallback is None or not out.any():
        return mu, bound, np.zeros(mu.shape, dtype=bool)
    lo, hi = cal.get("correction_range") or (-np.inf, np.inf)
    value = np.where(out, np.clip(mu, lo, hi), mu)
    if cal.get("form") == "derived" and derived is not None:  # from the reserved fallback
        safe = np.maximum(_bound("derived", float(cal["q"]), value, value, derived), value)
    else:
        safe = np.maximum(_bound(fallback["form"], float(fallback["q"]), value, value), value)
    return value, np.where(out, safe, bound), out
