"""Sub-command handlers of the `memgnn` CLI (printing is fine here: this is the entry point)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from memgnn.args import memory_limit, model_args, parse_sizes, train_spec
from memgnn.display import fmt_bytes, loop_line, model_line, print_table
from memgnn.predictor.answer.backend import LocalBackend
from memgnn.predictor.answer.predict import predict
from memgnn.predictor.answer.types import ModelRef, PredictRequest, QueryConfig
from memgnn.predictor.capture.model_info import describe_bundle
from memgnn.predictor.spec.devices import get_profile
from memgnn.predictor.spec.train import TrainSpec
from memgnn.serving.client import remote_predict
from memgnn.snapshot_cli import plot_prediction


def resolve_bundle(args: argparse.Namespace):
    from memgnn.predictor.zoo import resolve

    return resolve(args.model, model_args(args), args.task)


def capture_cmd(args: argparse.Namespace) -> int:
    from memgnn.predictor.capture.capture import CaptureConfig, capture
    from memgnn.predictor.capture.query import Progress

    bundle = resolve_bundle(args)
    sizes = bundle.sizes(parse_sizes(args))
    cfg = CaptureConfig(symbolic=not args.concrete, sizes=sizes, target=args.target)
    t0 = time.perf_counter()
    with Progress(f"capturing {bundle.name} at {sizes}"):
        graph = capture(bundle, train_spec(args), cfg)
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    gid = graph.save(out)
    n_nodes = sum(p.num_nodes for p in graph.paths)
    print(
        f"captured {bundle.name} ({len(graph.paths)} path(s), {n_nodes} nodes) in "
        f"{time.perf_counter() - t0:.1f}s -> {out} (graph id {gid})"
    )
    return 0


def graph_info(graph) -> dict[str, Any]:
    """Counts, categories and per-category byte formulas of a StepGraph."""
    from memgnn.predictor.ir.expr import simplify_sum
    from memgnn.predictor.ir.vocab import CATEGORIES

    info: dict[str, Any] = {
        "graph_id": graph.graph_id,
        "model": graph.model,
        "train": graph.train,
        "symbols": graph.symbols,
        "data_symbols": graph.data_symbols,
        "guards": graph.guards,
        "paths": [],
    }
    for k, p in enumerate(graph.paths):
        per_cat: dict[str, list[str]] = {c: [] for c in CATEGORIES}
        for e, c in zip(p.storages["nbytes"], p.storages["category"]):
            per_cat[CATEGORIES[c]].append(graph.exprs[e])
        if not per_cat["comm"]:  # only a sharded step has collective buffers
            del per_cat["comm"]
        info["paths"].append(
            {
                "path": k,
                "conditions": p.conditions,
                "nodes": p.num_nodes,
                "edges": int(p.edges().shape[1]),
                "storages": p.num_storages,
                "storages_by_category": {c: len(v) for c, v in per_cat.items()},
                "bytes_by_category": {
                    c: simplify_sum(v, graph.all_symbols) for c, v in per_cat.items()
                },
            }
        )
    return info


def graph_info_cmd(args: argparse.Namespace) -> int:
    from memgnn.predictor.ir.graph import StepGraph

    info = graph_info(StepGraph.load(args.file))
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    print(f"graph {info['graph_id']}  model {info['model']['name']}  symbols {info['symbols']}")
    if info["data_symbols"]:
        for name, d in info["data_symbols"].items():
            print(f"  data symbol {name}: {d['lo']} .. {d['hi']} (balanced {d['balanced']})")
    for p in info["paths"]:
        cond = ", ".join(f"{c['module']}:{c['kind']}={c['value']}" for c in p["conditions"])
        print(
            f"path {p['path']}: {p['nodes']} nodes, {p['edges']} edges, "
            f"{p['storages']} storages  {cond}"
        )
        rows = [
            [c, str(p["storages_by_category"][c]), p["bytes_by_category"][c]]
            for c in p["storages_by_category"]
        ]
        print_table(["category", "storages", "bytes allocated over the step"], rows)
    return 0


def models_cmd(args: argparse.Namespace) -> int:
    """The catalog, parameter counts computed on the meta device, checked against the
    published figures; `--check` exits 1 on a mismatch."""
    from memgnn.predictor.zoo import hub

    wanted = [w.lower() for w in args.names]
    entries = [
        e for e in hub.catalog_entries() if not wanted or any(w in e.name.lower() for w in wanted)
    ]
    if not entries:
        raise ValueError(f"no catalog model matches {' '.join(args.names)!r}")
    rows = [hub.describe(e) for e in entries]
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        check = {True: "ok", False: "MISMATCH", None: "no exact published figure"}
        print_table(
            ["hf:NAME", "model_type", "class (default task)", "parameters", "published", "check"],
            [
                [
                    r["name"],
                    r["model_type"],
                    f"{r['class']} ({r['task']})",
                    f"{r['params']:,}",
                    "-" if r["published_params"] is None else f"{r['published_params']:,}",
                    check[r["params_match"]],
                ]
                for r in rows
            ],
        )
    return 1 if args.check and any(r["params_match"] is False for r in rows) else 0


def devices_cmd(args: argparse.Namespace) -> int:
    from memgnn.predictor.spec.devices import PROFILES

    if args.json:
        print(json.dumps({k: v.to_dict() for k, v in PROFILES.items()}, indent=2))
        return 0
    rows = [
        [
            p.name,
            fmt_bytes(p.total_bytes) if p.total_bytes else "-",
            str(p.sm or "-"),
            fmt_bytes(p.cublas_workspace_bytes),
            fmt_bytes(p.context_bytes),
        ]
        for p in PROFILES.values()
    ]
    print_table(["profile", "total", "sm", "cuBLAS workspace", "context"], rows)
    return 0


def profile_cmd(args: argparse.Namespace) -> int:
    from memgnn.dataset.profile import ProfileConfig, profile

    bundle = resolve_bundle(args)
    cfg = ProfileConfig(backend=args.backend, device=args.device, snapshot_path=args.snapshot)
    limit = memory_limit(args, cfg.device_profile())
    train = train_spec(args)
    if args.backend != "sim":  # a real step: refuse sizes the model cannot run first
        from memgnn.predictor.capture.query import graph_for_query

        device = cfg.device_profile()
        target = "cuda" if device.is_gpu else "cpu"
        graph_for_query(bundle, train, bundle.sizes(parse_sizes(args)), target=target,
                        sm=device.sm or 80)  # fmt: skip
    record = profile(bundle, train, parse_sizes(args), cfg)
    if args.snapshot and args.backend == "sim":
        from memgnn.snapshot_cli import tag_export

        tag_export(args.snapshot, args, record.sizes, record.device)
    target = "cuda" if args.backend != "cpu" else "cpu"
    info = describe_bundle(bundle, train, target).to_dict()
    info |= {"kind": bundle.origin} if bundle.origin else {}
    verdict = None
    if limit is not None:  # the allocator's reserved peak where the backend has one
        reserved = record.peak_reserved_bytes is not None
        peak = record.peak_reserved_bytes if reserved else record.peak_allocated_bytes
        verdict = limit.verdict(peak) | {"metric": "reserved" if reserved else "allocated"}
    if args.json:
        out = record.contract() | {"model": info}
        if verdict is not None:
            out["verdict"] = verdict
        print(json.dumps(out, indent=2, default=str))
        return 0
    print(f"{record.model} {record.sizes} on {record.device} ({record.backend} backend)")
    print(model_line(info))
    print_table(
        ["metric", "bytes", ""],
        [
            [
                "peak allocated",
                str(record.peak_allocated_bytes),
                fmt_bytes(record.peak_allocated_bytes),
            ],
            [
                "peak reserved",
                str(record.peak_reserved_bytes),
                fmt_bytes(record.peak_reserved_bytes),
            ],
            ["device total", str(record.device_total_bytes), fmt_bytes(record.device_total_bytes)],
        ],
    )
    cats = record.breakdown.get("categories", {})
    if cats:
        print("at the peak, by category (tensor bytes):")
        print_table(["category", "bytes", ""], [[c, str(v), fmt_bytes(v)] for c, v in cats.items()])
    if verdict is not None:
        print(verdict_line(verdict, f"peak {verdict['metric']}"))
    return 0


def verdict_line(verdict: dict[str, Any], what: str) -> str:
    """`fits: ...` / `does NOT fit: ...` for a `MemoryLimit.verdict`."""
    if verdict["source"] == "threshold":
        of = f"{verdict['threshold'] * 100:g}% of the device's {fmt_bytes(verdict['budget_bytes'])}"
    elif verdict["threshold"] < 1:
        of = f"{verdict['threshold'] * 100:g}% of the budget {fmt_bytes(verdict['budget_bytes'])}"
    else:
        of = "the budget"
    room = verdict["headroom_bytes"]
    head = "fits" if verdict["fits"] else "does NOT fit"
    side = f"{fmt_bytes(room)} to spare" if room >= 0 else f"{fmt_bytes(-room)} over"
    return f"{head}: {what} vs limit {fmt_bytes(verdict['limit_bytes'])} ({of}), {side}"


def demo_cmd(args: argparse.Namespace) -> int:
    from memgnn.demo import run_demo

    return run_demo(Path(args.out))


def predict_request(args: argparse.Namespace, device) -> PredictRequest:
    """The answer layer's request for `memgnn predict`'s arguments (the limit checked
    first: a bad --budget fails before a capture)."""
    limit = memory_limit(args, device)
    limit_fields: dict[str, Any] = {}
    if limit is not None and limit.source == "threshold":
        limit_fields["threshold"] = limit.threshold
    elif limit is not None:
        limit_fields["budget"] = limit.budget_bytes
    return PredictRequest(
        model=ModelRef(spec=args.model, args=model_args(args), task=args.task),
        train=train_spec(args),
        configs=[
            QueryConfig(
                sizes=parse_sizes(args), device=device.name, metric=args.metric,
                scenario=args.scenario,
            )
        ],
        method=args.method,
        replay_budget_ms=args.replay_budget_ms,
        **limit_fields,
    )  # fmt: skip


def predict_cmd(args: argparse.Namespace) -> int:
    if args.url and args.plot:
        raise ValueError("--plot draws a local simulation; it cannot be used with --url")
    device = get_profile(args.device)
    req = predict_request(args, device)
    device.check_precision(req.train.numerics.precision)
    if args.url:
        out = remote_predict(args.url, req, token=args.token)
    else:
        backend = LocalBackend(use_cache=not args.no_cache, capture_mode=args.capture)
        out = predict(req, backend).predictions[0].to_dict()
    for w in out["warnings"]:
        print(f"memgnn predict: warning: {w}", file=sys.stderr)
    if args.plot:
        graph = backend.entry(out["graph_id"]).graph
        title = (
            f"{args.model} {out['sizes']} on "
            f"{device.name}: predicted {out['metric']} peak "
            f"{fmt_bytes(out['predicted_peak_bytes'])} ({out['method']}, {out['model_version']})"
        )
        plot_prediction(args.plot, graph, out["sizes"], device, out, scenario=args.scenario,
                        title=title)  # fmt: skip
    if args.json:
        print(json.dumps(out, indent=2, default=str))
        return 0
    for line in predict_lines(out):
        print(line)
    return 0


def predict_lines(out: dict[str, Any]) -> list[str]:
    """The text answer of `memgnn predict` from its JSON document."""
    par = out["breakdown"].get("parallel")
    name = out["model"]["spec"] if out["model"] else out["graph_id"]
    lines = [
        f"{name} {out['sizes']} on {out['device']}: {out['metric']} peak "
        f"{fmt_bytes(out['predicted_peak_bytes'])} (bound {fmt_bytes(out['upper_bound_bytes'])}),"
        f" model {out['model_version']} ({out['method']})"
        + (f", per rank (rank 0 of {par['world_size']}, {par['sharding']})" if par else "")
    ]
    if out["model"]:
        lines.append(model_line(out["model"]))
    if out["train"]:
        lines.append(loop_line(TrainSpec.from_dict(out["train"])))
    if route := out["breakdown"].get("route"):
        lines.append(f"path: {route['method']} ({route['reason']})")
    if out["verdict"] is not None:
        lines.append(verdict_line(out["verdict"], f"upper bound {out['metric']}"))
    return lines
