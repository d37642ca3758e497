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
- ``plain``: ``mu + q``, q that of ``y - mu``.

The result goes in the model card (``bound_calibration``: group -> {form, q, n, ...});
`bound_log` applies it. Groups are ``cpu/allocated``, ``gpu/allocated``, ``gpu/reserved``,
``gpu/device_total`` (`group_key`); a group without enough residuals falls back to the
head's own bound.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["FORMS", "MIN_RESIDUALS", "bound_log", "conformal_quantile", "fit_group", "group_key"]

FORMS = ("shift", "scaled", "plain")
MIN_RESIDUALS = 20  # below this a quantile at 1-2% miss says nothing: keep the head's bound
_EPS = 1e-6


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


def _bound(form: str, q: float, mu: np.ndarray, upper: np.ndarray) -> np.ndarray:
    if form == "shift":
        return upper + q
    if form == "scaled":
        return mu + q * np.maximum(upper - mu, _EPS)
    if form == "plain":
        return mu + q
    raise ValueError(f"unknown bound form {form!r}; expected one of {FORMS}")


def fit_group(y: np.ndarray, mu: np.ndarray, upper: np.ndarray, target_miss: float) -> dict:
    """The tightest conformal bound of one group's held-out log residuals (see the module
    docstring): {form, q, n, target_miss, median_margin, candidates}."""
    y, mu, upper = (np.asarray(a, dtype=np.float64) for a in (y, mu, upper))
    if not (len(y) == len(mu) == len(upper)):
        raise ValueError("y, mu and upper must have the same length")
    s = np.maximum(upper - mu, _EPS)
    scores = {"shift": y - upper, "scaled": (y - mu) / s, "plain": y - mu}
    candidates = {}
    for form, sc in scores.items():
        q = conformal_quantile(sc, target_miss)
        margin = float(np.median(np.expm1(_bound(form, q, mu, upper) - y)))
        candidates[form] = {"q": q, "median_margin": margin}
    best = min(candidates, key=lambda f: candidates[f]["median_margin"])
    return {
        "form": best,
        "q": candidates[best]["q"],
        "n": len(y),
        "target_miss": target_miss,
        "median_margin": candidates[best]["median_margin"],
        "candidates": candidates,
    }


def bound_log(mu: np.ndarray, upper: np.ndarray, cal: dict[str, Any] | None) -> np.ndarray:
    """The calibrated log upper bound of a group (`cal` one entry of the card's
    ``bound_calibration``; None: the head's bound as it is). Never below ``mu``."""
    mu, upper = np.asarray(mu, dtype=np.float64), np.asarray(upper, dtype=np.float64)
    if cal is None:
        return upper
    return np.maximum(_bound(cal["form"], float(cal["q"]), mu, upper), mu)
