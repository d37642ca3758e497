"""Export a simulated run as a snapshot; load it back safely; replay gives the same peaks."""

import pickle

import pytest
from memgnn.predictor.capture.cache import capture_cached
from memgnn.predictor.sim.allocator import MiB
from memgnn.predictor.sim.simulate import simulate
from memgnn.predictor.snapshot.export import (
    SnapshotRecorder,
    simulated_step_snapshot,
    write_snapshot,
)
from memgnn.predictor.snapshot.loader import load_snapshot, loads_snapshot, snapshot_from_dict
from memgnn.predictor.snapshot.plot import (
    PlotConfig,
    _sample_points,
    peak_allocations,
    plot_snapshot,
)
from memgnn.predictor.snapshot.whatif import replay_report
from memgnn.predictor.spec.devices import get_profile
from memgnn.predictor.spec.train import TrainSpec


def test_recorder_writes_pytorch_actions_and_segments(tmp_path):
    rec = SnapshotRecorder()
    a = rec.malloc(3 * MiB, frames=[{"filename": "m.py", "line": 3, "name": "f"}])
    b = rec.malloc(100)
    assert rec.malloc(0) == 0
    rec.free(a)
    rec.empty_cache()  # the 20 MiB segment is free and whole: released
    snap = rec.snapshot()
    actions = [e["action"] for e in snap["device_traces"][0]]
    assert actions == [
        "segment_alloc", "alloc", "segment_alloc", "alloc",
        "free_requested", "free_completed", "segment_free",
    ]  # fmt: skip
    assert snap["device_traces"][0][1]["size"] == 3 * MiB  # requested bytes, like PyTorch
    (seg,) = snap["segments"]  # only the small-pool segment is left
    assert seg["segment_type"] == "small" and seg["total_size"] == 2 * MiB
    assert seg["blocks"][0] == {
        "address": b, "size": 512, "requested_size": 100, "state": "active_allocated",
    }  # fmt: skip
    path = write_snapshot(snap, tmp_path / "s.pickle.gz")
    r = replay_report(load_snapshot(path))
    assert r["recorded_peak_reserved_bytes"] == r["simulated_peak_reserved_bytes"] == 22 * MiB
    assert r["recorded_peak_allocated_bytes"] == 3 * MiB + 512
    assert r["segment_allocs_matched"] == 2 and r["first_divergence"] is None


def test_step_export_round_trips_with_the_same_peaks(tmp_path, tiny_gpt):
    device = get_profile("a100-80gb")
    sizes = tiny_gpt.sizes({"B": 2, "S": 16})
    graph = capture_cached(tiny_gpt, TrainSpec(), target="cuda", sm=device.sm, sizes=sizes)
    out = tmp_path / "step.pickle"
    res = simulate(graph, sizes, device)
    write_snapshot(simulated_step_snapshot(graph, sizes, device), out)
    snap = load_snapshot(out)
    acts = {e["action"] for e in snap.trace}
    assert {"alloc", "free_requested", "free_completed", "segment_alloc"} <= acts
    assert any(e.get("frames") for e in snap.trace if e["action"] == "alloc")
    # every alloc carries the phase and step of the trace's markers, in the step's order
    marks = [(e["step"], e["phase"]) for e in snap.trace if e["action"] == "alloc"]
    assert marks[0] == ("first", "setup") and {m[0] for m in marks} == {"first", "steady"}
    order = [m for i, m in enumerate(marks) if i == 0 or marks[i - 1] != m]
    assert [p for s, p in order if s == "first"][:3] == ["setup", "input", "forward"]
    assert order.index(("first", "backward")) < order.index(("first", "optimizer"))
    r = replay_report(snap)
    assert r["initial_reserved_bytes"] == 0
    assert r["recorded_peak_reserved_bytes"] == res.peak_reserved_bytes
    assert r["simulated_peak_reserved_bytes"] == res.peak_reserved_bytes
    assert r["recorded_peak_allocated_bytes"] == res.peak_allocated_bytes
    assert r["simulated_peak_allocated_bytes"] == res.peak_allocated_bytes
    assert r["segment_allocs_matched"] == r["recorded_segment_allocs"] > 0
    assert r["first_divergence"] is None
    png = plot_snapshot(snap, tmp_path / "step.png", PlotConfig(title="tiny"))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The in-memory snapshot behind `predict --plot` is the same step.
    again = replay_report(snapshot_from_dict(simulated_step_snapshot(graph, sizes, device)))
    assert again["recorded_peak_reserved_bytes"] == res.peak_reserved_bytes
    assert again["events"] == r["events"]


