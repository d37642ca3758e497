"""`memgnn graph-info`: counts, categories and byte formulas of a StepGraph file."""

from __future__ import annotations

import argparse
import json
from typing import Any

from memgnn.cli.render import print_table
from memgnn.predictor.ir.expr import simplify_sum
from memgnn.predictor.ir.graph import StepGraph
from memgnn.predictor.ir.vocab import CATEGORIES

__all__ = ["add_arguments", "graph_info", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def graph_info(graph: StepGraph) -> dict[str, Any]:
    """Counts, categories and per-category byte formulas of a StepGraph."""
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


def run(args: argparse.Namespace) -> int:
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
