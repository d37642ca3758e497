"""`memgnn snapshot replay|plot|diff`: real CUDA snapshots through the allocator simulator,
and beside memgnn's prediction of the same step."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from memgnn.cli.options import train_spec
from memgnn.cli.render import fmt_bytes, parse_bytes, print_table

__all__ = ["add_arguments", "plot_prediction", "smaller_batch", "tag_export"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    ssub = p.add_subparsers(dest="snapshot_command", required=True)
    q = ssub.add_parser("replay", help="replay a snapshot's requests through the simulator")
    q.add_argument("file", help="a _dump_snapshot pickle (plain or .gz)")
    q.add_argument(
        "--alloc-conf",
        default=None,
        help="what-if PYTORCH_CUDA_ALLOC_CONF (e.g. expandable_segments:True); "
        "default: the recorded settings",
    )
    q.add_argument("--capacity", default=None, help="device bytes for the allocator (80GiB, 8e10)")
    q.add_argument(
        "--memory-fraction",
        type=float,
        default=None,
        help="set_per_process_memory_fraction of --capacity (garbage_collection_threshold "
        "acts only with one)",
    )
    q.add_argument(
        "--device", type=int, default=None, help="this device's trace (default: every device)"
    )
    q.add_argument("--json", action="store_true")
    _load_options(q)
    q.set_defaults(func=replay_cmd)
    q = ssub.add_parser("plot", help="memory timeline of a snapshot (PNG or SVG)")
    q.add_argument("file")
    q.add_argument("-o", "--output", required=True, help="OUT.png or OUT.svg")
    q.add_argument("--alloc-conf", default=None, help="overlay this what-if's simulated reserved")
    q.add_argument("--capacity", default=None, help="draw the device capacity (bytes, 80GiB)")
    q.add_argument("--device", type=int, default=None)
    q.add_argument("--top", type=int, default=5, help="allocations to label at the peak")
    _load_options(q)
    q.set_defaults(func=plot_cmd)
    q = ssub.add_parser("diff", help="a real recording beside memgnn's prediction of the step")
    q.add_argument("real", help="the real recording (_dump_snapshot pickle, plain or .gz)")
    q.add_argument("predicted", help="memgnn's export (profile --backend sim --snapshot)")
    q.add_argument("--device", type=int, default=None, help="the real recording's device")
    q.add_argument(
        "--step",
        choices=("first", "steady"),
        default=None,
        help="compare only this step of the prediction (default: all of it)",
    )
    q.add_argument("--top", type=int, default=12, help="rows per size table")
    q.add_argument("--json", action="store_true")
    _load_options(q)
    q.set_defaults(func=diff_cmd)


def diff_cmd(args: argparse.Namespace) -> int:
    from memgnn.predictor.snapshot.diff import DiffConfig, diff_snapshots
    from memgnn.predictor.snapshot.diff_text import diff_text
    from memgnn.predictor.snapshot.loader import load_snapshot

    load = _load_kwargs(args)
    real = load_snapshot(args.real, device=args.device, **load)
    predicted = load_snapshot(args.predicted, **load)
    doc = diff_snapshots(real, predicted, DiffConfig(step=args.step, top=args.top))
    print(json.dumps(doc, indent=2) if args.json else diff_text(doc), end="\n" if args.json else "")
    return 0


def _load_options(q: argparse.ArgumentParser) -> None:
    """What the loader tolerates (predictor.snapshot.loader; defaults: LoadLimits)."""
    q.add_argument(
        "--tolerate-double-free",
        action="store_true",
        help="skip frees of unallocated blocks (as the replay used to) instead of refusing",
    )
    q.add_argument("--max-objects", type=int, default=None, help="loader limit (values built)")
    q.add_argument("--max-memory", default=None, help="loader limit (object bytes, 1GiB)")


def _load_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    from memgnn.predictor.snapshot.loader import LoadLimits

    limits: dict[str, int] = {}
    if args.max_objects is not None:
        limits["max_objects"] = args.max_objects
    if args.max_memory is not None:
        limits["max_memory_bytes"] = parse_bytes(args.max_memory)
    return {"limits": LoadLimits(**limits), "tolerate_double_free": args.tolerate_double_free}


def replay_cmd(args: argparse.Namespace) -> int:
    from memgnn.predictor.snapshot.loader import load_snapshot, load_snapshots
    from memgnn.predictor.snapshot.whatif import replay_devices

    capacity = None if args.capacity is None else parse_bytes(args.capacity)
    load = _load_kwargs(args)
    if args.device is None:
        snaps = load_snapshots(args.file, **load)
    else:
        snaps = [load_snapshot(args.file, device=args.device, **load)]
    out = replay_devices(
        snaps,
        alloc_conf=args.alloc_conf,
        capacity_bytes=capacity,
        memory_fraction=args.memory_fraction,
    )
    if out["oom"] is not None and snaps[0].memgnn is not None:
        out["oom"]["smaller_batch"] = smaller_batch(snaps[0].memgnn, capacity, args.alloc_conf)
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    for r in out.get("devices", [out]):
        where = f"{args.file} (device {r['device']})" if "devices" in out else args.file
        _print_report(where, r)
    return 0


def _row(name: str, rec: Any, sim: Any) -> list[str]:
    def show(v: Any) -> str:
        return f"{v} ({fmt_bytes(v)})" if isinstance(v, int) and "bytes" in name else str(v)

    return [name, show(rec), show(sim)]


def _print_report(path: str, r: dict[str, Any]) -> None:
    conf = r["alloc_conf"] or "(PyTorch defaults)"
    kind = "as recorded" if r["as_recorded"] else "what-if"
    print(
        f"{path}: {r['events']} events, {r['trace_requests']} requests; alloc conf {conf} ({kind})"
    )
    print(
        f"initial state: {r['initial_segments']} segments, "
        f"{fmt_bytes(r['initial_reserved_bytes'])} reserved, "
        f"{fmt_bytes(r['initial_allocated_bytes'])} allocated ({r['initial_state']})"
    )
    print_table(
        ["", "recorded", "simulated"],
        [
            _row(
                "peak reserved bytes",
                r["recorded_peak_reserved_bytes"],
                r["simulated_peak_reserved_bytes"],
            ),
            _row(
                "peak allocated bytes",
                r["recorded_peak_allocated_bytes"],
                r["simulated_peak_allocated_bytes"],
            ),
            _row("segment allocs", r["recorded_segment_allocs"], r["simulated_segment_allocs"]),
            _row(
                "fragmentation at peak",
                r["recorded_fragmentation_at_peak"],
                r["fragmentation_at_peak"],
            ),
        ],
    )
    print(
        f"segment allocs matched in order and size: {r['segment_allocs_matched']}; "
        f"requests at the recorded address: {r['requests_at_recorded_address']} of "
        f"{r['requests']} replayed"
    )
    d = r["first_divergence"]
    print("first divergence: " + ("none" if d is None else json.dumps(d)))
    if r.get("segments") == "expandable":
        print(
            f"expandable segments: mapped {fmt_bytes(r['recorded_mapped_bytes'])} in "
            f"{r['recorded_segment_maps']} maps, unmapped "
            f"{fmt_bytes(r['recorded_unmapped_bytes'])} (simulated: mapped "
            f"{fmt_bytes(r['simulated_mapped_bytes'])}, unmapped "
            f"{fmt_bytes(r['simulated_unmapped_bytes'])}); mapped at the end: recorded "
            f"{r['recorded_final_mapped_bytes']}, simulated {r['simulated_final_mapped_bytes']}, "
            f"dump {r['dump_mapped_bytes']} bytes"
        )
        if "initial_state_note" in r:
            print(f"note: {r['initial_state_note']}")
    for o in r.get("recorded_ooms", []):
        print(
            f"recorded OOM at event {o['event']}: request {fmt_bytes(o['request_bytes'])}, "
            f"device free {o['device_free_bytes']} bytes; simulated reserved "
            f"{fmt_bytes(o['simulated_reserved_bytes'])}, largest free block "
            f"{fmt_bytes(o['largest_free_block_bytes'])}; simulator agrees: "
            f"{o['simulator_agrees']}"
        )
    if r.get("double_frees_skipped"):
        print(f"double frees skipped (tolerated): events {r['double_frees_skipped']}")
    if r["simulated_final_blocks_differing"] is not None:
        print(
            f"state at the end vs the file's dump: {r['dump_blocks']} blocks, "
            f"{r['simulated_final_blocks_differing']} differ"
        )
    print(f"replay: {r['simulated_replay_seconds']:.3f} s, {r['events_per_second']} events/s")
    if r["would_oom"] is None:
        return
    cap = fmt_bytes(r["capacity_bytes"])
    if not r["would_oom"]:
        print(f"fits in {cap}: no simulated OOM")
        return
    o = r["oom"]
    print(
        f"OOM in {cap} at event {o['event']}: request {fmt_bytes(o['request_bytes'])}, "
        f"reserved {fmt_bytes(o['reserved_bytes'])}, allocated "
        f"{fmt_bytes(o['allocated_bytes'])}, free but fragmented "
        f"{fmt_bytes(o['free_reserved_bytes'])} (largest free block "
        f"{fmt_bytes(o['largest_free_block_bytes'])})"
    )
    if not o["avoided_by"]:
        print("none of the alternative settings avoids it")
    b = o.get("smaller_batch")
    if b is not None:
        print(
            f"  avoided by batch {b['batch']} (was {b['was']}): simulated peak reserved "
            f"{fmt_bytes(b['simulated_peak_reserved_bytes'])}"
            if b["batch"]
            else f"  no batch size fits (memgnn export of {b['model']}): {b['reason']}"
        )
    for alt in o["avoided_by"]:
        print(
            f"  avoided by --alloc-conf {alt['alloc_conf']}: peak reserved "
            f"{fmt_bytes(alt['simulated_peak_reserved_bytes'])}"
        )


def plot_cmd(args: argparse.Namespace) -> int:
    from memgnn.predictor.snapshot.conf import allocator_config, recorded_alloc_conf
    from memgnn.predictor.snapshot.loader import load_snapshot
    from memgnn.predictor.snapshot.plot import PlotConfig, plot_snapshot

    snap = load_snapshot(args.file, device=args.device, **_load_kwargs(args))
    capacity = None if args.capacity is None else parse_bytes(args.capacity)
    cfg = PlotConfig(
        top=args.top,
        hlines=[] if capacity is None else [(capacity, f"capacity {fmt_bytes(capacity)}")],
    )
    if args.alloc_conf is not None:  # the what-if, at the capacity if one is given
        cfg.what_if = allocator_config(args.alloc_conf, capacity_bytes=capacity)
        cfg.what_if_label = args.alloc_conf
    elif capacity is not None:  # the recorded settings, limited to the capacity
        conf = recorded_alloc_conf(snap.allocator_settings)
        cfg.what_if = allocator_config(conf, capacity_bytes=capacity)
        cfg.what_if_label, cfg.what_if_as_recorded = "at the capacity", True
    out = plot_snapshot(snap, args.output, cfg)
    print(f"wrote {out}")
    return 0


def plot_prediction(
    path: str, graph, sizes: dict[str, int], device, pred, *, scenario: str, title: str
) -> None:
    """`memgnn predict --plot`: the simulated step's timeline with the prediction drawn."""
    from memgnn.predictor.snapshot.export import simulated_step_snapshot
    from memgnn.predictor.snapshot.loader import snapshot_from_dict
    from memgnn.predictor.snapshot.plot import PlotConfig, plot_snapshot

    snap = snapshot_from_dict(
        simulated_step_snapshot(graph, sizes, device, scenario=scenario), what="simulated step"
    )
    hlines = []
    if pred["metric"] in ("allocated", "reserved"):  # device_total adds the context
        hlines += [
            (pred["predicted_peak_bytes"], f"predicted {pred['metric']} peak"),
            (pred["upper_bound_bytes"], f"upper bound ({pred['metric']})"),
        ]
    if device.total_bytes is not None:
        usable = device.total_bytes - device.context_bytes
        hlines.append((usable, f"{device.name} minus context"))
    plot_snapshot(snap, path, PlotConfig(title=title, hlines=hlines))
    print(f"wrote {path}", file=sys.stderr)


