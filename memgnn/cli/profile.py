"""`memgnn profile`: one training step's peak memory measured (a real CPU or GPU step) or
simulated (the allocator simulator on the captured step): the ground-truth record."""

from __future__ import annotations

import argparse
import json

from memgnn.cli.options import (
    add_device_args,
    add_limit_args,
    add_model_args,
    add_size_args,
    add_train_args,
    device_name,
    memory_limit,
    parse_sizes,
    resolve_bundle,
    train_spec,
)
from memgnn.cli.render import fmt_bytes, model_line, print_table, verdict_line
from memgnn.cli.snapshot import tag_export
from memgnn.dataset.profile import ProfileConfig, profile
from memgnn.predictor.capture.model_info import describe_bundle
from memgnn.predictor.capture.query import graph_for_query

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    add_size_args(p)
    add_train_args(p)
    p.add_argument("--backend", choices=("sim", "cpu", "cuda"), default="sim")
    add_device_args(p, None, "device profile (default: h100-80gb for sim)")
    p.add_argument("--snapshot", default=None, help="write a _dump_snapshot pickle of the step")
    add_limit_args(p, "a fits / does not fit verdict on the measured peak")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    bundle = resolve_bundle(args)
    cfg = ProfileConfig(backend=args.backend, device=device_name(args), snapshot_path=args.snapshot)
    limit = memory_limit(args, cfg.device_profile())
    train = train_spec(args)
    if args.backend != "sim":  # a real step: refuse sizes the model cannot run first
        device = cfg.device_profile()
        target = "cuda" if device.is_gpu else "cpu"
        graph_for_query(bundle, train, bundle.sizes(parse_sizes(args)), target=target,
                        sm=device.sm or 80)  # fmt: skip
    record = profile(bundle, train, parse_sizes(args), cfg)
    if args.snapshot and args.backend == "sim":
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
            ["peak allocated", str(record.peak_allocated_bytes),
             fmt_bytes(record.peak_allocated_bytes)],
            ["peak reserved", str(record.peak_reserved_bytes),
             fmt_bytes(record.peak_reserved_bytes)],
            ["device total", str(record.device_total_bytes), fmt_bytes(record.device_total_bytes)],
        ],
    )  # fmt: skip
    cats = record.breakdown.get("categories", {})
    if cats:
        print("at the peak, by category (tensor bytes):")
        print_table(["category", "bytes", ""], [[c, str(v), fmt_bytes(v)] for c, v in cats.items()])
    if verdict is not None:
        print(verdict_line(verdict, f"peak {verdict['metric']}"))
    return 0
