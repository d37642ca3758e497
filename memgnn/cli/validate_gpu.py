"""`memgnn validate-gpu`: the simulator against a real GPU on a fixed config matrix
(`memgnn.dataset.validate_gpu`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from memgnn.dataset.validate_gpu import SUMMARY_MD, _pct, run_validation


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `memgnn validate-gpu`."""
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    parser.add_argument("--limit", type=int, default=None, help="run only the first N configs")
    parser.add_argument("--device", default=None, help="device profile (default: detected)")
    parser.set_defaults(func=validate_gpu_cmd)


def validate_gpu_cmd(args: argparse.Namespace) -> int:
    """Run the validation; 2 without a GPU or on a bad option."""
    if not torch.cuda.is_available():
        print("validate-gpu: no CUDA device: this validation needs a GPU", file=sys.stderr)
        return 2
    if args.limit is not None and args.limit < 1:
        print("validate-gpu: --limit must be >= 1", file=sys.stderr)
        return 2
    summary = run_validation(args.out, limit=args.limit, device_name=args.device, progress=True)
    for metric, m in summary["metrics"].items():
        print(
            f"{metric:>12}: n={m['n']} median {_pct(m['median_abs'])} "
            f"p90 {_pct(m['p90_abs'])} max {_pct(m['max_abs'])}"
        )
    print(f"summary: {args.out / SUMMARY_MD}")
    return 0
