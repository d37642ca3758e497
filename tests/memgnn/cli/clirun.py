"""One way for the CLI tests to run `memgnn` in-process and read what it printed."""

from __future__ import annotations

import pytest

from memgnn.cli import main

__all__ = ["run_cli"]


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """`memgnn *argv` through `main`: (exit code, stdout, stderr)."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err
