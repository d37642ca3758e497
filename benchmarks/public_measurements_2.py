"""memgnn next to the published GPU measurements of public-gpu-measurements-2.csv, row by row.

    MEMGNN_CACHE=/work/cache-public2 nice -n 10 python benchmarks/public_measurements_2.py \
        [--only ttune10,aai2] [--force] [--timeout 1200] [--csv PATH] [--report-only]
        -> benchmarks/results/public_measurements_2.{json,md}

Every one of the 97 rows (settings and sources: benchmarks/public_rows2.py): expressible or
the named reasons it is not; for an expressible row memgnn's prediction in the row's own
metric (`memgnn predict --json`, or `memgnn predict --config FILE` where the row's framework
config is in benchmarks/configs/; one subprocess per row under a time limit, captures cached
in $MEMGNN_CACHE) and the relative error (predicted - measured) / measured, the measured
figure converted to bytes from the row's unit. Rows run grouped by model (a capture serves
the rows after it); results are kept per row in the .json, so a rerun resumes: rows done are
skipped unless --force (or --only names them).
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
from collections import Counter
from pathlib import Path
from typing import Any

from public_measurements import MEMGNN, OUT, ROOT, UNITS, measured_bytes, predict_args
from public_rows import Row
from public_rows2 import BY_ID_2, REASONS, reason_keys

from memgnn.cli.options import option_flags

log = logging.getLogger("public_measurements_2")
CSV_NAME = "public-gpu-measurements-2.csv"
JSON = OUT / "public_measurements_2.json"
MD = OUT / "public_measurements_2.md"
COMMAND = (
    "MEMGNN_CACHE=/work/cache-public2 nice -n 10 .venv/bin/python "
    "benchmarks/public_measurements_2.py"
)
# one row per source / technique first, so a run cut short covers the most kinds
RUN_FIRST = "ttune20 ttune10 aai2 ttune21 unsloth3 ttune22 aai3 ttune23 aoopt12 aai11".split()


def args_of(row: Row) -> list[str]:
    """`memgnn predict` arguments of an expressible row: its config file where it has one
    (flags then state only what the file does not say), else every setting as flags."""
    if not row.config:
        return predict_args(row)
    args = ["predict", "--config", row.config, "--json"]
    for k, v in row.model_args.items():
        args += ["--model-arg", f"{k}={v}"]
    args += ["--device", row.device, "--metric", row.metric, "--method", row.method]
    return args + option_flags(row.train, defaults=True)


def run_row(row: Row, csv_row: dict[str, str], timeout: float, dry: bool = False) -> dict:
    out: dict[str, Any] = {
        "id": row.id,
        "csv": {k: csv_row[k] for k in ("model", "gpu", "n_gpus", "batch", "seq", "metric",
                                        "measured_gb", "source")},
        "settings": {
            **{k: v for k, v in dataclasses.asdict(row).items() if k not in ("why_not", "train")},
            **(row.spec.flat() if not row.why_not else {}),
        },
        "measured_bytes": None,
    }  # fmt: skip
    if row.why_not:
        keys = reason_keys(row.why_not)
        return out | {"status": "not expressible", "why": row.why_not, "reasons": keys}
    out["measured_bytes"] = measured_bytes(csv_row["measured_gb"], row.unit)
    out["command"] = "memgnn " + " ".join(args_of(row))
    if dry:
        return out | {"status": "not run", "why": "not run yet (rerun the script: it resumes)"}
    niceness = os.nice(0)
    cmd = [*(["nice", "-n", str(10 - niceness)] if niceness < 10 else []), *MEMGNN]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            cmd + args_of(row), capture_output=True, text=True, timeout=timeout, cwd=ROOT
        )
    except subprocess.TimeoutExpired:
        return out | {"status": "timeout", "why": f"predict ran past {timeout:.0f} s"}
    out["seconds"] = round(time.perf_counter() - t0, 1)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["(no stderr)"])[-1]
        return out | {"status": "error", "why": tail[:400]}
    pred = json.loads(proc.stdout)
    predicted = int(pred["predicted_peak_bytes"])
    return out | {
        "status": "done",
        "predicted_bytes": predicted,
        "upper_bound_bytes": int(pred["upper_bound_bytes"]),
        "metric": pred["metric"],
        "method": pred["method"],
        "warnings": pred.get("warnings", []),
        "categories": pred["breakdown"].get("categories", {}),
        # off-device figures (FSDP / optimizer / activation offload), not in the prediction
        **{k: v for k, v in pred["breakdown"].items() if k.startswith("host_")},
        "rel_error": (predicted - out["measured_bytes"]) / out["measured_bytes"],
    }


def summary(results: dict[str, dict], total: int) -> dict[str, Any]:
    rows = list(results.values())
    expressible = [r for r in rows if r["status"] != "not expressible"]
    done = [r for r in expressible if r["status"] == "done"]
    exact = [r for r in done if not (r["settings"]["approximate"] or r["settings"]["suspect"])]
    fitted = [r for r in done if not r["settings"]["suspect"]]
    med = lambda rs: statistics.median(abs(r["rel_error"]) for r in rs) if rs else None  # noqa: E731
    not_expr = [r for r in rows if r["status"] == "not expressible"]
    return {
        "rows": total,
        "expressible": len(expressible),
        "expressible_share": len(expressible) / total if total else None,
        "done": len(done),
        "not_run": [r["id"] for r in expressible if r["status"] == "not run"],
        "failed": {r["id"]: r["why"] for r in expressible if r["status"] in ("error", "timeout")},
        "fitted": len(fitted),
        "median_abs_rel_error": med(fitted),
        "median_abs_rel_error_with_suspect": med(done),
        "median_abs_rel_error_exact_figures": med(exact),
        "under_predicted_over_10pct": sorted(
            (r["id"] for r in done if r["rel_error"] < -0.10), key=_num
        ),
        "suspect_rows": [r["id"] for r in expressible if r["settings"]["suspect"]],
        "primary_reason_counts": dict(Counter(r["reasons"][0] for r in not_expr).most_common()),
        "reason_counts": dict(Counter(k for r in not_expr for k in r["reasons"]).most_common()),
    }


def _num(rid: str) -> tuple[str, int]:
    head = rid.rstrip("0123456789")
    return head, int(rid[len(head) :] or 0)


def _g(n: int | None, unit: str = "GiB") -> str:
    """Bytes in the row's own unit (GiB, or GB = 1e9 bytes)."""
    if n is None:
        return "-"
    return f"{n / UNITS[unit]:.2f} {'GB' if unit == 'GB(1e9)' else unit}"


