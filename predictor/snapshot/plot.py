"""Memory timeline pictures of a snapshot: allocated and reserved bytes over events.

The recorded run (:func:`predictor.snapshot.replay.recorded_timeline`) is drawn as
allocated (block bytes) and reserved lines; where the events carry a ``category``
(memgnn exports do) the live requested bytes are stacked by category underneath. The
allocated peak is marked and labelled with its largest live allocations (size and the
first stack frame outside torch, when the file has frames). A what-if run (another
``PYTORCH_CUDA_ALLOC_CONF``) can be overlaid as its simulated reserved line, and
horizontal lines mark e.g. a capacity or a prediction.

matplotlib is imported when a plot is drawn (it is an optional dependency: the
``plot`` extra); without it a clear error says how to install it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memgnn.predictor.errors import UserError
from memgnn.predictor.sim.allocator import AllocatorConfig, format_size
from memgnn.predictor.sim.live import sample_points
from memgnn.predictor.snapshot.loader import Snapshot
from memgnn.predictor.snapshot.replay import recorded_timeline, simulate_snapshot
from memgnn.predictor.snapshot.state import initial_state

logger = logging.getLogger(__name__)

__all__ = ["PlotConfig", "peak_allocations", "plot_snapshot"]

_FORMATS = (".png", ".svg", ".pdf")
MAX_POINTS = 20_000  # events drawn per series (longer traces keep per-bucket maxima)
_COLOURS = {  # stacking order: long-lived at the bottom
    "before recording": "#bbbbbb",
    "workspace": "#8c8c8c",
    "parameter": "#4c72b0",
    "optimizer_state": "#55a868",
    "gradient": "#dd8452",
    "input": "#8172b3",
    "activation": "#c44e52",
    "temporary": "#937860",
    "scratch": "#da8bc3",
    "during recording": "#9ecae1",
}


@dataclass(kw_only=True, slots=True)
class PlotConfig:
    title: str = ""
    top: int = 5  # allocations labelled at the peak
    what_if: AllocatorConfig | None = None  # overlay this setting's simulated reserved
    what_if_label: str = ""
    what_if_as_recorded: bool = False  # what_if is the recorded setting (e.g. + a capacity)
    hlines: list[tuple[int, str]] = field(default_factory=list)  # (bytes, label)

    def __post_init__(self) -> None:
        if not 0 <= self.top <= 50:
            raise UserError(f"top must be in [0, 50], got {self.top}")


def _frame_text(frames: Any) -> str:
    if not isinstance(frames, list) or not frames:
        return ""
    chosen = next(
        (f for f in frames if isinstance(f, dict) and "torch/" not in str(f.get("filename"))),
        frames[0],
    )
    if not isinstance(chosen, dict):
        return ""
    return f"{chosen.get('name', '?')} ({chosen.get('filename', '?')}:{chosen.get('line', '?')})"


def peak_allocations(snap: Snapshot, event: int, top: int) -> list[dict[str, Any]]:
    """The ``top`` largest live allocations after ``event`` (-1: the initial state)."""
    live: dict[int, dict[str, Any]] = {
        b.address: {"size": b.requested, "frame": "", "category": "before recording"}
        for b in initial_state(snap).blocks
    }
    for ev in snap.trace[: event + 1]:
        act = ev["action"]
        if act == "alloc":
            live[ev["addr"]] = {
                "size": ev["size"],
                "frame": _frame_text(ev.get("frames")),
                "category": ev.get("category", ""),
            }
        elif act == "free_completed":
            live.pop(ev["addr"], None)
    return sorted(live.values(), key=lambda a: -a["size"])[:top]


def _category_stacks(snap: Snapshot) -> dict[str, list[int]]:
    """Live requested bytes per category after each event; without categories in the
    file: allocated before recording began vs during."""
    known = any("category" in ev for ev in snap.trace[:1000] if ev["action"] == "alloc")
    default = "other" if known else "during recording"
    sizes: dict[int, tuple[str, int]] = {}
    if not known:
        sizes = {b.address: ("before recording", b.requested) for b in initial_state(snap).blocks}
    current: dict[str, int] = {}
    for cat, size in sizes.values():
        current[cat] = current.get(cat, 0) + size
    cats: dict[str, list[int]] = {cat: [] for cat in current}
    for i, ev in enumerate(snap.trace):
        act = ev["action"]
        if act == "alloc":
            cat = ev.get("category", default)
            sizes[ev["addr"]] = (cat, ev["size"])
            current[cat] = current.get(cat, 0) + ev["size"]
            cats.setdefault(cat, [0] * i)
        elif act == "free_completed" and ev["addr"] in sizes:
            cat, size = sizes.pop(ev["addr"])
            current[cat] -= size
        for cat, series in cats.items():
            series.append(current.get(cat, 0))
    return cats


def _sample_points(allocated: list[int], reserved: list[int], most: int = MAX_POINTS) -> list[int]:
    """Event indices to draw (`predictor.sim.live.sample_points`: peaks stay visible)."""
    return sample_points(allocated, reserved, most)


def _unit(peak: int) -> tuple[float, str]:
    return (float(1 << 30), "GiB") if peak >= 2 << 30 else (float(1 << 20), "MiB")


def plot_snapshot(snap: Snapshot, out: str | Path, config: PlotConfig | None = None) -> Path:
    """Draw the timeline to ``out`` (.png, .svg or .pdf); returns the path."""
    cfg = config or PlotConfig()
    out = Path(out)
    if out.suffix.lower() not in _FORMATS:
        raise UserError(f"plot output must end in one of {_FORMATS}, got {out.name!r}")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UserError(
            "plotting needs matplotlib: pip install 'memgnn[plot]' (or pip install matplotlib)"
        ) from None
    if not snap.trace:
        raise UserError(f"{snap.source or 'snapshot'} has no trace events to plot")
    rec = recorded_timeline(snap)
    # A line far above the run (a big device for a small model) would flatten the plot:
    # it is named in the text box instead.
    hlines = [(v, t) for v, t in cfg.hlines if v <= 4 * max(rec.peak_reserved_bytes, 1)]
    far = [(v, t) for v, t in cfg.hlines if (v, t) not in hlines]
    peak_all = max([rec.peak_reserved_bytes, *(v for v, _ in hlines)])
    scale, unit = _unit(peak_all)
    x = _sample_points(rec.allocated, rec.reserved)
    fig, ax = plt.subplots(figsize=(12, 6.5), dpi=110)
    stacks = _category_stacks(snap)
    if stacks:
        names = sorted(stacks, key=lambda c: list(_COLOURS).index(c) if c in _COLOURS else 99)
        ax.stackplot(
            x,
            *[[stacks[c][i] / scale for i in x] for c in names],
            labels=[f"{c} (requested)" for c in names],
            colors=[_COLOURS.get(c, "#bbbbbb") for c in names],
            alpha=0.75,
        )
    ax.plot(x, [rec.allocated[i] / scale for i in x], color="black", lw=1.2, label="allocated")
    ax.plot(x, [rec.reserved[i] / scale for i in x], color="#1f77b4", lw=1.6, label="reserved")
    if cfg.what_if is not None:
        run = simulate_snapshot(snap, cfg.what_if, recorded_settings=cfg.what_if_as_recorded)
        kind = "simulated" if cfg.what_if_as_recorded else "what-if"
        label = f"reserved, {kind} {cfg.what_if_label}".strip()
        wx = _sample_points(run.allocated, run.reserved)
        ax.plot(wx, [run.reserved[i] / scale for i in wx], "--",
                color="#2ca02c", lw=1.4, label=label)  # fmt: skip
        if run.oom is not None:
            ax.plot([run.oom["event"]], [run.oom["reserved_bytes"] / scale], "rx", ms=12,
                    mew=2, label=f"{kind} OOM at event {run.oom['event']}")  # fmt: skip
    for k, (value, label) in enumerate(sorted(hlines)):
        ax.axhline(value / scale, color="#d62728", ls=":", lw=1.2)
        ax.annotate(label, (len(snap.trace) * (0.02 + 0.3 * (k % 3)), value / scale),
                    xytext=(0, 3), textcoords="offset points", color="#d62728",
                    fontsize=8)  # fmt: skip
    acts = [ev["action"] for ev in snap.trace]
    for i, act in enumerate(acts):
        if act == "oom":
            ax.axvline(i, color="red", lw=1.0)
    releases = [
        i for i, a in enumerate(acts) if a == "segment_free" and (i == 0 or acts[i - 1] != a)
    ]
    if releases:
        y = [peak_all / scale * 0.01] * len(releases)
        ax.plot(releases, y, "^", color="#ff7f0e", ms=6, label="cache released (segment_free)")
    at = max(rec.peak_allocated_event, 0)
    ax.axvline(at, color="black", ls="--", lw=0.8)
    ax.plot([at], [rec.peak_allocated_bytes / scale], "kv", ms=8)
    lines = [f"peak reserved {format_size(rec.peak_reserved_bytes)}"]
    lines += [f"{t}: {format_size(v)} (off the scale)" for v, t in far]
    lines += [
        f"peak allocated {format_size(rec.peak_allocated_bytes)} at event {at}; largest live:"
    ]
    for a in peak_allocations(snap, rec.peak_allocated_event, cfg.top):
        where = a["frame"] or a["category"] or "(no frames in file)"
        lines.append(f"{format_size(a['size']):>11}  {where[:70]}")
    ax.text(0.01, 0.985, "\n".join(lines), transform=ax.transAxes, va="top", ha="left",
            fontsize=8, family="monospace",
            bbox={"facecolor": "white", "alpha": 0.85, "edgecolor": "#999999"})  # fmt: skip
    ax.set_xlabel("trace event")
    ax.set_ylabel(f"bytes ({unit})")
    ax.set_ylim(0, peak_all / scale * 1.45)
    ax.set_xlim(0, len(snap.trace) - 1 if len(snap.trace) > 1 else 1)
    ax.set_title(cfg.title or f"{Path(snap.source).name or 'snapshot'}: memory over the trace")
    ax.legend(loc="upper right", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    logger.info("wrote %s", out)
    return out
