"""`memgnn devices`: the device profiles (memory total, compute capability, the cuBLAS
workspace and CUDA context each adds around the tensors)."""

from __future__ import annotations

import argparse
import json

from memgnn.cli.render import fmt_bytes, print_table
from memgnn.predictor.spec.devices import PROFILES

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
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
