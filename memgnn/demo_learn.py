"""The demo's learning step: a small corpus, a GNN trained on it and tracked in mlflow
(embedded SQLite store), registered with an alias, exported to ONNX, then asked about
configs of a family it never saw, next to their measured (simulated) labels.

A miniature of `memgnn ship` (which trains the shipped model on thousands of
records): the model here sees a few dozen records and a few epochs, so its numbers show the
pipeline working end to end, not the shipped model's accuracy (`benchmarks/accuracy.py`).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from memgnn.cli.render import fmt_bytes, print_table

log = logging.getLogger(__name__)

# small models so the corpus builds in about a minute on 2 cores
FAMILIES = {
    "gpt2": {"layers": 2, "hidden": 96, "heads": 2, "vocab": 512},
    "bert": {"layers": 2, "hidden": 96, "heads": 2, "vocab": 512},
    "mlp": {"layers": 2, "hidden": 256, "features": 128, "classes": 10},
    "llama": {"layers": 2, "hidden": 96, "heads": 2, "vocab": 512},
}
HELD_OUT = "gpt2"
CAPS = {"max_tokens": 4096, "max_batch": 64}
DEVICES = ["a100-80gb", "h100-80gb"]


def learn_step(out: Path, *, jobs: int = 72, rows: int = 5) -> None:
    from memgnn.dataset.build import BuildConfig, build_corpus
    from memgnn.dataset.corpus import Corpus
    from memgnn.predictor.memory.gnn import GNNConfig
    from memgnn.predictor.memory.onnx_model import OnnxMemoryModel
    from memgnn.training.fit import FitConfig
    from memgnn.training.train import TrainConfig, run_training

    print("== 5. learn: small corpus -> GNN (mlflow) -> ONNX -> a family it never saw")
    t0 = time.perf_counter()
    corpus = out / "corpus"
    summary = build_corpus(
        BuildConfig(
            out=corpus,
            size=jobs,
            backend="sim",
            families=list(FAMILIES),
            hparams=FAMILIES,
            caps=CAPS,
            devices=DEVICES,
            sizes_per_config=6,
            progress=False,
        )  # fmt: skip
    )
    records = Corpus(corpus).records()
    print(
        f"   corpus {corpus}: {len(records)} sim records over {len(FAMILIES)} families "
        f"({summary.profiled} profiled now, {time.perf_counter() - t0:.0f}s)"
    )
    t0 = time.perf_counter()
    cfg = TrainConfig(
        corpus=str(corpus),
        out=str(out / "training"),
        holdout_families=[HELD_OUT],
        gnn=GNNConfig(hidden=16, layers=2),
        fit=FitConfig(max_epochs=20, head_epochs=300, threads=1),
        progress=False,
    )
    card = run_training(cfg)
    ml = card.get("mlflow") or {}
    print(
        f"   trained {card['model_version']} in {time.perf_counter() - t0:.0f}s, held out "
        f"{HELD_OUT!r}; mlflow {ml.get('tracking_uri', '-')} model "
        f"{ml.get('registered_model', '-')} v{ml.get('version', '-')} @{ml.get('alias', '-')}"
    )
    model = OnnxMemoryModel.load(Path(cfg.out) / "model")
    print(f"   ONNX encoder + head loaded from {Path(cfg.out) / 'model'} (onnxruntime)")
    _held_out_table(Corpus(corpus), records, model, rows)


def _held_out_table(corpus, records, model, rows: int) -> None:
    """Measured reserved bytes of held-out configs next to the demo model, the shipped
    model (trained on thousands of records, this family included) and the analytic sweep."""
    from memgnn.predictor.memory.analytic import AnalyticModel
    from memgnn.predictor.memory.base import Query
    from memgnn.predictor.memory.onnx_model import load_default_model

    others = {"shipped": load_default_model(), "analytic": AnalyticModel()}
    held = [r for r in records if r["family"] == HELD_OUT and r["peak_reserved_bytes"]]
    held.sort(key=lambda r: r["peak_reserved_bytes"])
    step = max(1, len(held) // rows)
    table = []
    for r in held[::step][:rows]:
        graph = corpus.graph(r["graph_id"])
        q = [Query(sizes=r["sizes"], device=r["device"])]
        measured = r["peak_reserved_bytes"]
        cells = []
        for m in (model, *others.values()):
            value = m.predict(graph, q)[0].predicted_peak_bytes
            cells.append(f"{fmt_bytes(value)} ({(value - measured) / measured:+.0%})")
        size = " ".join(f"{k}={v}" for k, v in r["sizes"].items())
        table.append([size, f"{r['train']['precision']} {r['train']['optimizer']}", r["device"],
                      fmt_bytes(measured), *cells])  # fmt: skip
    print_table(
        ["held-out config", "training", "device", "measured reserved", "demo model",
         "shipped model", "analytic"],
        table,
    )  # fmt: skip
    print(
        "   (the demo model saw a few dozen records from 3 families: the pipeline, not the "
        "accuracy; benchmarks/accuracy.py measures the shipped model on held-out families)"
    )