def write_md(results: dict[str, dict], order: list[str], total: int) -> None:
    s = summary(results, total)
    pct = lambda x: "-" if x is None else f"{100 * x:.1f}%"  # noqa: E731
    lines = [
        "# memgnn vs published GPU measurements, set 2 (public-gpu-measurements-2.csv)",
        "",
        f"`{COMMAND}` (settings and sources per row: benchmarks/public_rows2.py; config files: "
        "benchmarks/configs/). Error = (predicted - measured) / measured, in the row's "
        "own metric. Measured and predicted are shown in the row's own unit (GiB = 2^30 "
        "bytes, GB = 1e9 bytes, as the source reports it; not-expressible rows: the CSV's "
        "figure as written).",
        "",
        f"- rows: {s['rows']}; expressible by memgnn: {s['expressible']} "
        f"({pct(s['expressible_share'])}); predicted: {s['done']}; not run yet (rerun the "
        f"script, it resumes): {len(s['not_run'])} {' '.join(s['not_run'])}; failed: "
        f"{len(s['failed'])} {' '.join(s['failed'])}",
        f"- median |error| over the {s['fitted']} predicted rows that are not suspect (a "
        f"figure contradicted by its own setup): {pct(s['median_abs_rel_error'])}; with "
        f"them: {pct(s['median_abs_rel_error_with_suspect'])}; exact figures only (not "
        f"approximate, not suspect): {pct(s['median_abs_rel_error_exact_figures'])}",
        "- under-predicted by more than 10%: "
        + (", ".join(s["under_predicted_over_10pct"]) or "none"),
        f"- suspect rows (run, reported, not fitted): {', '.join(s['suspect_rows']) or 'none'}",
        "- not expressible, by primary reason: "
        + ", ".join(f"{REASONS.get(k, k)}: {n}" for k, n in s["primary_reason_counts"].items()),
        "- not expressible, every reason named (a row counts under each of its reasons): "
        + ", ".join(f"{k} {n}" for k, n in s["reason_counts"].items()),
        "",
        "| id | model | gpu | metric | measured | predicted | error | status / why |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for rid in order:
        r = results.get(rid)
        if r is None:
            continue
        c, st = r["csv"], r["settings"]
        if r["status"] == "done":
            pred, err = _g(r["predicted_bytes"], st["unit"]), f"{100 * r['rel_error']:+.1f}%"
            flags = [f for f in ("approximate", "suspect") if st.get(f)]
            flags += ["boundary (the card's memory)"] if "boundary row" in st["notes"] else []
            why = f"done ({r['method']}, {r['seconds']} s)" + (
                f"; {', '.join(flags)} figure" if flags else ""
            )
        else:
            pred, err, why = "-", "-", f"{r['status']}: {r['why']}"
        metric = st["metric"] if r["status"] != "not expressible" else "-"
        meas = _g(r["measured_bytes"], st["unit"]) if r["measured_bytes"] else c["measured_gb"]
        lines.append(
            f"| {rid} | {st['model'] or c['model']} | {c['gpu']} | {metric} | {meas} | {pred} "
            f"| {err} | {why} |"
        )
    lines += unsloth_gap(results)
    lines += ["", "## Settings and sources per expressible row", ""]
    for rid in order:
        r = results.get(rid)
        if r is None or r["status"] == "not expressible":
            continue
        st = r["settings"]
        lines.append(f"- **{rid}** {st['source']}. {st['notes']}.")
        lines.append(f"  `{r.get('command', '-')}`")
    MD.write_text("\n".join(lines) + "\n")


def unsloth_gap(results: dict[str, dict]) -> list[str]:
    """The Unsloth boundary rows' shortfall (card - predicted) against the sequence length,
    by least squares: its slope per token and its intercept."""
    pts = [
        (r["settings"]["seq"], (r["measured_bytes"] - r["predicted_bytes"]) / 2**30)
        for rid, r in results.items()
        if rid.startswith("unsloth") and r["status"] == "done" and "70B" not in r["csv"]["model"]
    ]
    if len(pts) < 3:
        return []
    slope, intercept = statistics.linear_regression(*zip(*pts))
    shown = ", ".join(f"S {s}: {g:.2f} GiB" for s, g in sorted(pts))
    return [
        "",
        "## The Unsloth boundary rows (Llama-3.1-8B QLoRA, HF + FA2)",
        "",
        f"Card minus predicted device_total: {shown}. Least squares: {intercept:.2f} GiB + "
        f"{slope * 2**30 / 1024:.0f} KiB per token. A candidate explanation, not verified "
        "(the source's script is not published): peft's prepare_model_for_kbit_training, the "
        "usual HF QLoRA path, casts every non-quantised parameter to fp32. The input "
        "embedding and lm_head then hold 2 x 525e6 x 2 B = 1.96 GiB more, and the residual "
        "stream leaves the fp32 embedding in fp32, so each of the 32 checkpointed layer "
        "inputs is 4096 x 4 B per token, not x 2 B: 32 x 4096 x 2 B = 256 KiB per token "
        "more. memgnn has no option for that cast; the rest of the intercept is the headroom "
        "a boundary row leaves below the card.",
    ]


def save(results: dict[str, dict], order: list[str], total: int) -> None:
    JSON.write_text(
        json.dumps({"command": COMMAND, "summary": summary(results, total), "rows": results},
                   indent=1)
    )  # fmt: skip
    write_md(results, order, total)


def find_csv(arg: str | None) -> Path:
    cands = [Path(arg)] if arg else [p / "shared" / "reference" / CSV_NAME for p in
                                     (ROOT.parent, ROOT.parents[1])]  # fmt: skip
    for p in cands:
        if p.is_file():
            return p
    raise SystemExit(f"{CSV_NAME} not found (tried {cands})")


def run_order(ids: list[str]) -> list[str]:
    """RUN_FIRST, then the other expressible rows grouped by model (cheapest models first)."""
    rest = [i for i in ids if i not in RUN_FIRST and not BY_ID_2[i].why_not]
    big = lambda i: ("70b" in BY_ID_2[i].model.lower(), BY_ID_2[i].model, _num(i))  # noqa: E731
    return [i for i in RUN_FIRST if i in ids] + sorted(rest, key=big)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--csv")
    ap.add_argument("--only", default="", help="comma-separated row ids (rerun them)")
    ap.add_argument("--force", action="store_true", help="rerun rows already done")
    ap.add_argument("--timeout", type=float, default=1200.0, help="seconds per row")
    ap.add_argument("--report-only", action="store_true", help="rewrite .md/.json, run nothing")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    with find_csv(args.csv).open() as f:
        csv_rows = {r["id"]: r for r in csv.DictReader(f)}
    missing = set(csv_rows) - set(BY_ID_2)
    if missing:
        raise SystemExit(f"rows without settings in public_rows2.py: {sorted(missing)}")
    OUT.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict] = json.loads(JSON.read_text())["rows"] if JSON.is_file() else {}
    order, total = list(csv_rows), len(csv_rows)
    only = {x.strip() for x in args.only.split(",") if x.strip()}
    for rid in order:  # triage every row (cheap); rows not yet run are marked so
        if results.get(rid, {}).get("status") not in ("done", "error", "timeout") or (
            results[rid].get("command") != "memgnn " + " ".join(args_of(BY_ID_2[rid]))
            and not BY_ID_2[rid].why_not
        ):
            results[rid] = run_row(BY_ID_2[rid], csv_rows[rid], args.timeout, dry=True)
        else:  # descriptions may have been edited since the run
            row = BY_ID_2[rid]
            keys = ("notes", "source", "approximate", "suspect")
            results[rid]["settings"] |= {k: getattr(row, k) for k in keys}
    save(results, order, total)
    todo = [] if args.report_only else run_order(order)
    for k, rid in enumerate(todo, 1):
        if only and rid not in only:
            continue
        if results[rid]["status"] == "done" and not (args.force or only):
            continue
        log.info("[%d/%d] %s ...", k, len(todo), rid)
        results[rid] = run_row(BY_ID_2[rid], csv_rows[rid], args.timeout)
        r = results[rid]
        shown = f"{100 * r['rel_error']:+.1f}%" if "rel_error" in r else r.get("why", "")
        log.info("[%d/%d] %s: %s %s (%s s)", k, len(todo), rid, r["status"], shown,
                 r.get("seconds"))  # fmt: skip
        save(results, order, total)
    save(results, order, total)
    print(json.dumps(summary(results, total), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
