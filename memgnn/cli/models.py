"""`memgnn models`: the bundled catalog, parameter counts computed on the meta device and
checked against the published figures (`--check` exits 1 on a mismatch)."""

from __future__ import annotations

import argparse
import json

from memgnn.cli.render import print_table
from memgnn.predictor.zoo import hub

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("names", nargs="*", help="only names containing these (case-insensitive)")
    p.add_argument("--check", action="store_true", help="exit 1 unless counts match")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
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
