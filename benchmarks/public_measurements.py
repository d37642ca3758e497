"""memgnn next to published GPU measurements (public-gpu-measurements.csv), row by row.

    nice -n 10 python benchmarks/public_measurements.py [--only vit1,litgpt22] [--force]
        [--timeout 1500] [--csv PATH] -> benchmarks/results/public_measurements.{json,md}

For every CSV row: its measured value in its own metric (max_memory_allocated or
max_memory_reserved; GB = 1e9 bytes or GiB, converted to bytes), memgnn's prediction in
the same metric (`memgnn predict --json`, one subprocess per row under a time limit,
captures cached), the relative error (predicted - measured) / measured, the method memgnn
used, and for rows memgnn cannot express, why. Each row's settings and their sources are
in public_rows.py. OOM rows: memgnn's verdict is predicted device_total > the profile's
device memory. Results are kept per row in the .json: a rerun skips
rows already done unless --force (or --only names them).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import logging
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from memgnn.predictor.spec.devices import get_profile
from public_analysis import analyses, tinyllama_analysis
from public_rows import BY_ID, DIFFERENCES, PROBES, Row

from memgnn.cli.options import option_flags

log = logging.getLogger("public_measurements")
ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results"
CSV_CANDIDATES = (
    ROOT.parent / "shared" / "reference" / "public-gpu-measurements.csv",
    ROOT.parents[1] / "shared" / "reference" / "public-gpu-measurements.csv",
)
UNITS = {"GB(1e9)": 10**9, "GiB": 2**30}
RUN_FIRST = (
    "litgpt22 litgpt23 litgpt20 litgpt16 litgpt19 litgpt9 litgpt10 vit4 litgpt11 litgpt14 "
    "litgpt1 vit1 litgpt15 litgpt18 vit3 vit2 vit5 vit6"
).split()
MEMGNN = [str(Path(sys.executable).with_name("memgnn"))]


def measured_bytes(value: str, unit: str) -> int | None:
    """The CSV figure in bytes (None for OOM); `unit` is the row's reading of it."""
    if value.strip().upper() == "OOM":
        return None
    return int(round(float(value) * UNITS[unit]))


def predict_args(row: Row) -> list[str]:
    args = ["predict", "--model", row.model, "--batch", str(row.batch), "--json"]
    if row.task:
        args += ["--task", row.task]
    for k, v in row.model_args.items():
        args += ["--model-arg", f"{k}={v}"]
    if row.seq is not None:
        args += ["--seq", str(row.seq)]
    for k, v in row.dims.items():
        args += ["--dim", f"{k}={v}"]
    args += ["--device", row.device, "--metric", row.metric, "--method", row.method]
    return args + option_flags(row.train)


def run_row(row: Row, csv_row: dict[str, str], timeout: float, dry: bool = False) -> dict:
    """One row's result record (measured, predicted, error or the reason there is none);
    `dry`: stop short of running memgnn (status "not run")."""
    out: dict[str, Any] = {
        "id": row.id,
        "csv": {k: csv_row[k] for k in ("model", "task", "batch", "seq_or_image", "precision",
                                        "optimizer", "gpu", "metric", "measured", "unit")},
        "settings": {
            **{k: v for k, v in dataclasses.asdict(row).items() if k not in ("why_not", "train")},
            **row.spec.flat(),
        },
        "measured_bytes": None,
        "measured_oom": csv_row["measured"].strip().upper() == "OOM",
    }  # fmt: skip
    if row.why_not:
        return out | {"status": "not expressible", "why": row.why_not}
    out["measured_bytes"] = measured_bytes(csv_row["measured"], row.unit)
    niceness = os.nice(0)  # captures run at niceness 10 (the shared machine's rule), not 10 more
    cmd = [*(["nice", "-n", str(10 - niceness)] if niceness < 10 else []), *MEMGNN]
    out["command"] = "memgnn " + " ".join(predict_args(row))
    if dry:
        return out | {"status": "not run", "why": "the run stopped before this row (rerun)"}
    cmd += predict_args(row)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return out | {"status": "timeout", "why": f"predict ran past {timeout:.0f} s"}
    out["seconds"] = round(time.perf_counter() - t0, 1)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["(no stderr)"])[-1]
        return out | {"status": "error", "why": tail[:300]}
    pred = json.loads(proc.stdout)
    predicted = int(pred["predicted_peak_bytes"])
    out |= {
        "status": "done",
        "predicted_bytes": predicted,
        "upper_bound_bytes": int(pred["upper_bound_bytes"]),
        "metric": pred["metric"],
        "method": pred["method"],
        "categories": pred["breakdown"].get("categories", {}),
        "parameters": pred.get("model", {}).get("parameters"),
        "trainable_parameters": pred.get("model", {}).get("trainable_parameters"),
    }
    if out["measured_oom"]:
        total = get_profile(row.device).total_bytes
        out["device_total_bytes"] = total
        out["oom_predicted"] = predicted > total
        out["verdict_right"] = out["oom_predicted"]
    else:
        out["rel_error"] = (predicted - out["measured_bytes"]) / out["measured_bytes"]
    return out


