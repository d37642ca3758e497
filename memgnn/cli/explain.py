"""`memgnn explain`: what is live at the simulated peak of a training step, and what each
change would save, answered by the answer layer (`predictor.answer.explain`) in this
process or by a running service (`--url`): the same JSON document either way. Takes the
flags `memgnn predict` takes (the same run, replayed)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from memgnn.cli.options import (
    add_cache_args,
    add_query_args,
    device_name,
    explicit_train_options,
    model_ref,
    option_flags,
    parse_sizes,
    run_config,
    train_spec,
)
from memgnn.cli.render import fmt_bytes, loop_line, model_line
from memgnn.predictor.answer.backend import LocalBackend
from memgnn.predictor.answer.explain import ExplainRequest, explain
from memgnn.predictor.answer.explain_html import render_html
from memgnn.predictor.answer.types import QueryConfig
from memgnn.predictor.answer.whatif import WHATIFS
from memgnn.predictor.errors import UserError
from memgnn.predictor.spec.devices import get_profile
from memgnn.predictor.spec.train import TrainSpec

__all__ = [
    "add_arguments", "explain_lines", "explain_request", "run", "whatif_command", "write_html",
]  # fmt: skip


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_query_args(p)
    p.add_argument("--top", type=int, default=15, help="rows per table (default: %(default)s)")
    p.add_argument(
        "--whatif", action="append", choices=WHATIFS, default=None, dest="whatifs",
        help="answer only these what-ifs (repeatable; default: all)",
    )  # fmt: skip
    p.add_argument("--no-whatifs", action="store_true", help="explain the peak only")
    p.add_argument("--url", default=None, help="ask a running `memgnn serve` instead")
    p.add_argument("--token", default=None, help="bearer token for --url")
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--html", default=None, metavar="OUT.html",
        help="also write the answer as one self-contained HTML page (timeline, tables, what-ifs)",
    )  # fmt: skip
    add_cache_args(p)
    p.set_defaults(func=run)


def explain_request(args: argparse.Namespace, device_name_: str) -> ExplainRequest:
    """The answer layer's request for `memgnn explain`'s arguments."""
    whatifs = () if args.no_whatifs else (tuple(args.whatifs) if args.whatifs else None)
    return ExplainRequest(
        model=model_ref(args),
        train=train_spec(args),
        run_config=run_config(args),
        explicit=frozenset(explicit_train_options(args)),
        config=QueryConfig(
            sizes=parse_sizes(args), device=device_name_, metric=args.metric, scenario=args.scenario
        ),  # fmt: skip
        top=args.top,
        whatifs=whatifs,
    )


def run(args: argparse.Namespace) -> int:
    device = get_profile(device_name(args))
    req = explain_request(args, device.name)
    device.check_precision(req.train.numerics.precision)
    if args.url:
        from memgnn.serving.client import remote_explain

        out = remote_explain(args.url, req, token=args.token)
    else:
        backend = LocalBackend(use_cache=not args.no_cache, capture_mode=args.capture)
        out = explain(req, backend).to_dict()
    if args.html:
        write_html(out, args.html)
    if args.json:
        print(json.dumps(out, indent=2, default=str))
        return 0
    for line in explain_lines(out):
        print(line)
    return 0


def write_html(out: dict[str, Any], path: str) -> Path:
    """The page of `predictor.answer.explain_html` for the document, each what-if with the
    flags `whatif_command` gives it."""
    doc = dict(out)
    doc["whatifs"] = [w | {"command": whatif_command(w, out["prediction"])} for w in out["whatifs"]]
    dest = Path(path)
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(render_html(doc), encoding="utf-8")
    except OSError as e:
        raise UserError(f"cannot write {path}: {e}") from None
    print(f"wrote {dest}", file=sys.stderr)
    return dest


def whatif_command(w: dict[str, Any], base: dict[str, Any]) -> str:
    """The flags that change the explained run into the what-if (`memgnn predict` gives
    its bytes with them, `--method replay`), or the allocator setting to export."""
    if w.get("alloc_conf"):
        return f"PYTORCH_CUDA_ALLOC_CONF={w['alloc_conf']}"
    train = TrainSpec.from_dict(base["train"]).flat() if base.get("train") else {}
    flags = option_flags(train | w["options"])
    for sym, value in (w.get("sizes") or {}).items():
        if base["sizes"].get(sym) != value:
            flags += ["--batch", str(value)] if sym == "B" else (
                ["--seq", str(value)] if sym == "S" else ["--dim", f"{sym}={value}"]
            )  # fmt: skip
    return " ".join(flags)


def _table(title: str, rows: list[dict[str, Any]], total: int) -> list[str]:
    out = [title]
    width = max((len(r["name"]) for r in rows), default=0)
    for r in rows:
        share = f"{100 * r['bytes'] / total:5.1f}%" if total else ""
        out.append(f"  {r['name']:<{width}}  {fmt_bytes(r['bytes']):>11} {share}  "
                   f"({r['blocks']} block{'s' * (r['blocks'] != 1)})")  # fmt: skip
    return out


def explain_lines(out: dict[str, Any]) -> list[str]:
    """The text answer of `memgnn explain` from its JSON document."""
    pred, peak = out["prediction"], out["peak"]
    name = pred["model"]["spec"] if pred["model"] else pred["graph_id"]
    lines = [
        f"{name} {pred['sizes']} on {pred['device']}: {pred['metric']} peak "
        f"{fmt_bytes(pred['predicted_peak_bytes'])} ({pred['method']})"
    ]
    if pred["model"]:
        lines.append(model_line(pred["model"]))
    if pred["train"]:
        lines.append(loop_line(TrainSpec.from_dict(pred["train"])))
    where = f" in {peak['module']}" if peak["module"] else ""
    src = f" ({peak['source']})" if peak["source"] else ""
    reserved = peak["reserved_bytes"]
    lines += [
        f"peak: {peak['phase']} of the {peak['step']} step, at {peak['op']}{where}{src}",
        f"  then: allocated {fmt_bytes(peak['allocated_bytes'])} = tensors "
        f"{fmt_bytes(peak['requested_bytes'])} + block rounding "
        f"{fmt_bytes(peak['rounding_bytes'])}"
        + (
            f"; reserved {fmt_bytes(reserved)} (cached free {fmt_bytes(peak['cached_free_bytes'])})"
            if reserved is not None
            else ""
        ),  # fmt: skip
    ]
    total = peak["requested_bytes"]
    lines += _table("by category:", out["by_category"], total)
    lines += _table("by module:", out["by_module"], total)
    if out["by_layer_module"] != out["by_module"]:
        lines += _table("by module across layers:", out["by_layer_module"], total)
    lines += _table("by source line:", out["by_source"], total)
    lines += _table("by op:", out["by_op"], total)
    lines.append("largest tensors:")
    for b in out["largest"]:
        shape = "x".join(map(str, b["shape"])) if b["shape"] else ("scalar" if b["shape"] == []
                                                                   else "?")  # fmt: skip
        where = " ".join(x for x in (b["module"], b["source"] and f"({b['source']})") if x)
        lines.append(f"  {fmt_bytes(b['bytes']):>11}  {shape} {b['dtype']}  {b['category']}"
                     + (f"  {where}" if where else ""))  # fmt: skip
        lines.append(f"      {b['why']}")
    if out["whatifs"]:
        lines.append("what-ifs (each replayed; by bytes saved):")
    for w in out["whatifs"]:
        cost = f", step cost x{w['cost']:g}" if w["cost"] is not None else ""
        lines.append(
            f"  {w['label']}: {fmt_bytes(w['predicted_peak_bytes'])}, saves "
            f"{fmt_bytes(w['saved_bytes'])} ({100 * w['saved_fraction']:.1f}%){cost}"
        )
        lines.append(f"      {whatif_command(w, pred)}")
    for s in out["not_applicable"]:
        lines.append(f"  not applicable: {s['name']}: {s['why']}")
    return lines
