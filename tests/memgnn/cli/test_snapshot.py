"""`memgnn snapshot replay|plot`, `profile --snapshot`, `predict --plot` end to end."""

import json
import pickle

from tests.memgnn.cli.clirun import run_cli

MiB = 1 << 20


def test_export_replay_post_mortem_and_plots(tmp_path, capsys):
    snap = tmp_path / "mlp.pickle.gz"
    common = ["--model", "mlp", "--batch", "8192", "--device", "a100-80gb"]
    code, out, _ = run_cli(capsys, "profile", "--backend", "sim", *common, "--snapshot", str(snap),
                        "--json")  # fmt: skip
    assert code == 0
    record = json.loads(out)
    code, out, _ = run_cli(capsys, "snapshot", "replay", str(snap), "--json")
    r = json.loads(out)
    assert code == 0
    assert r["recorded_peak_reserved_bytes"] == r["simulated_peak_reserved_bytes"]
    assert r["simulated_peak_reserved_bytes"] == record["peak_reserved_bytes"]
    assert r["simulated_peak_allocated_bytes"] == record["peak_allocated_bytes"]
    assert r["segment_allocs_matched"] == r["recorded_segment_allocs"]
    # 40 MiB cannot hold the B=8192 step; a smaller batch of the exported model can.
    code, out, _ = run_cli(capsys, "snapshot", "replay", str(snap), "--capacity", "40MiB", "--json")
    r = json.loads(out)
    assert r["would_oom"] is True
    small = r["oom"]["smaller_batch"]
    assert small["was"] == 8192 and 1 <= small["batch"] < 8192
    assert small["simulated_peak_reserved_bytes"] <= 40 * MiB
    code, out, _ = run_cli(capsys, "snapshot", "replay", str(snap), "--capacity", "40MiB")
    assert code == 0 and f"avoided by batch {small['batch']} (was 8192)" in out
    png = tmp_path / "t.png"
    code, out, _ = run_cli(capsys, "snapshot", "plot", str(snap), "-o", str(png), "--capacity",
                        "40MiB", "--alloc-conf", "expandable_segments:True")  # fmt: skip
    assert code == 0 and png.read_bytes()[:4] == b"\x89PNG"
    svg = tmp_path / "p.svg"
    code, out, err = run_cli(capsys, "predict", *common, "--plot", str(svg), "--json")
    assert code == 0 and "predicted_peak_bytes" in json.loads(out) and "<svg" in svg.read_text()


def test_bad_snapshot_and_conf_are_one_line_errors(tmp_path, capsys):
    bad = tmp_path / "x.pickle"
    bad.write_bytes(b"nope")
    code, _, err = run_cli(capsys, "snapshot", "replay", str(bad))
    assert code == 2 and "not a readable pickle" in err
    code, _, err = run_cli(capsys, "snapshot", "replay", str(tmp_path / "none.pickle"))
    assert code == 2 and "cannot read snapshot" in err
    code, _, err = run_cli(capsys, "snapshot", "plot", str(bad), "-o", str(tmp_path / "x.gif"))
    assert code == 2


def test_replay_every_device_and_the_loader_options(tmp_path, capsys):
    from tests.predictor.snapshot.test_checks import _double_free_trace, seg
    from tests.predictor.snapshot.test_expandable import SETTINGS, dump, trace

    B = (1 << 40) + (1 << 36)
    two = {
        "segments": [dump(), dump(B, device=1)],
        "device_traces": [trace(), trace(B)],
        "allocator_settings": SETTINGS,
    }
    path = tmp_path / "two.pickle"
    path.write_bytes(pickle.dumps(two))
    code, out, _ = run_cli(capsys, "snapshot", "replay", str(path), "--json")
    r = json.loads(out)
    assert code == 0 and [d["device"] for d in r["devices"]] == [0, 1]
    assert all(d["recorded_peak_reserved_bytes"] == d["simulated_peak_reserved_bytes"]
               for d in r["devices"])  # fmt: skip
    code, out, _ = run_cli(capsys, "snapshot", "replay", str(path), "--device", "1", "--json")
    assert code == 0 and "devices" not in json.loads(out)
    code, out, _ = run_cli(capsys, "snapshot", "replay", str(path))
    assert code == 0 and "(device 1)" in out and "expandable segments: mapped 40.00 MiB" in out
    code, _, err = run_cli(capsys, "snapshot", "replay", str(path), "--max-objects", "10")
    assert code == 2 and "max_objects=10" in err
    # a double free: refused, or skipped when asked
    dump_seg = seg(1 << 40, 20 * MiB, [(1 << 40, 6 * MiB, "active_allocated")])
    bad = tmp_path / "df.pickle"
    bad.write_bytes(pickle.dumps({"segments": [dump_seg], "device_traces": [_double_free_trace()]}))
    code, _, err = run_cli(capsys, "snapshot", "replay", str(bad))
    assert code == 2 and "double free" in err and "--tolerate-double-free" in err
    code, out, _ = run_cli(capsys, "snapshot", "replay", str(bad), "--tolerate-double-free",
                           "--json")  # fmt: skip
    assert code == 0 and json.loads(out)["double_frees_skipped"] == [4, 5]


def test_diff_of_a_prediction_with_itself_and_with_a_recording(tmp_path, capsys):
    import copy

    from memgnn.predictor.snapshot.export import write_snapshot

    from tests.predictor.snapshot.test_diff import PLAN, _step

    one, two = tmp_path / "one.pickle", tmp_path / "two.pickle.gz"
    real_plan = copy.deepcopy(PLAN)
    real_plan[1][1].append(("mask", 3 * MiB, None))
    for path, plan in ((one, PLAN), (two, real_plan)):
        snap = _step(plan)
        write_snapshot({"segments": snap.segments, "device_traces": [snap.trace]}, path)
    code, out, _ = run_cli(capsys, "snapshot", "diff", str(one), str(one), "--json")
    doc = json.loads(out)
    assert code == 0 and doc["identical"] and doc["differing_sizes"] == 0
    code, out, _ = run_cli(capsys, "snapshot", "diff", str(two), str(one))
    assert code == 0 and "requested bytes per phase" in out and "forward " in out
    code, _, err = run_cli(capsys, "snapshot", "diff", str(two), str(one), "--step", "steady")
    assert code == 2 and "no allocations of step 'steady'" in err
