"""Write tests/slow_tests.txt, the measured slow tests the fast tier leaves out.

Usage::

    .venv/bin/python -m pytest -q --durations=0 > durations.log
    .venv/bin/python scripts/slow_tests.py durations.log [--threshold 2.0]

Reads pytest's `--durations=0` report (one `SECONDS PHASE NODEID` line per setup, call and
teardown), adds the phases of each test, and lists every test whose total reaches the
threshold, slowest first, with its seconds as a comment. tests/conftest.py marks the listed
node ids `slow`, so `pytest -m "not slow"` (`scripts/test.sh --fast`) skips them; the full
suite (`scripts/test.sh`) still runs everything.
"""

from __future__ import annotations

import argparse
import re
from collections import defaultdict
from pathlib import Path

LINE = re.compile(r"^\s*(?P<sec>\d+(?:\.\d+)?)s\s+(?P<phase>setup|call|teardown)\s+(?P<node>\S.*)$")
OUT = Path(__file__).resolve().parents[1] / "tests" / "slow_tests.txt"


def durations(report: str) -> dict[str, float]:
    """Seconds per node id, setup + call + teardown, from a `--durations=0` report."""
    total: dict[str, float] = defaultdict(float)
    for line in report.splitlines():
        m = LINE.match(line)
        if m:
            total[m["node"].strip()] += float(m["sec"])
    return dict(total)


def render(total: dict[str, float], threshold: float, source: str) -> str:
    slow = sorted(((s, n) for n, s in total.items() if s >= threshold), reverse=True)
    head = [
        "# Tests a full run measured at or above the threshold (setup + call + teardown);",
        "# tests/conftest.py marks them slow. Regenerate with:",
        "#   .venv/bin/python -m pytest -q --durations=0 > durations.log",
        f"#   .venv/bin/python scripts/slow_tests.py durations.log --threshold {threshold:g}",
        f"# from {source}: {len(total)} tests timed, {len(slow)} listed, "
        f"{sum(s for s, _ in slow):.0f} s of {sum(total.values()):.0f} s.",
    ]
    return "\n".join(head + [f"{n}  # {s:.1f}s" for s, n in slow]) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("report", type=Path, help="the output of pytest --durations=0")
    ap.add_argument("--threshold", type=float, default=2.0, help="seconds (default 2)")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    total = durations(args.report.read_text())
    if not total:
        raise SystemExit(f"{args.report}: no `--durations=0` lines found")
    args.out.write_text(render(total, args.threshold, args.report.name))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
