"""The `memgnn` command line: argument parsing and error reporting.

Each sub-command's work lives in `memgnn.commands`; this module only turns arguments into
specs. User errors (ValueError, `predictor.errors.UserError`) exit with status 2 and one
line naming what was wrong; anything else is an internal error and keeps its traceback.
Progress of long steps (captures) goes to stderr through the `predictor.progress` logger.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from memgnn.args import (
    CLI_REPLAY_BUDGET_MS,
    add_cache_arg,
    add_limit_args,
    add_model_args,
    add_size_args,
    add_train_args,
)
from memgnn.predictor.ir.vocab import METRICS, SCENARIOS, SEARCH_MODES

log = logging.getLogger("memgnn")

DESCRIPTION = (
    "memgnn: predict the peak GPU memory of a PyTorch training step before running it "
    "(capture the step once with symbolic sizes, answer any batch size, sequence length or "
    "device), plan the largest config that fits a budget, and serve predictions."
)
DEVICE_HELP = "device profile (default: %(default)s; `memgnn devices` lists them)"
METRIC_HELP = (
    "allocated | reserved | device_total (default: reserved on a GPU profile, allocated on cpu)"
)


def build_parser() -> argparse.ArgumentParser:
    from memgnn import commands
    from memgnn.plan_cli import add_plan_space_args, plan_cmd

    parser = argparse.ArgumentParser(prog="memgnn", description=DESCRIPTION)
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("capture", help="capture a training step as a StepGraph file")
    add_model_args(p), add_size_args(p), add_train_args(p)
    p.add_argument("--concrete", action="store_true", help="fixed sizes instead of symbols")
    p.add_argument("--target", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("-o", "--output", required=True)
    p.set_defaults(func=commands.capture_cmd)

    p = sub.add_parser("graph-info", help="summarise a StepGraph file")
    p.add_argument("file")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=commands.graph_info_cmd)

    p = sub.add_parser("profile", help="measure or simulate one training step's peak memory")
    add_model_args(p), add_size_args(p), add_train_args(p)
    p.add_argument("--backend", choices=("sim", "cpu", "cuda"), default="sim")
    p.add_argument("--device", default=None, help="device profile (default: h100-80gb for sim)")
    p.add_argument("--snapshot", default=None, help="write a _dump_snapshot pickle of the step")
    add_limit_args(p, "a fits / does not fit verdict on the measured peak")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=commands.profile_cmd)

    p = sub.add_parser("predict", help="predict a training step's peak memory")
    add_model_args(p), add_size_args(p), add_train_args(p)
    p.add_argument("--device", default="h100-80gb", help=DEVICE_HELP)
    p.add_argument("--metric", choices=METRICS, default=None, help=METRIC_HELP)
    p.add_argument(
        "--scenario",
        choices=SCENARIOS,
        default="worst",
        help="data-dependent sizes at their min | balanced | worst (default: %(default)s)",
    )
    p.add_argument("--url", default=None, help="ask a running `memgnn serve` instead")
    p.add_argument("--token", default=None, help="bearer token for --url")
    p.add_argument("--plot", default=None, help="also draw the simulated step (OUT.png|svg)")
    p.add_argument(
        "--method", choices=("auto", "replay", "gnn", "analytic"), default="auto",
        help="replay: the simulator's exact bytes; auto: replay within --replay-budget-ms",
    )  # fmt: skip
    p.add_argument(
        "--replay-budget-ms", type=float, default=None,
        help=f"auto's per-request budget (default {CLI_REPLAY_BUDGET_MS:g}: one answer per "
        "process, so loading the compiled core from numba's cache fits and compiling it does "
        "not; with --url the server's own default)",
    )  # fmt: skip
    add_limit_args(p, "a fits / does not fit verdict on the upper bound")
    p.add_argument("--json", action="store_true")
    add_cache_arg(p)
    p.set_defaults(func=commands.predict_cmd)

    p = sub.add_parser("plan", help="the best config that fits a memory budget")
    add_model_args(p), add_size_args(p), add_train_args(p)
    add_limit_args(p, "one of the two is required")
    p.add_argument("--device", default="h100-80gb", help=DEVICE_HELP)
    p.add_argument("--metric", choices=METRICS, default=None, help=METRIC_HELP)
    add_plan_space_args(p)
    p.add_argument(
        "--mode",
        choices=SEARCH_MODES,
        default=None,
        help="power: powers of two only (the default); binsearch: bisect between them too "
        "(the same as --any-batch)",
    )
    p.add_argument("--any-batch", action="store_true", help="any batch size (--mode binsearch)")
    p.add_argument("--json", action="store_true")
    add_cache_arg(p)
    p.set_defaults(func=plan_cmd)

    from memgnn.dataset.build import add_build_arguments, build_cmd
    from memgnn.dataset.stats import add_stats_arguments, stats_cmd

    p = sub.add_parser("dataset", help="build and inspect the profiling corpus")
    dsub = p.add_subparsers(dest="dataset_command", required=True)
    q = dsub.add_parser("build", help="profile sampled configs into a corpus (resumable)")
    add_build_arguments(q)
    q.set_defaults(func=build_cmd)
    q = dsub.add_parser("stats", help="summarise a corpus")
    add_stats_arguments(q)
    q.set_defaults(func=stats_cmd)

    from memgnn.training.train import add_train_arguments, train_cmd

    p = sub.add_parser("train", help="train the GNN on a corpus, track in mlflow, export ONNX")
    add_train_arguments(p)
    p.set_defaults(func=train_cmd)

    from memgnn.serving.cli import add_serve_arguments, serve_cmd

    p = sub.add_parser("serve", help="the HTTP prediction service")
    add_serve_arguments(p)
    p.set_defaults(func=serve_cmd)

    p = sub.add_parser("validate-gpu", help="real GPU vs sim on a fixed config matrix")
    from memgnn.dataset.validate_gpu import add_arguments, validate_gpu_cmd

    add_arguments(p)
    p.set_defaults(func=validate_gpu_cmd)

    from memgnn.snapshot_cli import add_snapshot_parser

    add_snapshot_parser(sub)

    p = sub.add_parser("devices", help="list device profiles")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=commands.devices_cmd)

    p = sub.add_parser("models", help="the bundled catalog of real models (hf:ORG/NAME)")
    p.add_argument("names", nargs="*", help="only names containing these (case-insensitive)")
    p.add_argument("--check", action="store_true", help="exit 1 unless counts match")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=commands.models_cmd)

    p = sub.add_parser("demo", help="the end-to-end demo on an embedded default model")
    p.add_argument("--out", default=".demo", help="working folder")
    p.set_defaults(func=commands.demo_cmd)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("predictor.progress").setLevel(logging.INFO)  # shown without -v
    try:
        return int(args.func(args) or 0)
    except ValueError as exc:  # UserError and the ValueErrors naming bad input
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"memgnn {args.command}: error: {first}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("memgnn: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
