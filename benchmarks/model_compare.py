"""A shipped model's answers on a corpus's records, to score two models on the same records.

    python benchmarks/model_compare.py --corpus DIR --model-dir DIR --out FILE.json

asks the model in `--model-dir` (`OnnxMemoryModel.predict`, what `memgnn predict --method
gnn` answers) for every labelled record of the corpus: allocated on every device, reserved
too on GPU profiles, at the record's sizes and scenario (the one `training.data` labels it
with). It uses only the API every memgnn since feature schema 2 has, so a model of another
feature schema is scored by running this file with the memgnn that computes that schema
(for example a checkout of the commit that shipped it):
`/path/to/old/.venv/bin/python benchmarks/model_compare.py ...`.
`benchmarks/accuracy.py --compare NAME=FILE.json` then scores those answers next to its
held-out-family GNN on the same records (`compare_predictions`), per label source and per
fine-tuning kind (`finetune_kind`, `by_kind`).
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger("benchmarks.model_compare")
KINDS = ("full", "lora", "qlora", "adamw8bit", "attention-set")


def predict_records(corpus_dir: str | Path, model_dir: str | Path) -> dict[str, Any]:
    """{job_id: {metric: [predicted, upper bound]}} of every labelled record (see module)."""
    from memgnn.dataset.corpus import Corpus
    from memgnn.predictor.memory.base import Query
    from memgnn.predictor.memory.onnx_model import OnnxMemoryModel, read_card
    from memgnn.predictor.spec.devices import get_profile

    model = OnnxMemoryModel.load(model_dir)
    corpus = Corpus(corpus_dir)
    rows = [r for r in corpus.records() if r["graph_id"] and not r["error"]]
    rows = [r for r in rows if not (r.get("stats") or {}).get("would_oom")]
    out: dict[str, Any] = {}
    refused: dict[str, int] = {}
    t0 = time.perf_counter()
    by_graph: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_graph.setdefault(r["graph_id"], []).append(r)
    for gid, group in sorted(by_graph.items()):
        graph = corpus.graph(gid)
        queries, owners = [], []
        for r in group:
            sizes = {s: int(v) for s, v in r["sizes"].items() if s in graph.symbols}
            scenario = (r.get("stats") or {}).get("scenario") or "balanced"
            gpu = get_profile(r["device"]).is_gpu
            for m in ("allocated", "reserved") if gpu else ("allocated",):
                queries.append(Query(sizes=sizes, device=r["device"], metric=m, scenario=scenario))
                owners.append((r["job_id"], m))
        try:
            answers = model.predict(graph, queries)
        except ValueError:  # a record outside its graph's guards: ask one by one
            answers = [_ask(model, graph, q, refused) for q in queries]
        for (job, metric), p in zip(owners, answers, strict=True):
            if p is not None:
                out.setdefault(job, {})[metric] = [p.predicted_peak_bytes, p.upper_bound_bytes]
    card = read_card(model_dir)
    log.info("%d records in %.0f s (refused: %s)", len(out), time.perf_counter() - t0, refused)
    return {
        "model_version": model.version,
        "feature_schema_version": card.get("feature_schema_version"),
        "corpus": str(corpus_dir),
        "records": out,
        "refused": refused,
    }


def _ask(model: Any, graph: Any, query: Any, refused: dict[str, int]) -> Any:
    """One answer, or None where the model refuses the query (counted by error type)."""
    try:
        return model.predict(graph, [query])[0]
    except ValueError as exc:
        refused[type(exc).__name__] = refused.get(type(exc).__name__, 0) + 1
        return None


def finetune_kind(train: dict[str, Any]) -> str:
    """The fine-tuning kind of a record's training config, for the per-kind table:
    qlora (a quantised base), lora, adamw8bit (a full fine-tune with 8-bit AdamW),
    attention-set (a full fine-tune with an explicit attention kernel) or full."""
    if train.get("quantize_base", "none") != "none":
        return "qlora"
    if train.get("peft", "none") == "lora":
        return "lora"
    if train.get("optimizer") == "adamw8bit":
        return "adamw8bit"
    if train.get("attention", "auto") != "auto":
        return "attention-set"
    return "full"


def record_kinds(data: Any, corpus_dir: str | Path) -> list[str]:
    """`finetune_kind` of each record of `data`, from the corpus's `train` column."""
    from memgnn.dataset.corpus import Corpus

    train = {r["job_id"]: r["train"] for r in Corpus(corpus_dir).records()}
    return [finetune_kind(train[job]) for job in data.job_id]


def compare_predictions(data: Any, path: str | Path) -> tuple[np.ndarray, np.ndarray, str]:
    """(pred [R, 3], upper [R, 3], model version) from a `predict_records` file, aligned
    to `data` (a `training.data.Dataset`) by job id; NaN where the file has no answer."""
    from memgnn.predictor.ir.vocab import METRICS

    blob = json.loads(Path(path).read_text())
    pred, upper = np.full((len(data), 3), np.nan), np.full((len(data), 3), np.nan)
    for i, job in enumerate(data.job_id):
        for metric, (p, u) in blob["records"].get(job, {}).items():
            pred[i, METRICS.index(metric)], upper[i, METRICS.index(metric)] = p, u
    missing = int(np.isnan(pred[:, 0]).sum())
    if missing:
        log.warning("%s: no answer for %d of %d records", path, missing, len(data))
    return pred, upper, str(blob.get("model_version", ""))


def by_kind(
    data: Any, kinds: list[str], preds: dict[str, tuple[np.ndarray, np.ndarray]]
) -> dict[str, Any]:
    """Per fine-tuning kind, on the records every estimator in `preds` answers: median /
    p95 relative error and bound miss of each, on the primary metric (reserved on GPU
    profiles, allocated on the CPU)."""
    from memgnn.training.data import error_summary

    prim = data.primary_metric()
    rows = np.arange(len(data))
    out: dict[str, Any] = {}
    kinds_arr = np.array(kinds)
    for kind in (*KINDS, "all"):
        sel = (kinds_arr == kind) if kind != "all" else np.ones(len(data), dtype=bool)
        for p, _ in preds.values():
            sel &= ~np.isnan(p[rows, prim])
        if not sel.any():
            continue
        meas = data.measured[rows, prim]
        out[kind] = {
            name: error_summary(p[rows, prim][sel], u[rows, prim][sel], meas[sel])
            for name, (p, u) in preds.items()
        }
    return out


def markdown_by_kind(table: dict[str, Any]) -> list[str]:
    if not table:
        return []
    lines = ["", "Per fine-tuning kind, the same records for every estimator (primary metric: "
             "reserved on GPU profiles, allocated on the CPU):", "",
             "| kind | estimator | n | median | p95 | max | bound miss |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for kind, row in table.items():
        for name, s in row.items():
            lines.append(f"| {kind} | {name} | {s['n']} | {s['median']:.2%} | {s['p95']:.2%} | "
                         f"{s['max']:.2%} | {s['bound_miss_rate']:.1%} |")  # fmt: skip
    return lines


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--corpus", required=True)
    p.add_argument("--model-dir", required=True)
    p.add_argument("--out", required=True, help="JSON file of the answers")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    for noisy in ("torch", "transformers", "predictor", "dataset"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    res = predict_records(a.corpus, a.model_dir)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=1))
    print(f"{res['model_version']}: {len(res['records'])} records -> {a.out}")


if __name__ == "__main__":
    main()
