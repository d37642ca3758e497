"""The text table of `snapshot diff`."""

import copy

from memgnn.predictor.sim.allocator import MiB
from memgnn.predictor.snapshot.diff import diff_snapshots
from memgnn.predictor.snapshot.diff_text import diff_text

from tests.predictor.snapshot.test_diff import PLAN, USER, _step


def test_identical_sides_say_so_with_the_peaks():
    snap = _step(PLAN)
    text = diff_text(diff_snapshots(snap, snap))
    assert "no difference: the same sizes in every phase" in text
    assert f"peak allocated (allocator bytes): real {13 * MiB} (13.00 MiB)" in text
    assert "phases: real markers; predicted markers" in text


def test_differences_list_phases_sizes_lines_and_the_peak_composition():
    real_plan = copy.deepcopy(PLAN)
    real_plan[1][1].append(("mask", 3 * MiB, [USER]))
    text = diff_text(diff_snapshots(_step(real_plan), _step(PLAN)))
    lines = text.splitlines()
    forward = next(x for x in lines if x.startswith("forward "))
    assert forward.split()[1:3] == ["3", str(8 * MiB)]  # real: 3 allocs, 8 MiB requested
    assert "only the real run: 0 sizes" in text  # 3 MiB is a size the prediction has too
    row = next(x for x in lines if x.strip().startswith(str(3 * MiB)))
    assert row.split()[:3] == [str(3 * MiB), "2", "1"]
    assert "real: home/me/train.py:42 (forward) (x1)" in row
    assert "by size class:" in text and "by category:" in text
