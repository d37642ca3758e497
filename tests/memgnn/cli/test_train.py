"""`memgnn train`'s options into a TrainConfig."""

from __future__ import annotations

import argparse

import pytest
from memgnn.training.train import DEFAULT_HOLDOUT

from memgnn.cli.train import add_train_arguments, config_from_args


def _config(*argv: str):
    p = argparse.ArgumentParser()
    add_train_arguments(p)
    return config_from_args(p.parse_args(["--corpus", "c", "--out", "o", *argv]))


def test_defaults_hold_out_the_default_families_and_track_in_mlflow():
    cfg = _config()
    assert cfg.holdout_families == list(DEFAULT_HOLDOUT) and cfg.mlflow and cfg.progress


def test_flags_reach_the_gnn_and_the_fit():
    cfg = _config("--holdout-families", "none", "--hidden", "32", "--layers", "2",
                  "--lr", "0.01", "--no-mlflow", "--seed", "3")  # fmt: skip
    assert cfg.holdout_families == [] and not cfg.mlflow
    assert (cfg.gnn.hidden, cfg.gnn.layers, cfg.fit.lr, cfg.fit.seed) == (32, 2, 0.01, 3)
    with pytest.raises(SystemExit):
        _config("--val-by", "nothing")
