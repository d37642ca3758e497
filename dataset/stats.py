"""`memgnn dataset stats`: what a corpus holds, from its record table.

`corpus_stats(corpus)` returns a JSON-ready dict: record counts (ok / errors / skipped),
families and per-family counts, configs by precision, optimizer (+ implementation),
checkpointing, grad accumulation, backend, device, LoRA (and rank), QLoRA base and attention
kernel, label ranges (min / median / max of
each metric over the ok records), graph coverage, failures grouped by reason, and
`integrity`: parts that do not read (their rows are not in the counts) and graph files
that fail their checksum and do not parse. `render_stats(stats)` formats it as text tables.

The command changes nothing on disk. When the corpus has integrity problems it says so and
exits with status 1 unless `--allow-corrupt` is given (`memgnn dataset build` repairs
them). Output to a closed pipe (`| head`) ends it quietly.
"""

from __future__ import annotations

import json
import logging
import re
import statistics
from collections import Counter, defaultdict
from typing import Any

from memgnn.dataset.corpus import Corpus

log = logging.getLogger(__name__)

METRICS = ("peak_allocated_bytes", "peak_reserved_bytes", "device_total_bytes")
CONFIG_AXES = (
    "precision",
    "optimizer",
    "optimizer_impl",
    "checkpointing",
    "grad_accum",
    "backend",
    "device",
    "peft",  # none | lora r=R
    "quantize_base",  # none where the TrainSpec had no such field
    "attention",  # default where the TrainSpec had no such field
)
SKIP_PREFIX = "skipped: "


def _peft(train: dict[str, Any]) -> str:
    method = train.get("peft", "none")
    return f"{method} r={train.get('lora_r')}" if method == "lora" else method


def failure_reason(error: str) -> str:
    """An error message with its run-specific details (numbers, module paths) blanked."""
    text = error.strip().splitlines()[0] if error.strip() else "unknown error"
    text = re.sub(r"'[\w.\-]*\.[\w.\-]*'", "'…'", text)  # dotted module names
    text = re.sub(r"\b\d+\b", "N", text)  # standalone numbers (sizes, counts)
    return text[:160]


def _range(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"count": 0, "min": None, "median": None, "max": None}
    return {
        "count": len(values),
        "min": min(values),
        "median": statistics.median(values),
        "max": max(values),
    }


def corpus_stats(corpus: Corpus) -> dict[str, Any]:
    table = corpus.table()
    rows = table.to_pylist()
    bad_graphs = corpus.graph_problems(table)
    per_family: dict[str, Counter] = defaultdict(Counter)
    models: Counter = Counter()
    configs: dict[str, Counter] = {axis: Counter() for axis in CONFIG_AXES}
    labels: dict[str, list[float]] = {m: [] for m in (*METRICS, "seconds")}
    failures: dict[str, dict[str, Any]] = {}
    graph_ids, no_graph, oom = set(), 0, 0
    for row in rows:
        train = json.loads(row["train"] or "{}")
        stats = json.loads(row["stats"] or "{}")
        fam = per_family[row["family"]]
        fam["records"] += 1
        models[row["model"]] += 1
        checkpointing = row["checkpointing"] or "none"
        values = {
            "precision": row["precision"],
            "optimizer": row["optimizer"],
            "optimizer_impl": train.get("optimizer_impl"),
            "checkpointing": "blocks:N" if checkpointing.startswith("blocks:") else checkpointing,
            "grad_accum": row["grad_accum"],
            "backend": row["backend"],
            "device": row["device"],
            "peft": _peft(train),
            "quantize_base": train.get("quantize_base", "none"),
            "attention": train.get("attention", "default"),
        }
        for axis, value in values.items():
            configs[axis][str(value)] += 1
        if row["graph_id"]:
            graph_ids.add(row["graph_id"])
        error = row["error"]
        if error:
            skipped = error.startswith(SKIP_PREFIX)
            fam["skipped" if skipped else "errors"] += 1
            reason = failure_reason(error)
            entry = failures.setdefault(
                reason, {"count": 0, "skipped": skipped, "families": Counter()}
            )
            entry["count"] += 1
            entry["families"][row["family"]] += 1
            continue
        fam["ok"] += 1
        for metric in METRICS:
            if row[metric] is not None:
                labels[metric].append(row[metric])
        labels["seconds"].append(row["seconds"])
        no_graph += not row["graph_id"]
        oom += bool(stats.get("would_oom"))
    stored = set(corpus.graph_ids())
    ok = sum(f["ok"] for f in per_family.values())
    skipped = sum(f["skipped"] for f in per_family.values())
    ranked = sorted(failures.items(), key=lambda kv: -kv[1]["count"])
    return {
        "root": str(corpus.root),
        "records": len(rows),
        "ok": ok,
        "errors": len(rows) - ok - skipped,
        "skipped": skipped,
        "families": sorted(per_family),
        "per_family": {
            name: {k: c[k] for k in ("records", "ok", "errors", "skipped")}
            for name, c in sorted(per_family.items())
        },
        "models": dict(sorted(models.items())),
        "configs": {axis: dict(sorted(c.items())) for axis, c in configs.items()},
        "labels": {metric: _range(values) for metric, values in labels.items()},
        "would_oom": oom,
        "graphs": {
            "referenced": len(graph_ids),
            "stored": len(stored),
            "missing": len(graph_ids - stored),  # referenced by a row, not in graphs/
            "ok_records_without_graph": no_graph,
        },
        "failures": [
            {
                "reason": reason,
                "count": e["count"],
                "skipped": e["skipped"],
                "families": dict(e["families"].most_common()),
            }
            for reason, e in ranked
        ],
        "torch_versions": sorted({r["torch_version"] for r in rows if r["torch_version"]}),
        "integrity": {
            "corrupt_parts": dict(corpus.corrupt_parts),  # part file -> why it does not read
            "corrupt_graphs": bad_graphs,  # graph id -> why
            "records_with_corrupt_graph": sum(r["graph_id"] in bad_graphs for r in rows),
        },
    }


