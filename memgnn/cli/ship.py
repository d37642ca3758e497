"""`memgnn ship`: train the model shipped in `predictor/memory/default_model/`, end to end:

    memgnn ship    # corpus -> train -> predictor/memory/default_model

1. builds (or finishes: it is resumable) the corpus of `--preset` (default v2, the
   shipped model's: `dataset.presets`) in `runs/corpus`, the same as
   `memgnn dataset build --preset v2 --out runs/corpus --workers 2`; `--corpus
   dataset/data/corpus-v2 --skip-corpus` trains on the packed copy in the repository;
2. trains on every family (`memgnn train --holdout-families none`: held-out-family
   accuracy is measured by `benchmarks/accuracy.py`, which cross-validates by family),
   tracked in `runs/default-model/mlflow.db` and registered as `memgnn@champion`;
3. copies encoder.onnx, head.onnx and model_card.json into `predictor/memory/default_model/`.
"""

from __future__ import annotations

import argparse
import logging
import shutil
from pathlib import Path

from memgnn.dataset.build import BuildConfig, build_corpus
from memgnn.dataset.presets import PRESETS, preset_kwargs
from memgnn.predictor.memory.onnx_model import DEFAULT_MODEL_DIR
from memgnn.training.fit_config import FitConfig
from memgnn.training.train import TrainConfig, run_training

log = logging.getLogger(__name__)

SHIPPED = DEFAULT_MODEL_DIR  # the package's own copy (its files are installed with it)
FILES = ("encoder.onnx", "head.onnx", "model_card.json")
__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--corpus", default="runs/corpus")
    p.add_argument("--out", default="runs/default-model")
    p.add_argument("--workers", type=int, default=2, help="corpus build processes")
    p.add_argument("--threads", type=int, default=1, help="torch threads for training")
    p.add_argument("--seed", type=int, default=0, help="training seed")
    p.add_argument("--preset", default="v2", choices=sorted(PRESETS), help="corpus recipe")
    p.add_argument("--skip-corpus", action="store_true", help="train on --corpus as it is")
    p.add_argument("--no-install", action="store_true", help="do not copy into the package")
    p.add_argument("--restart", action="store_true", help="discard a previous run in --out")
    p.set_defaults(func=run)


def run(a: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    for noisy in ("torch", "transformers", "predictor", "dataset"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if a.restart:
        shutil.rmtree(a.out, ignore_errors=True)
    if not a.skip_corpus:
        for kw in preset_kwargs(a.preset, out=Path(a.corpus), workers=a.workers):
            summary = build_corpus(BuildConfig(**kw))
            log.info("corpus %s (%s): %s", a.corpus, kw["backend"], summary.to_dict())
    cfg = TrainConfig(
        corpus=a.corpus,
        out=a.out,
        holdout_families=[],
        fit=FitConfig(seed=a.seed, threads=a.threads),
    )
    card = run_training(cfg)
    if not a.no_install:
        SHIPPED.mkdir(parents=True, exist_ok=True)
        for name in FILES:
            shutil.copyfile(Path(a.out) / "model" / name, SHIPPED / name)
        log.info("installed %s into %s", card["model_version"], SHIPPED)
    print(f"{card['model_version']}: val {card['metrics']['val'].get('primary')}")
    return 0
