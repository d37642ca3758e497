"""Sub-command handlers of the `memgnn` CLI (printing is fine here: this is the entry point)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from memgnn.cli import model_args, parse_sizes, train_spec
from memgnn.display import fmt_bytes, print_table


def resolve_bundle(args: argparse.Namespace):
    from dataset.zoo import resolve

    return resolve(args.model, model_args(args), args.task)


def capture_cmd(args: argparse.Namespace) -> int:
    from predictor.capture import CaptureConfig, capture

    bundle = resolve_bundle(args)
    sizes = bundle.sizes(parse_sizes(args))
    cfg = CaptureConfig(symbolic=not args.concrete, sizes=sizes, target=args.target)
    t0 = time.perf_counter()
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
    from predictor.expr import simplify_sum
    from predictor.recorder import CATEGORIES

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
    from predictor.graph import StepGraph

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


def devices_cmd(args: argparse.Namespace) -> int:
    from dataset.devices import PROFILES

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
    from dataset.profile import ProfileConfig, profile

    bundle = resolve_bundle(args)
    cfg = ProfileConfig(backend=args.backend, device=args.device)
    record = profile(bundle, train_spec(args), parse_sizes(args), cfg)
    if args.json:
        print(json.dumps(record.contract(), indent=2, default=str))
        return 0
    print(f"{record.model} {record.sizes} on {record.device} ({record.backend} backend)")
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
    return 0


def demo_cmd(args: argparse.Namespace) -> int:
    from memgnn.demo import run_demo

    return run_demo(Path(args.out))
