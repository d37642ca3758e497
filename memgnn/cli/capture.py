"""`memgnn capture`: one training step captured as a StepGraph file."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from memgnn.cli.options import (
    add_model_args,
    add_size_args,
    add_train_args,
    parse_sizes,
    resolve_bundle,
    train_spec,
)
from memgnn.predictor.capture.capture import CaptureConfig, capture
from memgnn.predictor.capture.progress import Progress

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    add_size_args(p)
    add_train_args(p)
    p.add_argument("--concrete", action="store_true", help="fixed sizes instead of symbols")
    p.add_argument("--target", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("-o", "--output", required=True)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
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
