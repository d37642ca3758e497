"""Bound calibration that transfers to unseen families, per (target kind, metric).

`cross_fit` deals the families of the calibration records into folds; for each, a fresh
head (on the frozen encoder's embeddings) is trained on the other folds and scores the
held-out one, so every record gets a (mu, upper) from a head that never saw its family.
`calibrate_groups` turns those residuals into the card's ``bound_calibration``
(`predictor.memory.calibration.fit_group` per group: ``cpu/allocated``, ``gpu/allocated``,
``gpu/reserved``, ``gpu/device_total``; the device total may take the reserved bound plus
the CUDA context as its bound, the ``derived`` form). Records whose answer is exact (CPU allocated
bytes of a one-path graph: `predictor.memory.trust.exact_reason`) are answered by the sweep
with no bound of the model's, so they are left out of their group.

`calibrated` applies a card's calibration to (mu, upper) arrays of a Dataset's records:
what `OnnxMemoryModel` answers, for evaluations in training and the benchmarks (a
correction outside the group's calibrated range falls back to the network-free bound,
as served: `predictor.memory.calibration.served_bound_log`; `fell_back` says which did).
"""

from __future__ import annotations

import copy
import logging
from typing import Any

import numpy as np
import torch
from memgnn.predictor.ir.vocab import METRICS
from memgnn.predictor.memory.calibration import (
    MIN_RESIDUALS,
    derived_log,
    fit_group,
    group_key,
    outside_range,
    served_bound_log,
)
from memgnn.predictor.memory.gnn import MemoryGNN, memory_loss
from memgnn.training.data import Dataset
from memgnn.training.fit import GraphSet, _embeddings, predict_log, summarize
from memgnn.training.fit_config import FitConfig

log = logging.getLogger(__name__)
RESERVED, TOTAL = group_key(True, "reserved"), group_key(True, "device_total")

__all__ = ["calibrate_groups", "calibrated", "cross_fit", "evaluate", "fell_back", "groups_of"]


def groups_of(data: Dataset) -> np.ndarray:
    """Per record, per metric [R, 3]: its calibration group ('' where unlabelled or
    answered exactly)."""
    from memgnn.predictor.spec.devices import get_profile

    gpu = np.array([get_profile(d).is_gpu for d in data.device])
    exact = data.exact if data.exact is not None else np.zeros(len(data), dtype=bool)
    out = np.full((len(data), len(METRICS)), "", dtype=object)
    for m, metric in enumerate(METRICS):
        labelled = ~np.isnan(data.y[:, m])
        for is_gpu in (False, True):
            sel = labelled & (gpu == is_gpu) & ~(exact & (metric == "allocated"))
            out[sel, m] = group_key(is_gpu, metric)
    return out