def summary(results: dict[str, dict]) -> dict[str, Any]:
    rows = [r for r in results.values() if "probe_of" not in r]
    single = [r for r in rows if r["settings"].get("gpus", 1) == 1]
    multi = [r for r in rows if r["settings"].get("gpus", 1) > 1]
    valued = [r for r in single if not r["measured_oom"]]
    done = [r for r in valued if r["status"] == "done"]
    exact = [r for r in done if not (r["settings"]["approximate"] or r["settings"].get("suspect"))]
    ooms = [r for r in single + multi if r["measured_oom"] and r["status"] == "done"]
    expressible = [r for r in single if r["status"] != "not expressible"]
    med = lambda rs: statistics.median(abs(r["rel_error"]) for r in rs) if rs else None  # noqa: E731
    groups: dict[str, list[dict]] = {}
    for r in done:
        groups.setdefault(row_kind(r["settings"]), []).append(r)
    return {
        "median_abs_rel_error_by_kind": {k: med(v) for k, v in sorted(groups.items())},
        "rows_by_kind": {k: len(v) for k, v in sorted(groups.items())},
        "single_gpu_rows": len(single),
        "single_gpu_expressible": len(expressible),
        "expressible_fraction": len(expressible) / len(single) if single else None,
        "single_gpu_valued_done": len(done),
        "single_gpu_pending": sum(r["status"] == "pending" for r in single),
        "single_gpu_not_run": sum(r["status"] in ("not run", "timeout") for r in single),
        "median_abs_rel_error": med(done),
        "median_abs_rel_error_exact_figures": med(exact),
        "oom_verdicts": len(ooms),
        "oom_verdicts_right": sum(bool(r.get("verdict_right")) for r in ooms),
        "multi_gpu_rows": len(multi),
        "multi_gpu_done": sum(r["status"] == "done" for r in multi),
    }


def row_kind(st: dict[str, Any]) -> str:
    """full | lora-qv (adapters on attention only) | lora-all | qlora | vit | t0."""
    if st["id"].startswith(("vit", "peft")):
        return "vit" if st["id"].startswith("vit") else "t0"
    if st.get("quantize_base"):
        return "qlora"
    if st["peft"] == "none":
        return "full"
    mlp = {"gate_proj", "up_proj", "down_proj", "fc1", "fc2", "gate_up_proj"}
    return "lora-all" if mlp & set(st["lora_targets"].split(",")) else "lora-qv"


def _gb(n: int | None) -> str:
    return "-" if n is None else f"{n / 1e9:.2f} GB"


