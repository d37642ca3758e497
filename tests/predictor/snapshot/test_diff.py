"""`snapshot diff`: a recording beside a prediction, by phase and by size."""

import copy

import pytest
from memgnn.predictor.capture.cache import capture_cached
from memgnn.predictor.sim.allocator import MiB
from memgnn.predictor.snapshot.diff import DiffConfig, allocations, diff_snapshots, where
from memgnn.predictor.snapshot.export import SnapshotRecorder, simulated_step_snapshot
from memgnn.predictor.snapshot.loader import snapshot_from_dict
from memgnn.predictor.spec.devices import get_profile
from memgnn.predictor.spec.train import TrainSpec

USER = {"filename": "/home/me/train.py", "line": 42, "name": "forward"}
TORCH = {"filename": "/venv/lib/python3.11/site-packages/torch/nn/functional.py", "line": 9,
         "name": "linear"}  # fmt: skip


def _step(recorder_plan, steps=("first",)):
    """Run ``recorder_plan``: (phase, [(key, size, frames)], [keys to free]) per phase."""
    rec = SnapshotRecorder()
    handles = {}
    for step in steps:
        for phase, allocs, frees in recorder_plan:
            for key, size, frames in allocs:
                cat = "parameter" if phase == "setup" else "activation"
                if phase == "setup" and step != steps[0]:
                    continue
                handles[(step, key)] = rec.malloc(size, frames=frames, category=cat,
                                                  phase=(phase, step))  # fmt: skip
            for key in frees:
                rec.free(handles.pop((step, key)))
    return snapshot_from_dict(rec.snapshot(), what=f"step {steps}")


PLAN = [
    ("setup", [("w", 4 * MiB, None)], []),
    ("forward", [("a", 2 * MiB, [TORCH, USER]), ("b", 3 * MiB, None)], []),
    ("backward", [("g", 4 * MiB, None)], ["a", "b"]),
    ("optimizer", [("m", 4 * MiB, None)], ["g", "m"]),
]


def test_an_export_against_itself_reports_no_difference(tiny_gpt):
    device = get_profile("a100-80gb")
    sizes = tiny_gpt.sizes({"B": 2, "S": 16})
    graph = capture_cached(tiny_gpt, TrainSpec(), target="cuda", sm=device.sm, sizes=sizes)
    snap = snapshot_from_dict(simulated_step_snapshot(graph, sizes, device))
    doc = diff_snapshots(snap, snap)
    assert doc["identical"] and doc["differing_sizes"] == 0
    assert doc["phases_from"] == {"real": {"method": "markers"}, "predicted": {"method": "markers"}}
    assert [p["phase"] for p in doc["phases"]][:3] == ["setup", "input", "forward"]
    assert all(p["real"] == p["predicted"] for p in doc["phases"])
    assert doc["peak"]["real"] == doc["peak"]["predicted"]
    assert doc["peak"]["real"]["by_category"]["parameter"] > 0


def test_sizes_only_one_side_requests_per_phase_with_bytes_and_lines():
    predicted = _step(PLAN)
    real_plan = copy.deepcopy(PLAN)
    real_plan[1][1].append(("mask", MiB + 512, [USER]))  # forward: a size only the real run has
    real_plan[2] = ("backward", [("g", 4 * MiB, None), ("g2", 4 * MiB, None)], ["a", "b", "g2"])
    real_plan[3] = ("optimizer", [], ["g"])  # no optimizer state: a size count differs
    real = _step(real_plan)
    doc = diff_snapshots(real, predicted)
    assert not doc["identical"]
    phases = {p["phase"]: p for p in doc["phases"]}
    fwd = phases["forward"]
    assert fwd["only_real"] == [
        {"size": MiB + 512, "real": 1, "predicted": 0, "bytes": MiB + 512,
         "real_lines": [("home/me/train.py:42 (forward)", 1)]}
    ]  # fmt: skip
    assert fwd["only_real_bytes"] == MiB + 512 and fwd["only_predicted"] == []
    assert phases["backward"]["count_differs"][0] | {} == {
        "size": 4 * MiB, "real": 2, "predicted": 1, "bytes": 4 * MiB}  # fmt: skip
    assert phases["optimizer"]["only_predicted"][0]["bytes"] == -4 * MiB
    # over the whole step the extra backward 4 MiB and the missing optimizer 4 MiB cancel
    whole = doc["sizes"]
    assert whole["count_differs"] == [] and whole["only_real_bytes"] == MiB + 512
    # the line behind the real-only size: the innermost frame outside torch
    assert where([TORCH, USER]) == "home/me/train.py:42 (forward)"
    assert where([TORCH]) == "torch/nn/functional.py:9 (linear)"


def test_phases_of_an_unmarked_recording_are_inferred_from_the_prediction():
    predicted = _step(PLAN)
    real = copy.deepcopy(predicted)
    for ev in real.trace:  # a recording: no memgnn markers, no frames
        for key in ("phase", "step", "category", "frames"):
            ev.pop(key, None)
    doc = diff_snapshots(real, predicted)
    how = doc["phases_from"]["real"]
    assert how["method"].startswith("inferred") and how["agreeing"] == how["labelled_allocations"]
    assert list(how["phase_starts"]) == ["setup", "forward", "backward", "optimizer"]
    assert doc["differing_sizes"] == 0
    assert [a.phase for a in allocations(real)] == [None] * 5  # the file itself is unmarked


def test_peak_composition_by_size_class_phase_and_category():
    doc = diff_snapshots(_step(PLAN), _step(PLAN))
    peak = doc["peak"]["predicted"]
    # live at the peak (the backward 4 MiB gradient): w, a, b and g: 13 MiB requested
    assert peak["live_requested_bytes"] == 13 * MiB and peak["live_allocations"] == 4
    assert peak["by_size_class"] == {"1 - 16 MiB": 13 * MiB}
    assert peak["by_phase"] == {"forward": 5 * MiB, "setup": 4 * MiB, "backward": 4 * MiB}
    assert peak["by_category"] == {"activation": 9 * MiB, "parameter": 4 * MiB}


def test_one_step_of_a_two_step_prediction():
    both = _step(PLAN, steps=("first", "steady"))
    one = _step(PLAN)
    assert not diff_snapshots(one, both)["identical"]  # twice the forward, backward, ...
    doc = diff_snapshots(one, both, DiffConfig(step="first"))
    assert doc["differing_sizes"] == 0 and doc["predicted"]["step"] == "first"
    with pytest.raises(ValueError, match="step must be first or steady"):
        DiffConfig(step="third")