def cross_fit(
    model: MemoryGNN, data: Dataset, idx: np.ndarray, cfg: FitConfig, folds: int = 5
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(records, mu, upper) for `idx`'s records, each scored by a head trained without
    its family (at least 3 families; with fewer, the model's own head scores them)."""
    fam = np.array(data.family)
    families = sorted(set(fam[idx]))
    graphs = GraphSet(data)
    emb = _embeddings(model, graphs, sorted({graphs.index[data.keys[i]] for i in idx}))
    rec_graph = torch.from_numpy(np.array([graphs.index[k] for k in data.keys]))
    q = torch.from_numpy(data.q)
    if len(families) < 3:
        with torch.no_grad():
            head = copy.deepcopy(model.head).eval()
            head.calibration.zero_()
            out = head(emb[rec_graph[idx]], q[idx]).numpy().astype(np.float64)
        return idx, out[:, :3], out[:, 3:]
    y = torch.from_numpy(np.nan_to_num(data.y, nan=0.0))
    mask = torch.from_numpy(~np.isnan(data.y))
    rows, mus, uppers = [], [], []
    for k in range(min(folds, len(families))):
        held = np.isin(fam[idx], families[k::folds])
        tr, te = idx[~held], idx[held]
        head = copy.deepcopy(model.head)
        torch.manual_seed(cfg.seed + 1000 + k)
        head.reset_parameters()  # calibration buffer zeroed: the head's raw bound
        head.set_normalization(q[tr])
        opt = torch.optim.AdamW(head.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        rng = np.random.default_rng([cfg.seed, 1000 + k])
        for _ in range(cfg.calibration_epochs):
            order = rng.permutation(tr)
            for start in range(0, len(order), 256):
                b = order[start : start + 256]
                loss, _ = memory_loss(
                    head(emb[rec_graph[b]], q[b]), y[b], mask[b], model.config.quantile
                )
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
        with torch.no_grad():
            out = head.eval()(emb[rec_graph[te]], q[te]).numpy().astype(np.float64)
        rows.append(te)
        mus.append(out[:, :3])
        uppers.append(out[:, 3:])
    return np.concatenate(rows), np.concatenate(mus), np.concatenate(uppers)


def calibrate_groups(
    data: Dataset, rows: np.ndarray, mu: np.ndarray, upper: np.ndarray, target_miss: float
) -> dict[str, Any]:
    """The card's ``bound_calibration`` from cross-fitted (mu, upper) of `rows`."""
    groups = groups_of(data)[rows]
    out: dict[str, Any] = {}
    keys = sorted({g for g in groups.ravel() if g}, key=lambda k: (k == TOTAL, k))
    for key in keys:  # the device total last: its bound may derive from the reserved one
        ys, ms, us = [], [], []
        for m in range(len(METRICS)):
            sel = groups[:, m] == key
            ys.append(data.y[rows[sel], m])
            ms.append(mu[sel, m])
            us.append(upper[sel, m])
        y, mm, uu = np.concatenate(ys), np.concatenate(ms), np.concatenate(us)
        if len(y) < MIN_RESIDUALS:
            log.info("bound calibration: %s has %d residuals, keeping the head's bound", key,
                     len(y))  # fmt: skip
            continue
        derived = None
        sel = groups[:, 2] == key
        if key == TOTAL and RESERVED in out and (groups[sel, 1] == RESERVED).all():
            _, res_bound, _ = served_bound_log(mu[sel, 1], upper[sel, 1], out[RESERVED])
            an = data.analytic[rows[sel]]
            derived = derived_log(an[:, 1], an[:, 2], res_bound)
        fitted = out[key] = fit_group(y, mm, uu, target_miss, derived)
        log.info("bound calibration %s: %s q=%.4f over %d (median margin %.2f%%)", key,
                 fitted["form"], fitted["q"], len(y), 100 * fitted["median_margin"])  # fmt: skip
    return out


def _served(data: Dataset, idx: np.ndarray, mu: np.ndarray, upper: np.ndarray,
            cal: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    """(log corrections, log bounds, fell back) [len(idx), 3] per record's group."""
    groups = groups_of(data)[idx]
    value, bound = np.array(mu, dtype=np.float64), np.array(upper, dtype=np.float64)
    fell = np.zeros(value.shape, dtype=bool)
    for m in range(len(METRICS)):
        for key in {g for g in groups[:, m] if g}:
            sel = groups[:, m] == key
            derived = None
            if (cal.get(key) or {}).get("form") == "derived":  # reserved (m=1) came first
                if not (groups[sel, 1] == RESERVED).all():
                    raise ValueError(f"{key}: a bound derived from the reserved one needs "
                                     "reserved estimates for the same records")  # fmt: skip
                an = data.analytic[idx[sel]]  # reserved falls back where the total does
                ood = outside_range(mu[sel, m], cal[key])
                res = served_bound_log(mu[sel, 1], upper[sel, 1], cal.get(RESERVED), ood)[1]
                derived = derived_log(an[:, 1], an[:, 2], res)
            value[sel, m], bound[sel, m], fell[sel, m] = served_bound_log(
                mu[sel, m], upper[sel, m], cal.get(key), None, derived
            )
    return value, bound, fell


def calibrated(
    data: Dataset, idx: np.ndarray, mu: np.ndarray, upper: np.ndarray, cal: dict[str, Any]
) -> tuple[np.ndarray, np.ndarray]:
    """(predicted bytes, bound bytes) [len(idx), 3] as the served model answers them:
    analytic x exp(correction) and the group's calibrated bound, never below the
    prediction; records answered exactly get the analytic estimate for both (allocated)."""
    value, log_bound, _ = _served(data, idx, mu, upper, cal)
    an = data.analytic[idx]
    pred, bound = an * np.exp(value), an * np.exp(log_bound)
    if data.exact is not None:
        ex = data.exact[idx]
        pred[ex, 0] = bound[ex, 0] = an[ex, 0]
    return pred, np.maximum(bound, pred)


def fell_back(
    data: Dataset, idx: np.ndarray, mu: np.ndarray, upper: np.ndarray, cal: dict[str, Any]
) -> np.ndarray:
    """[len(idx), 3]: the record's correction was outside its group's calibrated range, so
    its bound is the network-free fallback (`calibrated`)."""
    return _served(data, idx, mu, upper, cal)[2]


def evaluate(model: MemoryGNN, data: Dataset, idx: np.ndarray, cal: dict[str, Any]) -> dict:
    """`training.fit.evaluate` with the calibrated bounds and exact answers of `calibrated`:
    error summaries per label source and metric, plus `primary`."""
    if len(idx) == 0:
        return {}
    mu, upper = predict_log(model, data, idx)
    pred, bound = calibrated(data, idx, mu, upper, cal)
    return summarize(data, idx, pred, bound)
