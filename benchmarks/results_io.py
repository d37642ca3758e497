"""Where the benchmarks write: `benchmarks/results/NAME.json` (the numbers) beside
`NAME.md` (the table the README cites), both rewritten whole on every run."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["RESULTS", "write_results"]

RESULTS = Path(__file__).resolve().parent / "results"


def write_results(
    name: str,
    result: Any,
    markdown: str,
    *,
    out: Path = RESULTS,
    indent: int = 2,
    default: Callable[[Any], Any] | None = None,
) -> Path:
    """`out/NAME.json` and `out/NAME.md`; returns the markdown's path."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(result, indent=indent, default=default) + "\n")
    md = out / f"{name}.md"
    md.write_text(markdown)
    return md