def integrity_problems(stats: dict[str, Any]) -> str | None:
    """One line on what is corrupt in the corpus, or None."""
    i = stats["integrity"]
    parts, graphs = i["corrupt_parts"], i["corrupt_graphs"]
    if not parts and not graphs:
        return None
    said = []
    if parts:
        said.append(f"{len(parts)} part(s) do not read and their rows are not counted "
                    f"({', '.join(sorted(parts))})")  # fmt: skip
    if graphs:
        said.append(f"{len(graphs)} graph file(s) are corrupt ({', '.join(sorted(graphs))}; "
                    f"named by {i['records_with_corrupt_graph']} records)")  # fmt: skip
    return "; ".join(said)


def _human(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def render_stats(stats: dict[str, Any]) -> str:
    out = [
        f"corpus {stats['root']}",
        f"records {stats['records']}: ok {stats['ok']}, errors {stats['errors']}, "
        f"skipped {stats['skipped']}; {len(stats['families'])} families",
        "",
        f"{'family':<12} {'records':>8} {'ok':>6} {'errors':>7} {'skipped':>8}",
    ]
    for name, c in stats["per_family"].items():
        out.append(f"{name:<12} {c['records']:>8} {c['ok']:>6} {c['errors']:>7} {c['skipped']:>8}")
    out.append("")
    for axis, counts in stats["configs"].items():
        out.append(f"{axis + ':':<16} " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    out += ["", f"{'label (ok records)':<22} {'count':>6} {'min':>11} {'median':>11} {'max':>11}"]
    for metric, r in stats["labels"].items():
        fmt = (lambda v: "-" if v is None else f"{v:.2f} s") if metric == "seconds" else _human
        out.append(
            f"{metric:<22} {r['count']:>6} {fmt(r['min']):>11} {fmt(r['median']):>11} "
            f"{fmt(r['max']):>11}"
        )
    g = stats["graphs"]
    out += [
        "",
        f"graphs: {g['referenced']} referenced, {g['stored']} stored, {g['missing']} missing; "
        f"ok records without a graph: {g['ok_records_without_graph']}; "
        f"simulated OOM: {stats['would_oom']}",
    ]
    problems = integrity_problems(stats)
    if problems:
        out += ["", f"CORRUPT: {problems}"]
        out += [f"  part {k}: {v}" for k, v in stats["integrity"]["corrupt_parts"].items()]
        out += [f"  graph {k}: {v}" for k, v in stats["integrity"]["corrupt_graphs"].items()]
    if stats["failures"]:
        out += ["", "failures by reason:"]
        for f in stats["failures"]:
            fams = ", ".join(f"{k} {v}" for k, v in f["families"].items())
            out.append(f"  {f['count']:>5}  {f['reason']}  [{fams}]")
    return "\n".join(out)
