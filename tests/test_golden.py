"""The golden answers (`tests/golden/golden.py`): every number a fixed set of commands
states is the same as when the file was recorded."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "golden"))
import golden  # noqa: E402

STORED = json.loads(golden.ANSWERS.read_text())


def test_every_command_has_a_recorded_answer():
    assert sorted(STORED) == sorted(golden.COMMANDS)


@pytest.mark.parametrize("name", sorted(golden.COMMANDS))
def test_answer_is_unchanged(name):
    assert golden.missing(STORED[name], golden.run(name)) == []
