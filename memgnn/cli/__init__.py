"""The `memgnn` command line: one module per sub-command, parsed and dispatched here.

Each `memgnn.cli.<command>` module has `add_arguments(parser)` (its flags, and
`set_defaults(func=run)`) and `run(args) -> int`. Only the module of the sub-command being
run is imported (`COMMANDS` names them): a one-shot `memgnn predict` does not load the
service, the trainer or the corpus builder. User errors (ValueError,
`predictor.errors.UserError`) exit with status 2 and one line naming what was wrong;
anything else is an internal error and keeps its traceback. Progress of long steps
(captures) goes to stderr through the `predictor.progress` logger.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import re
import sys
from collections.abc import Sequence

from memgnn.predictor.quiet import filter_noise

__all__ = ["COMMANDS", "build_parser", "main"]

log = logging.getLogger("memgnn")

DESCRIPTION = (
    "memgnn: predict the peak GPU memory of a PyTorch training step before running it "
    "(capture the step once with symbolic sizes, answer any batch size, sequence length or "
    "device), plan the largest config that fits a budget, and serve predictions."
)
# sub-command -> (its module, one line of help), in the order `memgnn --help` lists them
COMMANDS: dict[str, tuple[str, str]] = {
    "predict": ("memgnn.cli.predict", "predict a training step's peak memory"),
    "plan": ("memgnn.cli.plan", "the best config that fits a memory budget"),
    "explain": (
        "memgnn.cli.explain",
        "what is live at the simulated peak, and what each change would save",
    ),
    "profile": ("memgnn.cli.profile", "measure or simulate one training step's peak memory"),
    "capture": ("memgnn.cli.capture", "capture a training step as a StepGraph file"),
    "graph-info": ("memgnn.cli.graph_info", "summarise a StepGraph file"),
    "models": ("memgnn.cli.models", "the bundled catalog of real models (hf:ORG/NAME)"),
    "devices": ("memgnn.cli.devices", "list device profiles"),
    "snapshot": (
        "memgnn.cli.snapshot",
        "replay / plot / diff torch.cuda.memory._dump_snapshot files",
    ),
    "dataset": ("memgnn.cli.dataset", "build and inspect the profiling corpus"),
    "train": ("memgnn.cli.train", "train the GNN on a corpus, track in mlflow, export ONNX"),
    "ship": ("memgnn.cli.ship", "build the corpus, train and install the shipped GNN"),
    "serve": ("memgnn.cli.serve", "the HTTP prediction service"),
    "validate-gpu": ("memgnn.cli.validate_gpu", "real GPU vs sim on a fixed config matrix"),
    "demo": ("memgnn.cli.demo", "the end-to-end demo on an embedded default model"),
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser; with `only`, the other sub-commands are listed but not loaded."""
    parser = argparse.ArgumentParser(prog="memgnn", description=DESCRIPTION)
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (module, help) in COMMANDS.items():
        p = sub.add_parser(name, help=help, description=help)
        if only is None or name == only:
            # deferred: a sub-command's module imports what it runs (torch, the service,
            # the trainer); only the one being run is loaded
            importlib.import_module(module).add_arguments(p)
    return parser


def _negative_values(argv: list[str]) -> list[str]:
    """`--budget -5GiB` as `--budget=-5GiB`: argparse takes a value starting with `-` and
    a digit for an option of its own and prints the whole usage; joined, the option's own
    check names what is wrong with the value."""
    out: list[str] = []
    for tok in argv:
        prev = out[-1] if out else ""
        if re.match(r"-\d", tok) and prev.startswith("--") and "=" not in prev:
            out[-1] = f"{prev}={tok}"
        else:
            out.append(tok)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    argv = _negative_values(list(sys.argv[1:] if argv is None else argv))
    command = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(command if command in COMMANDS else None)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("predictor.progress").setLevel(logging.INFO)  # shown without -v
    if not args.verbose:
        filter_noise()
    try:
        return int(args.func(args) or 0)
    except ValueError as exc:  # UserError and the ValueErrors naming bad input
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"memgnn {args.command}: error: {first}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("memgnn: interrupted", file=sys.stderr)
        return 130
