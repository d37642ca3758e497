"""`memgnn snapshot replay|plot`: real CUDA snapshots through the allocator simulator."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from memgnn.args import train_spec
from memgnn.display import fmt_bytes, parse_bytes, print_table

__all__ = ["add_snapshot_parser", "plot_prediction", "smaller_batch", "tag_export"]


def add_snapshot_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("snapshot", help="replay / plot torch.cuda.memory._dump_snapshot files")
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
    q.add_argument("--device", type=int, default=None, help="trace of this device (default: first)")
    q.add_argument("--json", action="store_true")
    q.set_defaults(func=replay_cmd)
    q = ssub.add_parser("plot", help="memory timeline of a snapshot (PNG or SVG)")
    q.add_argument("file")
    q.add_argument("-o", "--output", required=True, help="OUT.png or OUT.svg")
    q.add_argument("--alloc-conf", default=None, help="overlay this what-if's simulated reserved")
    q.add_argument("--capacity", default=None, help="draw the device capacity (bytes, 80GiB)")
    q.add_argument("--device", type=int, default=None)
    q.add_argument("--top", type=int, default=5, help="allocations to label at the peak")
    q.set_defaults(func=plot_cmd)


def replay_cmd(args: argparse.Namespace) -> int:
    from memgnn.predictor.snapshot.loader import load_snapshot
    from memgnn.predictor.snapshot.whatif import replay_report

    capacity = None if args.capacity is None else parse_bytes(args.capacity)
    snap = load_snapshot(args.file, device=args.device)
    out = replay_report(
        snap,
        alloc_conf=args.alloc_conf,
        capacity_bytes=capacity,
        memory_fraction=args.memory_fraction,
    )
    if out["oom"] is not None and snap.memgnn is not None:
        out["oom"]["smaller_batch"] = smaller_batch(snap.memgnn, capacity, args.alloc_conf)
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    _print_report(args.file, out)
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

    snap = load_snapshot(args.file, device=args.device)
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
    if pred.metric in ("allocated", "reserved"):  # device_total adds the context
        hlines += [
            (pred.predicted_peak_bytes, f"predicted {pred.metric} peak"),
            (pred.upper_bound_bytes, f"upper bound ({pred.metric})"),
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
