"""Training data: corpus records turned into encoder inputs, query features and targets.

One `Sample` per usable record (no error, no simulated OOM): the graph path it is scored
on (of a multi-path graph, the one with the largest analytic estimate, as the label is
the worst path's), its query features, the analytic estimate of each metric, and the
target `log(measured / analytic)` per metric (NaN where the backend has no such metric).
Graph inputs are computed once per (graph id, path). `split` holds out whole families
(leave-family-out test) and draws the validation set at random from the rest: whole
families (`family`, the default: early stopping and bound calibration then see what an
unseen architecture looks like), graphs (`graph`: unseen model/training configs of seen
families) or records (`random`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from memgnn.predictor.ir.vocab import METRICS
from memgnn.predictor.memory.features import GraphInputs, graph_inputs
from memgnn.predictor.memory.query_features import PathContext
from memgnn.predictor.memory.trust import exact_reason

log = logging.getLogger(__name__)

VAL_BY = ("family", "graph", "random")
LABEL_FIELDS = ("peak_allocated_bytes", "peak_reserved_bytes", "device_total_bytes")


def source_of(record: dict[str, Any]) -> str:
    """Label source: sim-gpu (simulated allocator on a GPU profile), cpu (real CPU run),
    cuda (real GPU), or sim-cpu."""
    if record["backend"] == "sim":
        return "sim-cpu" if record["device"] == "cpu" else "sim-gpu"
    return record["backend"]


@dataclass(kw_only=True, slots=True)
class Dataset:
    keys: list[tuple[str, int]]  # (graph id, path) per sample
    q: np.ndarray  # float32 [R, NUM_QUERY_FEATURES]
    y: np.ndarray  # float32 [R, 3]; NaN where unlabelled
    analytic: np.ndarray  # float64 [R, 3]: the base estimate the model corrects
    baseline: np.ndarray  # float64 [R, 3]: `predict.AnalyticModel`'s answer
    measured: np.ndarray  # float64 [R, 3]; NaN where unlabelled
    family: list[str]
    source: list[str]
    device: list[str]
    job_id: list[str]
    graphs: dict[tuple[str, int], GraphInputs] = field(default_factory=dict)
    data_hash: str = ""
    # what `load_dataset(allow_corrupt=True)` left out: corrupt parts (file -> why),
    # corrupt graphs (id -> why) and the number of records that named them
    dropped: dict[str, Any] = field(default_factory=dict)
    # per record: its allocated answer is exact (`predictor.memory.trust.exact_reason`: the sweep
    # on a CPU target), so the learned model does not correct it
    exact: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.keys)

    def primary_metric(self) -> np.ndarray:
        """Per sample: index of the metric it is judged on (reserved on GPUs, else allocated)."""
        return np.where(np.isnan(self.y[:, 1]), 0, 1)


def load_dataset(
    corpus_dir: str | Path, *, families: list[str] | None = None, allow_corrupt: bool = False
) -> Dataset:
    """Every usable record of a corpus (optionally only some families) as a Dataset.

    A corpus part that does not read or a graph file that does not load raises ValueError
    naming them, unless `allow_corrupt`: then their records are left out and the Dataset's
    `dropped` says what was left out."""
    from memgnn.dataset.corpus import Corpus
    from memgnn.predictor.spec.devices import get_profile

    corpus = Corpus(corpus_dir)
    rows = [r for r in corpus.records() if r["graph_id"]]
    rows = [r for r in rows if not (r.get("stats") or {}).get("would_oom")]
    if families:
        rows = [r for r in rows if r["family"] in families]
    loaded: dict[str, Any] = {}
    bad: dict[str, str] = {}
    for gid in sorted({r["graph_id"] for r in rows}):
        try:
            loaded[gid] = corpus.graph(gid)
        except ValueError as exc:
            bad[gid] = str(exc)
    dropped = _check_integrity(corpus_dir, corpus.corrupt_parts, bad, rows, allow_corrupt)
    rows = [r for r in rows if r["graph_id"] not in bad]
    rows.sort(key=lambda r: r["job_id"])
    if not rows:
        raise ValueError(f"{corpus_dir}: no usable records (with a graph, without error)")
    asks: dict[str, list[tuple[int, tuple]]] = {}  # graph id -> (row, query) pairs
    for i, r in enumerate(rows):
        gid = r["graph_id"]
        scenario = (r.get("stats") or {}).get("scenario") or "balanced"
        sizes = {s: int(v) for s, v in r["sizes"].items() if s in loaded[gid].symbols}
        asks.setdefault(gid, []).append((i, (sizes, get_profile(r["device"]), scenario)))
    best: list[Any] = [None] * len(rows)  # per row: (path, QueryResult) of its worst path
    for gid, pairs in asks.items():  # one batch of queries per graph path
        graph = loaded[gid]
        per_path = [PathContext(graph, k).query_many([a for _, a in pairs])
                    for k in range(len(graph.paths))]  # fmt: skip
        for j, (i, _) in enumerate(pairs):
            path = max(range(len(per_path)), key=lambda k: per_path[k][j].analytic[0])
            best[i] = (path, per_path[path][j])
    keys, qs, ys, an, base, meas = [], [], [], [], [], []
    for r, (path, res) in zip(rows, best, strict=True):
        measured = np.array([np.nan if r[f] is None else float(r[f]) for f in LABEL_FIELDS])
        if not get_profile(r["device"]).is_gpu:
            measured[1:] = np.nan
        keys.append((r["graph_id"], path))
        qs.append(res.features)
        an.append(res.analytic)
        base.append(res.baseline)
        meas.append(measured)
        ys.append(np.log(measured) - np.log(np.maximum(res.analytic, 1.0)))
    graphs: dict[tuple[str, int], GraphInputs] = {}
    for key in dict.fromkeys(keys):
        graphs[key] = graph_inputs(loaded[key[0]], key[1])
    data = Dataset(
        keys=keys,
        q=np.stack(qs).astype(np.float32),
        y=np.stack(ys).astype(np.float32),
        analytic=np.stack(an),
        baseline=np.stack(base),
        measured=np.stack(meas),
        family=[r["family"] for r in rows],
        source=[source_of(r) for r in rows],
        device=[r["device"] for r in rows],
        job_id=[r["job_id"] for r in rows],
        graphs=graphs,
        data_hash=data_hash(rows),
        dropped=dropped,
        exact=np.array(
            [
                exact_reason(loaded[r["graph_id"]], get_profile(r["device"]).is_gpu, "allocated")
                is not None
                for r in rows
            ]
        ),  # fmt: skip
    )
    log.info(
        "loaded %d records over %d graph paths, %d families from %s",
        len(data),
        len(graphs),
        len(set(data.family)),
        corpus_dir,
    )
    return data


def _check_integrity(corpus_dir, parts: dict[str, str], graphs: dict[str, str], rows,
                     allow: bool) -> dict[str, Any]:  # fmt: skip
    """What corruption leaves out of training; ValueError unless `allow`."""
    if not parts and not graphs:
        return {}
    n = sum(r["graph_id"] in graphs for r in rows)
    said = [f"part {name} does not read ({why})" for name, why in sorted(parts.items())]
    said += [f"graph {gid} ({why})" for gid, why in sorted(graphs.items())]
    text = "; ".join(said)
    if not allow:
        raise ValueError(
            f"{corpus_dir}: corrupt corpus: {text}. Run `memgnn dataset build` with the "
            "corpus's arguments to repair it (it redoes those jobs and re-captures the graphs)"
            ", or pass --allow-corrupt to train without them"
        )
    log.warning("%s: training without corrupt data (%d records left out): %s", corpus_dir, n, text)
    return {"corrupt_parts": dict(parts), "corrupt_graphs": dict(graphs), "records": n}


def data_hash(rows: list[dict[str, Any]]) -> str:
    """SHA-256 over what training reads from each record (job, graph, labels), sorted."""
    h = hashlib.sha256()
    for r in sorted(rows, key=lambda r: r["job_id"]):
        item = [r["job_id"], r["graph_id"], r["device"], r["sizes"], *(r[f] for f in LABEL_FIELDS)]
        h.update(json.dumps(item, sort_keys=True, default=str).encode())
    return h.hexdigest()


@dataclass(kw_only=True, slots=True)
class Split:
    train: np.ndarray
    val: np.ndarray
    test: np.ndarray  # held-out families (empty when none are held out)
    holdout_families: list[str]

    def summary(self) -> dict[str, int]:
        return {"train": len(self.train), "val": len(self.val), "test": len(self.test)}


def split(
    data: Dataset,
    *,
    holdout_families: list[str],
    val_fraction: float = 0.15,
    val_by: str = "family",
    seed: int = 0,
) -> Split:
    """Leave-family-out test set plus a seeded random validation split of the rest."""
    if val_by not in VAL_BY:
        raise ValueError(f"val_by must be one of {VAL_BY}, got {val_by!r}")
    if not 0.0 < val_fraction < 0.5:
        raise ValueError(f"val_fraction must be in (0, 0.5), got {val_fraction}")
    unknown = set(holdout_families) - set(data.family)
    if unknown:
        raise ValueError(f"held-out families {sorted(unknown)} are not in the corpus")
    fam = np.array(data.family)
    test = np.flatnonzero(np.isin(fam, holdout_families))
    rest = np.flatnonzero(~np.isin(fam, holdout_families))
    if len(rest) < 2:
        raise ValueError("too few records left for training after the held-out families")
    rng = random.Random(seed)
    if val_by == "random":
        order = list(rest)
        rng.shuffle(order)
        n_val = max(1, round(val_fraction * len(order)))
        val, train = np.array(sorted(order[:n_val])), np.array(sorted(order[n_val:]))
    elif val_by == "family":  # unseen families: what a new architecture looks like
        fams = sorted({data.family[i] for i in rest})
        rng.shuffle(fams)
        n_val = max(1, round(val_fraction * len(fams)))
        if len(fams) < 2:
            return split(data, holdout_families=holdout_families, val_fraction=val_fraction,
                         val_by="graph", seed=seed)  # fmt: skip
        is_val = np.isin(fam[rest], fams[:n_val])
        val, train = rest[is_val], rest[~is_val]
    else:
        groups = sorted({data.keys[i][0] for i in rest})
        rng.shuffle(groups)
        n_val = max(1, round(val_fraction * len(groups)))
        val_groups = set(groups[:n_val]) if len(groups) > 1 else set()
        is_val = np.array([data.keys[i][0] in val_groups for i in rest], dtype=bool)
        val, train = rest[is_val], rest[~is_val]
        if len(val) == 0:  # one graph only: fall back to records
            return split(data, holdout_families=holdout_families, val_fraction=val_fraction,
                         val_by="random", seed=seed)  # fmt: skip
    return Split(train=train, val=val, test=test, holdout_families=sorted(holdout_families))


def relative_errors(pred: np.ndarray, measured: np.ndarray) -> np.ndarray:
    return np.abs(pred - measured) / np.maximum(measured, 1.0)


def error_summary(pred: np.ndarray, upper: np.ndarray, measured: np.ndarray) -> dict[str, Any]:
    """median / p90 / p95 / max relative error, the bound miss rate (measured > upper) and
    the median bound margin ((upper - measured) / measured: how much the bound asks for
    beyond what the step holds)."""
    ok = ~np.isnan(measured)
    if not ok.any():
        return {"n": 0}
    err = relative_errors(pred[ok], measured[ok])
    margin = (upper[ok] - measured[ok]) / np.maximum(measured[ok], 1.0)
    return {
        "bound_margin_median": float(np.median(margin)),
        "n": int(ok.sum()),
        "median": float(np.median(err)),
        "p90": float(np.quantile(err, 0.9)),
        "p95": float(np.quantile(err, 0.95)),
        "max": float(err.max()),
        "bound_miss_rate": float(np.mean(measured[ok] > upper[ok])),
    }


def metric_names() -> tuple[str, ...]:
    return METRICS