def test_peak_allocations_lists_the_largest_live_ones():
    rec = SnapshotRecorder()
    a = rec.malloc(5 * MiB, category="activation")
    rec.malloc(7 * MiB, frames=[{"filename": "torch/nn/x.py", "line": 1, "name": "inner"},
                                {"filename": "train.py", "line": 9, "name": "step"}])  # fmt: skip
    rec.free(a)
    snap = load_snapshot_dict(rec.snapshot())
    top = peak_allocations(snap, len(snap.trace) - 1, 5)
    assert [(t["size"], t["frame"]) for t in top] == [(7 * MiB, "step (train.py:9)")]
    top = peak_allocations(snap, 3, 5)  # after the second alloc, before the free
    assert [t["size"] for t in top] == [7 * MiB, 5 * MiB]
    assert top[1]["category"] == "activation"


def test_plot_rejects_unknown_formats(tmp_path):
    rec = SnapshotRecorder()
    rec.malloc(MiB)
    with pytest.raises(ValueError, match="must end in one of"):
        plot_snapshot(load_snapshot_dict(rec.snapshot()), tmp_path / "x.jpg")


def load_snapshot_dict(obj):
    return loads_snapshot(pickle.dumps(obj))


def test_pytorch_memory_viz_reads_the_export():
    """PyTorch's own snapshot tools (torch.cuda._memory_viz, the code behind
    pytorch.org/memory_viz's HTML) parse an exported run."""
    mv = pytest.importorskip("torch.cuda._memory_viz")
    rec = SnapshotRecorder()
    a = rec.malloc(3 * MiB, frames=[{"filename": "m.py", "line": 3, "name": "f"}])
    rec.malloc(100)
    rec.free(a)
    snap = rec.snapshot()
    text = mv.trace(snap)
    assert text.count("cudaMalloc") == 2
    assert "segments: 2" in mv.segsum(snap)
    assert "<html" in mv.trace_plot(snap).lower()


def test_long_traces_are_sampled_keeping_the_peaks():
    allocated = [i % 1000 for i in range(100_000)]
    allocated[54_321] = 10**9
    reserved = [5] * 100_000
    pts = _sample_points(allocated, reserved, most=2000)
    assert len(pts) <= 2002 and pts[0] == 0 and pts[-1] == 99_999
    assert 54_321 in pts
    assert _sample_points([1, 2], [1, 2]) == [0, 1]


def test_exported_frames_name_the_source_line_in_pytorchs_own_viewer_tools(tiny_gpt):
    """memory_viz shows each block's frames; an export's frames were a module path with a
    node index for a line. Now the first frame is the line of model code the capture
    recorded (`predictor.ir.sources`), formatted by PyTorch's `_memory_viz` as its text
    views format recorded frames."""
    import torch.cuda._memory_viz as memory_viz

    device = get_profile("a100-80gb")
    sizes = tiny_gpt.sizes({"B": 2, "S": 16})
    graph = capture_cached(tiny_gpt, TrainSpec(), target="cuda", sm=device.sm, sizes=sizes)
    snap = simulated_step_snapshot(graph, sizes, device)
    allocs = [e for e in snap["device_traces"][0] if e["action"] == "alloc" and "frames" in e]
    sourced = [e for e in allocs if e["frames"][0]["filename"].endswith("tiny_models.py")]
    assert sourced, allocs[:3]  # the tiny model's own file, with a real line number
    assert all(e["frames"][0]["line"] > 0 for e in sourced)
    assert all(len(e["frames"]) == 2 for e in sourced)  # then the module path and the op
    first = sourced[0]["frames"]
    shown = memory_viz._frames_fmt(first)  # what the viewer's tools print per frame
    assert shown[0] == f"tiny_models.py:{first[0]['line']}:{first[0]['name']}", shown
    memory_viz.trace(snap)  # and the whole export goes through its trace view
