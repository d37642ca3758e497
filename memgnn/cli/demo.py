"""`memgnn demo`: the end-to-end job on an embedded default model (`memgnn.demo`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from memgnn.demo import run_demo

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default=".demo", help="working folder")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    return run_demo(Path(args.out))
