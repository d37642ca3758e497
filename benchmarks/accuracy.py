"""Held-out-family accuracy of the GNN against baselines, and its query / encode latency.

    .venv/bin/python benchmarks/accuracy.py [--corpus DIR] [--folds 4]

`--corpus` defaults to the corpus in the repository (`dataset/data/corpus-v2`, rebuilt by
`memgnn dataset build --preset v2`), so a fresh clone runs it as is. `--compare NAME=FILE`
scores another model's answers on the same records beside the GNN (`benchmarks/
model_compare.py` writes them, with the memgnn of that model's feature schema), also per
fine-tuning kind (full, LoRA, QLoRA, 8-bit AdamW, an explicit attention kernel).

Accuracy: leave-family-out cross-validation. The corpus families are dealt into `--folds`
groups; for each, a model is trained (same pipeline as `memgnn train`, without mlflow) on
the other families (bound calibrated per (target kind, metric) by family cross-fitting on
them: `training.calibrate`; "gnn (head forms only)" rows: that calibration restricted to
the head's own forms, without the network-free and derived forms and the out-of-range
fallback; "gnn (old bound)" rows: the former one shift per metric from the same
residuals), and every record of the held-out families predicted. So each
record is scored by a model that never saw its family. Per label source (sim-gpu:
allocator simulation on GPU profiles; cpu: real CPU runs) and metric: median / p90 /
p95 / max relative error, the upper-bound miss rate and the median bound margin
((bound - measured) / measured), next to baselines on the same records (params-only and
korthikanti in `benchmarks/baselines.py`):
- analytic: `predictor.memory.analytic.AnalyticModel` (same numbers): the liveness sweep with
  512-byte rounding, a cuBLAS workspace per thread (forward / autograd) that runs a
  matmul, as the simulator does, and the CUDA context: the base the GNN corrects;
- params-only: weights + gradients + optimizer state (P x (2 + k), k = 2 Adam, 1 SGD
  momentum, 0 Adafactor), as the accelerate / DeepSpeed estimators do;
- korthikanti (transformer families): model state + per layer s*b*h*(34 + 5*a*s/h) bytes
  (16-bit activations; x2 in fp32; checkpointed layers keep only their 2*s*b*h input).
"gnn + k live" rows: the same predictions after the residual correction of k live
samples of the same model and config at other sizes (`with_live_samples`), what the
service applies once a training run sends its measured peaks to /samples.
`--split random` instead trains one model on a seeded random 80% of the records (families
seen) and scores the other 20%: the reference for how much of the held-out error is about
unseen families and how much the query features cannot explain at all.
Latency: the shipped model (`--model-dir`, default predictor/memory/default_model) in-process in
onnxruntime: the head per config (one query per call, and 64 per call), a full query
(features + head), and encoding graphs of about 1k, 5k and 20k nodes (features + ORT).
`--paths`: also each record replayed exactly (`benchmarks/paths.py`: replay vs the labels,
byte for byte) and the latency per answer path (replay, gnn, analytic) side by side.
Writes benchmarks/results/<--out-name>.json and .md (default accuracy).
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from memgnn.predictor.ir.vocab import METRICS  # noqa: E402
from memgnn.training.data import Dataset, error_summary, load_dataset, split  # noqa: E402
from results_io import write_results  # noqa: E402

log = logging.getLogger("benchmarks.accuracy")


def _shown(path: str) -> str:
    """A corpus path as the results show it: relative to the repository when inside it."""
    repo = Path(__file__).resolve().parents[1]
    p = Path(path).resolve()
    return str(p.relative_to(repo)) if p.is_relative_to(repo) else path


def random_split(data: Dataset, seed: int, test_fraction: float = 0.2, val_fraction=0.15):
    """Records dealt at random: test, validation, train (every family in each)."""
    order = np.random.default_rng(seed).permutation(len(data))
    n_test, n_val = round(test_fraction * len(data)), round(val_fraction * len(data))
    cut = n_test + n_val
    return SimpleNamespace(
        test=np.sort(order[:n_test]), val=np.sort(order[n_test:cut]), train=np.sort(order[cut:])
    )


def cross_validate(
    data: Dataset, folds: int, max_epochs: int, seed: int, gnn: dict[str, Any], how: str,
    target_miss: float = 0.01,
) -> dict[str, Any]:  # fmt: skip
    from memgnn.predictor.memory.gnn import GNNConfig
    from memgnn.training.calibrate import calibrate_groups, calibrated, cross_fit, fell_back
    from memgnn.training.fit import FitConfig, fit, predict_log

    families = sorted(set(data.family))
    groups = [families[k::folds] for k in range(folds)] if how == "family" else [["(random)"]]
    mu, upper = np.full((len(data), 3), np.nan), np.full((len(data), 3), np.nan)
    pred, bound, old = (np.full((len(data), 3), np.nan) for _ in range(3))
    fell = np.zeros((len(data), 3), dtype=bool)
    prev = np.full((len(data), 3), np.nan)
    info, cals = [], []
    for k, held in enumerate(groups):
        t0 = time.perf_counter()
        if how == "family":
            sp = split(data, holdout_families=held, seed=seed)
        else:
            sp = random_split(data, seed)
        cfg = FitConfig(max_epochs=max_epochs, seed=seed, threads=1, target_miss=target_miss)
        model, history = fit(data, sp.train, sp.val, GNNConfig(**gnn), cfg)
        rows, r_mu, r_up = cross_fit(model, data, np.concatenate([sp.train, sp.val]), cfg)
        cals.append(calibrate_groups(data, rows, r_mu, r_up, cfg.target_miss))
        mu[sp.test], upper[sp.test] = predict_log(model, data, sp.test)  # head bound, no shift
        pred[sp.test], bound[sp.test] = calibrated(data, sp.test, mu[sp.test], upper[sp.test],
                                                   cals[-1])  # fmt: skip
        fell[sp.test] = fell_back(data, sp.test, mu[sp.test], upper[sp.test], cals[-1])
        prev[sp.test] = calibrated(data, sp.test, mu[sp.test], upper[sp.test],
                                   _head_forms_only(cals[-1]))[1]  # fmt: skip
        old[sp.test] = data.analytic[sp.test] * np.exp(
            _old_bound(data, rows, r_mu, r_up, cfg, mu[sp.test], upper[sp.test])
        )
        info.append({"fold": k, "held_out": held, "epochs": len(history),
                     "seconds": round(time.perf_counter() - t0, 1)})  # fmt: skip
        log.info("fold %d/%d (%s): %d epochs, %.0fs", k + 1, folds, held, len(history),
                 time.perf_counter() - t0)  # fmt: skip
    return {"mu": mu, "upper": upper, "pred": pred, "bound": bound, "old_bound": old,
            "folds": info, "calibration": cals, "fell_back": fell,
            "head_forms_bound": prev}  # fmt: skip


def _head_forms_only(cal: dict[str, Any]) -> dict[str, Any]:
    """The per-group calibration as it was before the network-free and derived forms and
    the out-of-range fallback: the tightest of the head's own forms (shift, scaled, plain)
    from the same candidates, for comparison on the same folds."""
    out = {}
    for key, c in cal.items():
        cands = {f: v for f, v in c["candidates"].items() if f in ("shift", "scaled", "plain")}
        best = min(cands, key=lambda f: cands[f]["median_margin"])
        out[key] = {"form": best, "q": cands[best]["q"], "target_miss": c["target_miss"]}
    return out


def _old_bound(data, rows, r_mu, r_up, cfg, mu, upper) -> np.ndarray:
    """The per-metric shift memgnn's first calibration computed (one conformal quantile
    of y - upper per metric over every target, in the head as mu + relu(s + shift)), from
    the same cross-fitted residuals (same seeds, same heads): the bound before the
    per-(target, metric) calibration, for comparison."""
    from memgnn.predictor.memory.calibration import conformal_quantile

    shift = np.zeros(3)
    for m in range(3):
        ok = ~np.isnan(data.y[rows, m])
        if ok.sum() >= 5:
            shift[m] = conformal_quantile(data.y[rows[ok], m] - r_up[ok, m], cfg.target_miss)
    return mu + np.maximum(upper - mu + shift, 0.0)


def reserved_slack(data: Dataset) -> dict[str, Any]:
    """On the sim-gpu labels: reserved / allocated, and reserved over the query features'
    caching-allocator-shaped estimate (`query_features`: small blocks in 2 MiB segments,
    1-10 MiB ones in 20 MiB segments, larger ones rounded to 2 MiB, at the schedule's max),
    min / median / p98 / max: how much of the reserved slack size classes explain."""
    from memgnn.predictor.memory.features import QUERY_COLUMNS

    col = {n: k for k, n in enumerate(QUERY_COLUMNS)}
    gpu = (np.array(data.source) == "sim-gpu") & ~np.isnan(data.measured[:, 1])
    q = data.q[gpu].astype(np.float64)
    ws = 2.0 ** (q[:, col["log_workspace"]] * 30) - 1
    seg = (data.analytic[gpu, 0] - ws) * 2.0 ** q[:, col["seg_estimate"]]
    res = data.measured[gpu, 1]
    out = {}
    for name, ratio in (("reserved/allocated", res / data.measured[gpu, 0]),
                        ("reserved/segment_estimate", res / seg)):  # fmt: skip
        out[name] = [float(np.quantile(ratio, p)) for p in (0.0, 0.5, 0.98, 1.0)]
    return out


def with_live_samples(
    data: Dataset, pred: np.ndarray, upper: np.ndarray, k: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """What /predict answers after k live samples: each record's k samples are other
    records of its (graph, device) (the same model and training config at other sizes,
    drawn seeded), sent through `serving.store.correction_from` and applied with
    `predictor.answer.types.corrected`, as the service does. Records whose group has fewer than k
    others are not scored (NaN)."""
    from memgnn.predictor.answer.types import corrected
    from memgnn.predictor.memory.base import Prediction
    from memgnn.serving.store import correction_from, ratio

    groups: dict[tuple[str, str], list[int]] = {}
    for i, (gid, _) in enumerate(data.keys):
        if not np.isnan(pred[i, 0]):
            groups.setdefault((gid, data.device[i]), []).append(i)
    rng = np.random.default_rng(seed)
    out_p, out_u = np.full_like(pred, np.nan), np.full_like(upper, np.nan)
    for idx in groups.values():
        for i in idx:
            others = [j for j in idx if j != i]
            if len(others) < k:
                continue
            picks = rng.choice(others, size=k, replace=False)
            for m in range(pred.shape[1]):
                meas = data.measured[picks, m]
                if np.isnan(meas).any() or np.isnan(pred[i, m]):
                    continue
                corr = correction_from(
                    [ratio(int(a), int(b)) for a, b in zip(meas, pred[picks, m])],
                    [ratio(int(a), int(b)) for a, b in zip(meas, upper[picks, m])],
                )
                raw = Prediction(predicted_peak_bytes=int(pred[i, m]), metric=METRICS[m],
                                 upper_bound_bytes=int(upper[i, m]), breakdown={},
                                 model_version="")  # fmt: skip
                fixed = corrected(raw, corr)
                out_p[i, m], out_u[i, m] = fixed.predicted_peak_bytes, fixed.upper_bound_bytes
    return out_p, out_u


def summarize(data: Dataset, preds: dict[str, tuple[np.ndarray, np.ndarray]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    sources = np.array(data.source)
    for src in sorted(set(sources)):
        for m, metric in enumerate(METRICS):
            sel = (sources == src) & ~np.isnan(data.measured[:, m])
            if not sel.any():
                continue
            row = {}
            for name, (pred, upper) in preds.items():
                p = pred[sel, m] if pred.ndim == 2 else pred[sel]
                u = upper[sel, m] if upper.ndim == 2 else upper[sel]
                ok = ~np.isnan(p)
                if ok.any():
                    row[name] = error_summary(p[ok], u[ok], data.measured[sel, m][ok])
            out[f"{src}/{metric}"] = row
    return out


def per_family(data: Dataset, pred: np.ndarray, analytic: np.ndarray) -> dict[str, Any]:
    prim = data.primary_metric()
    rows = np.arange(len(data))
    fam = np.array(data.family)
    out = {}
    for f in sorted(set(fam)):
        sel = (fam == f) & ~np.isnan(pred[rows, prim])
        if not sel.any():
            continue
        meas = data.measured[rows, prim][sel]
        err_g = np.abs(pred[rows, prim][sel] - meas) / meas
        err_a = np.abs(analytic[rows, prim][sel] - meas) / meas
        out[f] = {"n": int(sel.sum()), "gnn_median": float(np.median(err_g)),
                  "analytic_median": float(np.median(err_a))}  # fmt: skip
    return out


def latency(model_dir: Path, cache: Path) -> dict[str, Any]:
    from memgnn.predictor.capture.cache import capture_cached
    from memgnn.predictor.memory.base import Query
    from memgnn.predictor.memory.features import graph_inputs
    from memgnn.predictor.memory.onnx_model import OnnxMemoryModel
    from memgnn.predictor.spec.train import TrainSpec
    from memgnn.predictor.zoo import make_bundle

    model = OnnxMemoryModel.load(model_dir)
    out: dict[str, Any] = {"model_dir": str(model_dir), "model_version": model.version,
                           "encode": []}  # fmt: skip
    for layers in (3, 16, 68):  # ~1k, ~5k, ~20k nodes
        bundle = make_bundle("gpt2", {"layers": layers, "hidden": 768, "heads": 12})
        graph = capture_cached(bundle, TrainSpec(), directory=cache)
        n = graph.paths[0].num_nodes
        feats, total = [], []
        for _ in range(5):
            t0 = time.perf_counter()
            graph_inputs(graph)
            t1 = time.perf_counter()
            model._embeddings.clear()
            model.encode(graph)
            feats.append(t1 - t0)
            total.append(time.perf_counter() - t1)
        gi = graph_inputs(graph)
        feed = dict(zip(("x", "in_src", "in_ptr", "out_dst", "out_ptr"), (gi.x, *gi.csr())))
        ort_times = []
        for _ in range(10):
            t0 = time.perf_counter()
            model._encoder.run(None, feed)
            ort_times.append(time.perf_counter() - t0)
        out["encode"].append({"nodes": n, "encoder_nodes": gi.num_nodes,
                              "edges": int(gi.edge_index.shape[1]),
                              "features_ms": 1e3 * statistics.median(feats),
                              "onnx_encoder_ms": 1e3 * statistics.median(ort_times),
                              "encode_total_ms": 1e3 * statistics.median(total)})  # fmt: skip
        if layers == 16:
            emb = model.encode(graph)
            qs = [Query(sizes={"B": b, "S": 1024}, device="a100-80gb") for b in (1, 2, 4, 8)]
            t0 = time.perf_counter()
            for _ in range(50):
                model.predict_encoded(emb, graph, qs)
            out["full_query_ms_5k_nodes"] = 1e3 * (time.perf_counter() - t0) / 200
            feat = np.stack([model._path_contexts(graph)[0].query(q.sizes, _dev()).features
                             for q in qs])  # fmt: skip
    out["encoder_synthetic"] = _synthetic_encode(model)
    for batch in (1, 64):
        e = np.repeat(emb[:1], batch, axis=0)
        q = np.repeat(feat[:1], batch, axis=0)
        model.head(e, q)
        t0 = time.perf_counter()
        reps = 2000 if batch == 1 else 200
        for _ in range(reps):
            model.head(e, q)
        out[f"head_ms_per_config_batch{batch}"] = 1e3 * (time.perf_counter() - t0) / reps / batch
    return out


def _synthetic_encode(model) -> list[dict[str, Any]]:
    """The ONNX encoder alone at exactly 1k / 5k / 20k encoder nodes (random features, a
    random DAG with the corpus' ~2 edges per node)."""
    from memgnn.predictor.memory.features import NUM_NODE_FEATURES, NUM_OPS, GraphInputs

    rng = np.random.default_rng(0)
    rows = []
    for n in (1000, 5000, 20000):
        x = rng.random((n, NUM_NODE_FEATURES), dtype=np.float32)
        x[:, 0] = rng.integers(0, NUM_OPS, n)
        dst = np.sort(rng.integers(1, n, 2 * n))
        src = (rng.random(2 * n) * dst).astype(np.int64)
        gi = GraphInputs(x=x, edge_index=np.stack([src, dst]))
        feed = dict(zip(("x", "in_src", "in_ptr", "out_dst", "out_ptr"), (gi.x, *gi.csr())))
        model._encoder.run(None, feed)
        times = []
        for _ in range(10):
            t0 = time.perf_counter()
            model._encoder.run(None, feed)
            times.append(time.perf_counter() - t0)
        rows.append({"nodes": n, "edges": 2 * n, "onnx_encoder_ms": 1e3 * statistics.median(times)})
    return rows


def _dev():
    from memgnn.predictor.spec.devices import get_profile

    return get_profile("a100-80gb")


def markdown(res: dict[str, Any]) -> str:
    how = (f"{res['folds']} leave-family-out folds" if res.get("split", "family") == "family"
           else "one random 80/20 record split (families seen in training)")  # fmt: skip
    lines = ["# memgnn accuracy and latency", "",
             f"Corpus: `{res['corpus']}` ({res['records']} records, {len(res['families'])} "
             f"families); {how}. Command: `{res['command']}`",
             "", "| source/metric | estimator | n | median | p90 | p95 | max | bound miss | "
             "bound margin |", "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for key, row in res["accuracy"].items():
        for name, s in row.items():
            cells = [f"{s[k]:.2%}" for k in ("median", "p90", "p95", "max")]
            miss = f"{s['bound_miss_rate']:.1%}"
            margin = f"{s['bound_margin_median']:.2%}"
            lines.append(f"| {key} | {name} | {s['n']} | {' | '.join(cells)} | {miss} | {margin} |")
    lines += ["", "Per family (scored records; primary metric: reserved on GPU profiles, "
              "allocated on the CPU), median relative error:", "",
              "| family | n | gnn | analytic |", "|---|---|---|---|"]  # fmt: skip
    for f, s in res["per_family"].items():
        lines.append(f"| {f} | {s['n']} | {s['gnn_median']:.2%} | {s['analytic_median']:.2%} |")
    lat = res.get("latency")
    if lat:
        lines += ["", f"Latency ({lat['model_version']}, onnxruntime CPU, 1 thread):", "",
                  f"- head: {lat['head_ms_per_config_batch1']:.3f} ms per config (1 per call), "
                  f"{lat['head_ms_per_config_batch64']:.4f} ms per config (64 per call)",
                  f"- full query (features + head) on a {lat['encode'][1]['nodes']}-node graph: "
                  f"{lat['full_query_ms_5k_nodes']:.2f} ms", "",
                  "| nodes | edges | features ms | ORT encoder ms | encode total ms |",
                  "|---|---|---|---|---|"]  # fmt: skip
        for e in lat["encode"]:
            lines.append(f"| {e['nodes']} | {e['edges']} | {e['features_ms']:.1f} | "
                         f"{e['onnx_encoder_ms']:.1f} | {e['encode_total_ms']:.1f} |")  # fmt: skip
        lines += ["", "ONNX encoder alone at exact encoder-node counts (after inert nodes are "
                  "dropped a captured graph has about half its nodes):", "",
                  "| encoder nodes | edges | ORT encoder ms |", "|---|---|---|"]  # fmt: skip
        for e in lat["encoder_synthetic"]:
            lines.append(f"| {e['nodes']} | {e['edges']} | {e['onnx_encoder_ms']:.1f} |")
    from benchmarks.model_compare import markdown_by_kind
    from benchmarks.paths import markdown_paths

    lines += markdown_by_kind(res.get("by_kind") or {})
    return "\n".join(lines + markdown_paths(res)) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--corpus", default=str(Path(__file__).parents[1] / "dataset/data/corpus-v2"))
    p.add_argument("--folds", type=int, default=4)
    p.add_argument("--split", choices=("family", "random"), default="family",
                   help="family: leave-family-out folds; random: one 80/20 split")  # fmt: skip
    p.add_argument("--max-epochs", type=int, default=30)
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--no-graph", action="store_true", help="ablation: head without embedding")
    p.add_argument("--out-name", default="accuracy", help="results file stem")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--target-miss", type=float, default=0.01, help="bound calibration's miss")
    p.add_argument(
        "--model-dir", default=str(Path(__file__).parents[1] / "predictor" / "default_model")
    )
    p.add_argument("--cache", default="runs/.bench-cache", help="capture cache for latency graphs")
    p.add_argument("--skip-latency", action="store_true")
    p.add_argument(
        "--paths",
        action="store_true",
        help="also the replay per record (vs the labels) and latency per path",
    )
    p.add_argument("--explain", default="", help="a sentence on replay differences")
    p.add_argument("--compare", action="append", default=[], metavar="NAME=FILE",
                   help="another model's answers on the same records "
                   "(benchmarks/model_compare.py), scored beside the GNN")  # fmt: skip
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    for noisy in ("torch", "transformers", "predictor", "dataset", "training"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    data = load_dataset(a.corpus)
    gnn = {"hidden": a.hidden, "layers": a.layers, "use_graph": not a.no_graph}
    cv = cross_validate(data, a.folds, a.max_epochs, a.seed, gnn, a.split, a.target_miss)
    learned = (cv["pred"], cv["bound"])
    untested = np.isnan(cv["mu"][:, 0])  # random split: baselines on the test records only
    from benchmarks.baselines import baselines

    base = {"analytic": data.baseline, **baselines(data, a.corpus)}
    base = {k: np.where(untested[:, None] if v.ndim == 2 else untested, np.nan, v)
            for k, v in base.items()}  # fmt: skip
    live = {f"gnn + {k} live": with_live_samples(data, *learned, k, a.seed) for k in (1, 3)}
    head_only = np.maximum(cv["head_forms_bound"], learned[0])
    old = np.maximum(cv["old_bound"], learned[0])
    preds = {"gnn": learned, "gnn (head forms only)": (learned[0], head_only),
             "gnn (old bound)": (learned[0], old), **live,
             **{k: (v, v) for k, v in base.items()}}  # fmt: skip
    from benchmarks.model_compare import by_kind, compare_predictions, record_kinds

    compared = {}
    for spec in a.compare:
        name, _, path = spec.rpartition("=")
        pred, upper, version = compare_predictions(data, path)
        pred[untested], upper[untested] = np.nan, np.nan  # random split: the test records
        compared[name or version] = (pred, upper)
    preds |= compared
    kind_preds = {"gnn": learned, **compared, "analytic": (base["analytic"],) * 2}
    if a.paths:
        from benchmarks.paths import replay_records

        rp = replay_records(data, a.corpus)
        preds = {"replay": (rp["pred"], rp["pred"]), **preds}
    res = {
        "corpus": _shown(a.corpus), "records": len(data), "families": sorted(set(data.family)),
        "split": a.split, "folds": a.folds if a.split == "family" else 1,
        "fold_info": cv["folds"], "data_hash": data.data_hash,
        "command": "python benchmarks/accuracy.py " + " ".join(argv or sys.argv[1:]),
        "gnn_config": gnn, "target_miss": a.target_miss, "accuracy": summarize(data, preds),
        "per_family": per_family(data, learned[0], base["analytic"]),
        "bound_calibration": cv["calibration"], "reserved_slack": reserved_slack(data),
        "fell_back": {f"{src}/{metric}": int(cv["fell_back"][np.array(data.source) == src, m].sum())
                      for src in sorted(set(data.source)) for m, metric in enumerate(METRICS)},
        "by_kind": by_kind(data, record_kinds(data, a.corpus), kind_preds),
    }  # fmt: skip
    if a.paths:
        from benchmarks.paths import latency_per_path

        labelled = int(np.any(~np.isnan(data.measured), axis=1).sum())
        res["replay"] = {"records": labelled, "exact": labelled - len(rp["differ"]),
                         "differ": rp["differ"], "explained": a.explain}  # fmt: skip
        if (Path(a.model_dir) / "model_card.json").is_file():
            res["path_latency"] = latency_per_path(data, a.corpus, Path(a.model_dir))
    if not a.skip_latency and (Path(a.model_dir) / "model_card.json").is_file():
        res["latency"] = latency(Path(a.model_dir), Path(a.cache))
    write_results(a.out_name, res, markdown(res))
    print(markdown(res))


if __name__ == "__main__":
    main()
