"""The fast tier's list: scripts/slow_tests.py reads pytest's durations, conftest marks."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("slow_tests", ROOT / "scripts" / "slow_tests.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_durations_add_the_phases_of_each_test_and_list_the_slow_ones():
    report = """
============================= slowest durations ==============================
3.50s call     tests/a.py::test_slow[x-1]
0.60s setup    tests/a.py::test_slow[x-1]
1.20s call     tests/b.py::test_quick
0.90s setup    tests/b.py::test_quick
(12 durations < 0.005s hidden.  Use -vv to show these durations.)
"""
    script = _script()
    total = script.durations(report)
    want = {"tests/a.py::test_slow[x-1]": 4.1, "tests/b.py::test_quick": 2.1}
    assert total == pytest.approx(want)
    text = script.render(total, 3.0, "d.log")
    listed = [line for line in text.splitlines() if not line.startswith("#")]
    assert listed == ["tests/a.py::test_slow[x-1]  # 4.1s"]


def test_the_listed_tests_are_marked_slow(request):
    """Every node id in tests/slow_tests.txt that this session collected carries `slow`."""
    from conftest import _measured_slow

    listed = _measured_slow()
    assert listed, "tests/slow_tests.txt lists no test"
    assert all("  #" not in n for n in listed)  # the seconds comments are stripped
    items = {i.nodeid: i for i in request.session.items}
    seen = [items[n] for n in listed if n in items]
    assert all(i.get_closest_marker("slow") for i in seen)