def write_md(results: dict[str, dict], order: list[str], path: Path) -> None:
    s = summary(results)
    pct = lambda x: "-" if x is None else f"{100 * x:.1f}%"  # noqa: E731
    lines = [
        "# memgnn vs published GPU measurements",
        "",
        "`nice -n 10 python benchmarks/public_measurements.py` (settings per row and their "
        "sources: benchmarks/public_rows.py). Bytes are shown as GB = 1e9 bytes; the "
        "measured figure is converted from the row's own unit. Error = (predicted - "
        "measured) / measured, in the row's own metric.",
        "",
        f"- single-GPU rows: {s['single_gpu_rows']}, expressible by memgnn: "
        f"{s['single_gpu_expressible']} ({pct(s['expressible_fraction'])}; target >= 80%), "
        f"of them pending a feature: {s['single_gpu_pending']}, not run yet (the run was cut "
        f"short; rerun the script, it resumes): {s['single_gpu_not_run']}",
        f"- median |relative error| over the {s['single_gpu_valued_done']} expressible "
        f"single-GPU rows with a measured figure and a prediction: "
        f"{pct(s['median_abs_rel_error'])} (target <= 10%); without the approximate "
        f"(read-off-a-plot) and suspect (contradicted by their own setup) figures: "
        f"{pct(s['median_abs_rel_error_exact_figures'])}",
        "- median |relative error| by kind of row: "
        + ", ".join(
            f"{k} {pct(v)} ({s['rows_by_kind'][k]})"
            for k, v in s["median_abs_rel_error_by_kind"].items()
        ),
        f"- OOM rows: memgnn's verdict right on {s['oom_verdicts_right']} of "
        f"{s['oom_verdicts']} predicted",
        f"- multi-GPU rows: {s['multi_gpu_rows']}, predicted: {s['multi_gpu_done']}",
        f"- rows run with older settings than public_rows.py's (rerun them): "
        f"{', '.join(r['id'] for r in results.values() if stale(r)) or 'none'}",
        "",
        "| id | model | metric | measured | predicted | error | method | status / why |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for rid in order:
        r = results.get(rid)
        if r is None:
            continue
        c = r["csv"]
        if r["status"] != "done":
            err, pred, why = "-", "-", f"{r['status']}: {r['why']}"
        elif r["measured_oom"]:
            pred = _gb(r["predicted_bytes"])
            err = "OOM " + ("predicted" if r["oom_predicted"] else "NOT predicted")
            why = f"verdict {'right' if r['verdict_right'] else 'wrong'} (device "
            why += f"{_gb(r['device_total_bytes'])})"
        else:
            pred, err = _gb(r["predicted_bytes"]), f"{100 * r['rel_error']:+.1f}%"
            why = "approximate figure" if r["settings"]["approximate"] else ""
            why = "suspect figure (see its notes)" if r["settings"].get("suspect") else why
        if stale(r):
            why = "; ".join(filter(None, [why, "ran with older settings: rerun it (--only)"]))
        meas = "OOM" if r["measured_oom"] else _gb(r["measured_bytes"])
        metric = r.get("metric") or (
            r["settings"]["metric"] if r["status"] != "not expressible" else "-"
        )
        lines.append(
            f"| {rid} | {c['model']} | {metric} | {meas} | {pred} | {err} | "
            f"{r.get('method', '-')} | {why} |"
        )
    lines += ["", "## What differs from the measured runs", "", DIFFERENCES, ""]
    lines += ["## Settings and sources per row", ""]
    for rid in order:
        r = results.get(rid)
        if r is None or r["status"] == "not expressible":
            continue
        st = r["settings"]
        lines.append(f"- **{rid}** {st['source']}. {st['notes']}.")
        if "command" in r:
            lines.append(f"  `{r['command']}` ({r.get('seconds', '-')} s)")
    lines += tinyllama_analysis(results)
    lines += analyses(results)
    path.write_text("\n".join(lines) + "\n")


def stale(r: dict) -> bool:
    """A stored row whose command is not what its settings in public_rows.py run now."""
    row = BY_ID.get(r["id"])
    return bool(row and "command" in r and r["command"] != "memgnn " + " ".join(predict_args(row)))


def priority(row: Row) -> tuple[int, int]:
    """Run order, so a run cut short covers the most: LitGPT single-GPU rows with a measured
    figure, cheapest captures first (fewest layers, cached), QLoRA and ViT interleaved, then
    the rest of them, T0, OOM rows, several GPUs."""
    rank = {rid: k for k, rid in enumerate(RUN_FIRST)}
    if row.id in rank:
        return 0, rank[row.id]
    if row.id.startswith("vit"):
        return 1, 0
    if row.spec.quant.base != "none" and row.spec.parallel.gpus == 1:
        return 2, -row.batch
    if row.id.startswith("peft"):
        return 3, 0
    return (4 if row.spec.parallel.gpus == 1 else 5), 0


def save(jpath: Path, results: dict[str, dict], order: list[str], rid: str | None = None) -> None:
    """Write the .json and .md; rows another run stored meanwhile are kept (only `rid`
    is this run's news when given)."""
    if rid is not None and jpath.is_file():
        stored = json.loads(jpath.read_text()).get("rows", {})
        results.update({k: v for k, v in stored.items() if k != rid and k not in results})
    jpath.write_text(json.dumps({"summary": summary(results), "rows": results}, indent=1))
    write_md(results, order, OUT / "public_measurements.md")


def find_csv(arg: str | None) -> Path:
    for p in [Path(arg)] if arg else list(CSV_CANDIDATES):
        if p.is_file():
            return p
    raise SystemExit(f"public-gpu-measurements.csv not found (tried {CSV_CANDIDATES})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--csv")
    ap.add_argument("--only", default="", help="comma-separated row ids (rerun them)")
    ap.add_argument("--force", action="store_true", help="rerun rows already done")
    ap.add_argument("--timeout", type=float, default=1500.0, help="seconds per row")
    ap.add_argument("--report-only", action="store_true", help="rewrite .md/.json, run nothing")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    with find_csv(args.csv).open() as f:
        csv_rows = {r["id"]: r for r in csv.DictReader(f)}
    missing = set(csv_rows) - set(BY_ID)
    if missing:
        raise SystemExit(f"rows without settings in public_rows.py: {sorted(missing)}")
    OUT.mkdir(parents=True, exist_ok=True)
    jpath = OUT / "public_measurements.json"
    saved = json.loads(jpath.read_text()) if jpath.is_file() else {}
    results: dict[str, dict] = saved.get("rows", {})
    only = {x.strip() for x in args.only.split(",") if x.strip()}
    order = list(csv_rows)
    if args.report_only:  # rows not done get what is known without running them
        for rid, r in results.items():  # descriptions may have been edited since the run
            row = BY_ID.get(rid) or PROBES[rid][1]
            r["settings"] |= {k: getattr(row, k) for k in ("suspect", "approximate", "notes")}
        for rid in order:
            if results.get(rid, {}).get("status") not in ("done", "error", "timeout"):
                results[rid] = run_row(BY_ID[rid], csv_rows[rid], args.timeout, dry=True)
    for k, rid in enumerate(sorted(order, key=lambda i: priority(BY_ID[i])), 1):
        if args.report_only or (only and rid not in only):
            continue
        old = results.get(rid, {})
        if old.get("status") in ("done", "not expressible") and not (args.force or only):
            continue
        log.info("[%d/%d] %s ...", k, len(order), rid)
        results[rid] = run_row(BY_ID[rid], csv_rows[rid], args.timeout)
        r = results[rid]
        shown = f"{100 * r['rel_error']:+.1f}%" if "rel_error" in r else r.get("why", "")
        log.info("[%d/%d] %s: %s %s", k, len(order), rid, r["status"], shown)
        save(jpath, results, order, rid)
        for pid, (base, probe) in PROBES.items():
            if base == rid and (args.force or results.get(pid, {}).get("status") != "done"):
                log.info("probe %s ...", pid)
                results[pid] = run_row(probe, csv_rows[base], args.timeout)
                results[pid]["probe_of"] = base
                save(jpath, results, order, pid)
    save(jpath, results, order)
    print(json.dumps(summary(results), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
