"""`memgnn train --corpus DIR --out DIR`: fit the GNN, export ONNX, track and register it.

    memgnn train --corpus runs/corpus --out runs/train

Steps: load the corpus (`training.data`), hold out whole families (`--holdout-families`,
default bert,resnet,moe; `none` trains on every family) and draw a seeded validation split
from the rest; train with early stopping, checkpointing every epoch to
`<out>/checkpoint.pt` (running the same command again resumes there; `--restart` starts
over); calibrate the upper bound by family cross-fitting; export `<out>/model/`
(encoder.onnx, head.onnx, model_card.json); log everything to mlflow and register the
model with an alias. Files in `<out>`: train_state.json (config hash, mlflow run id,
phase), checkpoint.pt, parity.png, mlflow.db + mlartifacts/ (default store), model/.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from memgnn.predictor.memory.gnn_config import GNNConfig
from memgnn.training.fit_config import FitConfig

log = logging.getLogger(__name__)

DEFAULT_HOLDOUT = ("bert", "resnet", "moe")
STATE = "train_state.json"


@dataclass(kw_only=True, slots=True)
class TrainConfig:
    corpus: str
    out: str
    holdout_families: list[str] = field(default_factory=lambda: list(DEFAULT_HOLDOUT))
    val_by: str = "family"
    val_fraction: float = 0.15
    gnn: GNNConfig = field(default_factory=GNNConfig)
    fit: FitConfig = field(default_factory=FitConfig)
    tracking_uri: str | None = None
    experiment: str = "memgnn"
    registered_model: str = "memgnn"
    alias: str = "champion"
    mlflow: bool = True
    exporter: str = "legacy"
    progress: bool = True
    allow_corrupt: bool = False  # train without corrupt parts / graphs (the card says so)

    def __post_init__(self) -> None:
        if not self.corpus or not self.out:
            raise ValueError("corpus and out directories are required")
        if self.val_by not in ("family", "graph", "random"):
            raise ValueError(f"val_by must be family, graph or random, got {self.val_by!r}")
        if self.exporter not in ("legacy", "dynamo"):
            raise ValueError(f"exporter must be legacy or dynamo, got {self.exporter!r}")
        if not self.registered_model or not self.alias:
            raise ValueError("registered model name and alias must not be empty")

    def identity(self) -> str:
        """Hash of what a resumed run must share (not the epoch budget or display)."""
        d = asdict(self)
        for key in ("progress", "tracking_uri", "allow_corrupt"):
            d.pop(key)
        for key in ("max_epochs", "patience", "head_epochs", "head_patience", "threads"):
            d["fit"].pop(key)
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


def _load_state(out: Path) -> dict[str, Any]:
    path = out / STATE
    return json.loads(path.read_text()) if path.is_file() else {}


def _save_state(out: Path, state: dict[str, Any]) -> None:
    tmp = out / (STATE + ".tmp")
    tmp.write_text(json.dumps(state, indent=2))
    tmp.replace(out / STATE)


def run_training(cfg: TrainConfig) -> dict[str, Any]:
    """The whole pipeline (see the module docstring); returns the model card."""
    from memgnn.training.data import load_dataset, split
    from memgnn.training.fit import fit
    from memgnn.training.tracking import Tracker

    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    data = load_dataset(cfg.corpus, allow_corrupt=cfg.allow_corrupt)
    identity = f"{cfg.identity()}-{data.data_hash[:16]}"
    state = _load_state(out)
    if state and state.get("identity") != identity:
        raise ValueError(f"{out} holds a run with another config or corpus; "
                         "use a new --out or pass --restart")  # fmt: skip
    sp = split(data, holdout_families=cfg.holdout_families, val_fraction=cfg.val_fraction,
               val_by=cfg.val_by, seed=cfg.fit.seed)  # fmt: skip
    log.info("split: %s, held-out families %s", sp.summary(), sp.holdout_families)
    tracker = Tracker(out=out, uri=cfg.tracking_uri, experiment=cfg.experiment,
                      enabled=cfg.mlflow)  # fmt: skip
    params = {"corpus": cfg.corpus, "records": len(data), "graphs": len(data.graphs),
              "data_hash": data.data_hash, **sp.summary(),
              "holdout_families": ",".join(sp.holdout_families) or "none",
              "val_by": cfg.val_by, **cfg.gnn.to_dict(), **asdict(cfg.fit)}  # fmt: skip
    state.update(identity=identity, run_id=tracker.start(params, state.get("run_id")))
    state.setdefault("phase", "training")
    _save_state(out, state)
    try:
        model, history = fit(data, sp.train, sp.val, cfg.gnn, cfg.fit,
                             checkpoint=out / "checkpoint.pt", on_epoch=tracker.log_epoch,
                             progress=cfg.progress)  # fmt: skip
        card = _finish(cfg, data, sp, model, history, tracker, out, t0)
    finally:
        tracker.end()
    state["phase"] = "done"
    _save_state(out, state)
    return card


def _finish(cfg, data, sp, model, history, tracker, out: Path, t0: float) -> dict[str, Any]:
    from memgnn.predictor.memory.trust import training_range
    from memgnn.training.calibrate import calibrate_groups, cross_fit, evaluate
    from memgnn.training.export import export_onnx, weights_hash, write_card
    from memgnn.training.fit import predict_log
    from memgnn.training.tracking import parity_plot

    seen = np.concatenate([sp.train, sp.val])
    # per (target kind, metric) conformal bounds from family-cross-fitted residuals; the
    # head's own per-metric shift stays zero (predictor.memory.calibration)
    rows, mu, upper = cross_fit(model, data, seen, cfg.fit)
    bound_calibration = calibrate_groups(data, rows, mu, upper, cfg.fit.target_miss)
    model.head.calibration.zero_()
    calibration = model.head.calibration.tolist()
    metrics = {"val": evaluate(model, data, sp.val, bound_calibration),
               "test_family": evaluate(model, data, sp.test, bound_calibration)}  # fmt: skip
    baseline = {name: _analytic_summary(data, idx) for name, idx in
                (("val", sp.val), ("test_family", sp.test)) if len(idx)}  # fmt: skip
    model_dir = out / "model"
    biggest = max(data.graphs, key=lambda k: data.graphs[k].num_nodes)
    onnx_info = export_onnx(model, data.graphs[biggest], model_dir, exporter=cfg.exporter)
    version = f"gnn-{weights_hash(model)[:12]}"
    series = {}
    for name, idx in (("val", sp.val), ("held-out families", sp.test)):
        if len(idx):
            mu, _ = predict_log(model, data, idx)
            prim = data.primary_metric()[idx]
            rows = np.arange(len(idx))
            meas = data.measured[idx][rows, prim]
            series[f"{name} (gnn)"] = (meas, (data.analytic[idx] * np.exp(mu))[rows, prim])
            series[f"{name} (analytic)"] = (meas, data.baseline[idx][rows, prim])
    plot = parity_plot(out / "parity.png", series, f"memgnn {version}: peak bytes")
    best = min(history, key=lambda r: r["val_fit"]) if history else {}
    card = {
        "model_version": version, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "training_data_hash": data.data_hash, "corpus": str(cfg.corpus),
        "records": len(data), "graph_paths": len(data.graphs),
        "families": sorted(set(data.family)), "holdout_families": sp.holdout_families,
        "split": sp.summary() | {"val_by": cfg.val_by, "seed": cfg.fit.seed},
        "gnn": cfg.gnn.to_dict(), "fit": asdict(cfg.fit), "epochs": len(history),
        "best_epoch": best.get("epoch"), "calibration": calibration,
        "bound_calibration": bound_calibration,
        "metrics": metrics, "analytic_baseline": baseline, "onnx": onnx_info,
        "train_seconds": round(time.perf_counter() - t0, 1),
        "dropped": data.dropped,  # corrupt corpus data left out (--allow-corrupt)
        "training_range": training_range(data.q[sp.train]),
    }  # fmt: skip
    write_card(model_dir, card)
    flat = {f"{split_}/{key}/{stat}": v for split_, groups in metrics.items()
            for key, s in groups.items() for stat, v in s.items() if stat != "n"}  # fmt: skip
    tracker.log_metrics(flat)
    if plot is not None:
        tracker.log_artifact(plot)
    card["mlflow"] = tracker.register(model_dir, cfg.registered_model, cfg.alias)
    path = write_card(model_dir, card)
    tracker.log_artifact(path)
    return json.loads(path.read_text())


def _analytic_summary(data, idx: np.ndarray) -> dict[str, Any]:
    from memgnn.training.data import error_summary

    prim = data.primary_metric()[idx]
    rows = np.arange(len(idx))
    est = data.baseline[idx][rows, prim]
    return error_summary(est, est, data.measured[idx][rows, prim])
