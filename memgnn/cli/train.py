"""`memgnn train --corpus DIR --out DIR`: fit the GNN, export ONNX, track and register it."""

from __future__ import annotations

import argparse
import json
import shutil

from memgnn.predictor.memory.gnn_config import GNNConfig
from memgnn.training.fit_config import FitConfig
from memgnn.training.train import DEFAULT_HOLDOUT, TrainConfig, run_training

_GNN, _FIT = GNNConfig(), FitConfig()  # defaults (slots dataclasses hide class-level ones)

__all__ = ["add_arguments", "train_cmd"]


def add_train_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--corpus", required=True, help="corpus directory (memgnn dataset build)")
    p.add_argument("--out", required=True, help="output directory (resumable)")
    p.add_argument(
        "--holdout-families",
        default=",".join(DEFAULT_HOLDOUT),
        help="comma-separated families held out as the test set; 'none' for none",
    )
    p.add_argument(
        "--val-by",
        choices=("family", "graph", "random"),
        default="family",
        help="validation split: unseen families (default), graphs, or random records",
    )
    p.add_argument("--val-fraction", type=float, default=0.15)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-epochs", type=int, default=_FIT.max_epochs)
    p.add_argument("--patience", type=int, default=_FIT.patience)
    p.add_argument(
        "--head-epochs",
        type=int,
        default=_FIT.head_epochs,
        help="head-only epochs over the frozen encoder after the joint phase",
    )
    p.add_argument("--lr", type=float, default=_FIT.lr)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    p.add_argument("--hidden", type=int, default=_GNN.hidden)
    p.add_argument("--layers", type=int, default=_GNN.layers)
    p.add_argument("--quantile", type=float, default=_GNN.quantile)
    p.add_argument(
        "--target-miss",
        type=float,
        default=_FIT.target_miss,
        help="bound calibration: wanted miss rate on unseen families",
    )
    p.add_argument(
        "--tracking-uri",
        default=None,
        help="mlflow tracking URI (default sqlite:///<out>/mlflow.db)",
    )
    p.add_argument("--experiment", default="memgnn")
    p.add_argument("--registered-model", default="memgnn")
    p.add_argument("--alias", default="champion")
    p.add_argument("--no-mlflow", action="store_true", help="no tracking or registration")
    p.add_argument("--exporter", choices=("legacy", "dynamo"), default="legacy")
    p.add_argument("--restart", action="store_true", help="discard a previous run in --out")
    p.add_argument("--no-progress", action="store_true")  # fmt: skip
    p.add_argument(
        "--allow-corrupt",
        action="store_true",
        help="train without corrupt corpus parts or graph files (listed in the card's "
        "'dropped'); without it they are an error",
    )


def config_from_args(a: argparse.Namespace) -> TrainConfig:
    holdout = [] if a.holdout_families.strip().lower() in ("", "none") else [
        f.strip() for f in a.holdout_families.split(",") if f.strip()]  # fmt: skip
    return TrainConfig(
        corpus=a.corpus, out=a.out, holdout_families=holdout, val_by=a.val_by,
        val_fraction=a.val_fraction,
        gnn=GNNConfig(hidden=a.hidden, layers=a.layers, quantile=a.quantile),
        fit=FitConfig(max_epochs=a.max_epochs, patience=a.patience, lr=a.lr, seed=a.seed,
                      target_miss=a.target_miss, head_epochs=a.head_epochs, threads=a.threads),
        tracking_uri=a.tracking_uri, experiment=a.experiment,
        registered_model=a.registered_model, alias=a.alias, mlflow=not a.no_mlflow,
        exporter=a.exporter, progress=not a.no_progress,
        allow_corrupt=getattr(a, "allow_corrupt", False),
    )  # fmt: skip


def train_cmd(args: argparse.Namespace) -> int:
    """CLI entry: train, then print a short summary (exit status 0)."""
    cfg = config_from_args(args)
    if getattr(args, "restart", False):
        shutil.rmtree(cfg.out, ignore_errors=True)
    summary = run_training(cfg)
    print(json.dumps(summary, indent=2, default=str))
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_train_arguments(p)
    p.set_defaults(func=train_cmd)