def tag_export(path: str, args: argparse.Namespace, sizes: dict[str, int], device: str) -> None:
    """Record in a `profile --snapshot` file what it was made from, so `snapshot replay
    --capacity` can look for a batch that fits."""
    from memgnn.predictor.snapshot.export import write_snapshot
    from memgnn.predictor.snapshot.loader import read_snapshot_data

    data = read_snapshot_data(path)
    data["memgnn"] = {
        "model": args.model,
        "model_args": dict(args.model_arg),
        "task": args.task,
        "train": train_spec(args).flat(),
        "sizes": sizes,
        "device": device,
    }
    write_snapshot(data, path)


def smaller_batch(meta: dict[str, Any], capacity: int, alloc_conf: str | None) -> dict[str, Any]:
    """The largest batch below the export's whose simulated step fits ``capacity``
    (binary search; one symbolic capture, then a simulation per probe)."""
    from memgnn.predictor.capture.cache import capture_cached
    from memgnn.predictor.sim.simulate import simulate
    from memgnn.predictor.snapshot.conf import allocator_config
    from memgnn.predictor.spec.devices import get_profile
    from memgnn.predictor.spec.train import TrainSpec
    from memgnn.predictor.zoo import resolve

    sizes = {k: int(v) for k, v in meta["sizes"].items()}
    was = sizes.get("B")
    out: dict[str, Any] = {"model": meta["model"], "was": was, "batch": None, "reason": ""}
    if not was or was < 2:
        out["reason"] = "the export has no batch dim B above 1"
        return out
    bundle = resolve(meta["model"], meta.get("model_args") or {}, meta.get("task"))
    train = TrainSpec.of(**meta["train"])
    device = get_profile(meta["device"])
    graph = capture_cached(bundle, train, target="cuda", sm=device.sm or 80, sizes=sizes)
    cfg = allocator_config(alloc_conf or "", capacity_bytes=capacity)

    def fits(b: int) -> int | None:
        res = simulate(graph, sizes | {"B": b}, device, allocator=cfg)
        return None if res.stats["would_oom"] else res.peak_reserved_bytes

    lo, hi, best = 1, was - 1, None
    while lo <= hi:
        mid = (lo + hi) // 2
        peak = fits(mid)
        if peak is None:
            hi = mid - 1
        else:
            lo, best = mid + 1, (mid, peak)
    if best is None:
        out["reason"] = "even batch 1 does not fit"
        return out
    out["batch"], out["simulated_peak_reserved_bytes"] = best
    return out
