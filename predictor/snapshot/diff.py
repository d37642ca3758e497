"""A real recording beside memgnn's prediction of the same step (``memgnn snapshot diff``).

Both sides are ``_dump_snapshot`` files (the prediction: ``memgnn profile --backend sim
... --snapshot``). Each side's allocations are its trace's ``alloc`` events plus the blocks
allocated before recording began (:mod:`predictor.snapshot.state`), which count as phase
``setup`` (before the step). Then:

* **phases** (setup, input, forward, backward, optimizer, zero_grad): from the trace's
  own markers where it has them (memgnn's exports tag every alloc with ``phase`` and
  ``step``); otherwise inferred against a side that has them: each allocation whose size
  the other side also requests takes the phase of the other side's allocation of that size
  with the same rank (k-th of that size on both sides), and the trace is cut into phases
  in their order so that as many of those labels as possible agree (a monotone split;
  the share that agrees is reported). With markers on neither side, one phase ``step``.
* **sizes** (requested bytes, exact), per phase and over the whole step: the sizes only
  one side requests, and the sizes both request a different number of times, with counts
  and byte totals; and where a side has stack frames, the source lines behind them (the
  innermost frame outside PyTorch's own files).
* **peak composition**: the live allocations at each side's allocated peak, by size
  class, by category (where the file carries memgnn's ``category``) and by phase.

Sizes are requested bytes; peaks are the allocator's allocated / reserved bytes of
:func:`predictor.snapshot.replay.recorded_timeline`. All functions are pure.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

from memgnn.predictor.ir.vocab import PHASES
from memgnn.predictor.snapshot.loader import Snapshot
from memgnn.predictor.snapshot.replay import recorded_timeline
from memgnn.predictor.snapshot.state import initial_state

__all__ = ["Alloc", "DiffConfig", "SIZE_CLASSES", "allocations", "diff_snapshots", "where"]

NO_PHASE = "step"  # the one phase of a trace without markers on either side
SIZE_CLASSES = (  # (upper bound inclusive, label)
    (1 << 10, "<= 1 KiB"),
    (1 << 20, "1 KiB - 1 MiB"),
    (16 << 20, "1 - 16 MiB"),
    (256 << 20, "16 - 256 MiB"),
    (4 << 30, "256 MiB - 4 GiB"),
    (1 << 62, "> 4 GiB"),
)
_FRAME_PHASE = re.compile(r"\[(\w+), (\w+)\]$")  # memgnn's frame names: "op [phase, step]"
_LIBRARY = ("/torch/", "site-packages/", "dist-packages/", "/lib/python")


@dataclass(kw_only=True, slots=True)
class DiffConfig:
    """``step``: compare only this step of a side whose markers name steps (``first`` /
    ``steady``, plus its setup); ``top``: rows per listed table."""

    step: str | None = None
    top: int = 12

    def __post_init__(self) -> None:
        if self.step not in (None, "first", "steady"):
            raise ValueError(f"step must be first or steady, got {self.step!r}")
        if not 1 <= self.top <= 1000:
            raise ValueError(f"top must be in [1, 1000], got {self.top}")


@dataclass(kw_only=True, slots=True)
class Alloc:
    size: int  # requested bytes
    event: int  # the alloc event (-1: allocated before recording)
    free: int | None  # the free_completed event (None: live at the end)
    phase: str | None  # from the trace's markers (None: unmarked)
    step: str | None
    category: str | None
    where: str | None  # innermost frame outside PyTorch (file:line (name)), if frames


def where(frames: Any) -> str | None:
    """The source line of a frames list: the innermost frame outside PyTorch and other
    libraries, else the innermost frame (memgnn's own exports: the module and the op)."""
    if not isinstance(frames, list) or not frames:
        return None
    good = [f for f in frames if isinstance(f, dict)]
    if not good:
        return None
    user = [f for f in good if not any(x in str(f.get("filename", "")) for x in _LIBRARY)]
    f = (user or good)[0]
    filename = str(f.get("filename", "?"))
    if "." not in filename.rsplit("/", 1)[-1]:  # memgnn's frames: a module path, a graph node
        return f"{filename} ({f.get('name', '?')})"
    path = "/".join(filename.split("/")[-3:])
    return f"{path}:{f.get('line', '?')} ({f.get('name', '?')})"


def _marks(ev: dict) -> tuple[str | None, str | None]:
    if isinstance(ev.get("phase"), str):
        return ev["phase"], ev.get("step")
    frames = ev.get("frames")
    if isinstance(frames, list) and frames and isinstance(frames[0], dict):
        m = _FRAME_PHASE.search(str(frames[0].get("name", "")))
        if m and m.group(1) in PHASES:
            return m.group(1), m.group(2)
    return None, None


def allocations(snap: Snapshot) -> list[Alloc]:
    """The blocks allocated before recording (phase setup), then every alloc in order."""
    out = [
        Alloc(size=b.requested, event=-1, free=None, phase="setup", step=None,
              category="before recording", where=None)
        for b in sorted(initial_state(snap).blocks, key=lambda b: b.address)
    ]  # fmt: skip
    live: dict[int, Alloc] = {}
    skip = set(snap.double_frees)
    for i, ev in enumerate(snap.trace):
        if ev["action"] == "alloc":
            phase, step = _marks(ev)
            a = Alloc(size=ev["size"], event=i, free=None, phase=phase, step=step,
                      category=ev.get("category"), where=where(ev.get("frames")))  # fmt: skip
            live[ev["addr"]] = a
            out.append(a)
        elif ev["action"] == "free_completed" and i not in skip and ev["addr"] in live:
            live.pop(ev["addr"]).free = i
    return out


def _marked(allocs: list[Alloc]) -> bool:
    return any(a.phase is not None and a.event >= 0 for a in allocs)


def _infer(target: list[Alloc], guide: list[Alloc]) -> dict[str, Any]:
    """Label ``target``'s unmarked allocations with ``guide``'s phases (module docstring)."""
    order = [p for p in PHASES if any(a.phase == p for a in guide)] or [NO_PHASE]
    index = {p: k for k, p in enumerate(order)}
    by_size: dict[int, list[Alloc]] = {}
    for a in guide:
        by_size.setdefault(a.size, []).append(a)
    seen: Counter[int] = Counter()
    labels: list[int | None] = []
    for a in target:
        k = seen[a.size]
        seen[a.size] += 1
        twins = by_size.get(a.size, [])
        labels.append(index.get(twins[k].phase) if k < len(twins) else None)
    trace = [i for i, a in enumerate(target) if a.event >= 0]
    # monotone labelling of the trace's allocations that disagrees with fewest labels
    n, kk = len(trace), len(order)
    best = [0] * kk
    back: list[list[int]] = []
    for i in trace:
        lab = labels[i]
        run, arg, new, choice = 10**18, 0, [0] * kk, [0] * kk
        for k in range(kk):
            if best[k] < run:
                run, arg = best[k], k
            new[k] = run + (lab is not None and lab != k)
            choice[k] = arg
        best = new
        back.append(choice)
    k = min(range(kk), key=best.__getitem__) if n else 0
    assigned = [0] * n
    for j in range(n - 1, -1, -1):
        assigned[j] = k
        k = back[j][k]
    labelled = sum(1 for i in trace if labels[i] is not None)
    agree = sum(1 for j, i in enumerate(trace) if labels[i] == assigned[j])
    starts: dict[str, int] = {}
    for j, i in enumerate(trace):
        target[i].phase = order[assigned[j]]
        starts.setdefault(order[assigned[j]], target[i].event)
    return {
        "method": "inferred: same-size allocations matched by rank, then a monotone split",
        "labelled_allocations": labelled,
        "agreeing": agree,
        "phase_starts": starts,  # phase -> its first alloc event
    }


def _phases(real: list[Alloc], pred: list[Alloc]) -> dict[str, Any]:
    out = {}
    for name, side, other in (("real", real, pred), ("predicted", pred, real)):
        if _marked(side):
            for a in side:
                a.phase = a.phase or ("setup" if a.event < 0 else NO_PHASE)
            out[name] = {"method": "markers"}
        elif _marked(other):
            out[name] = _infer(side, other)
        else:
            for a in side:
                a.phase = "setup" if a.event < 0 else NO_PHASE
            out[name] = {"method": "none (no markers on either side)"}
    return out


def _sizes(real: list[Alloc], pred: list[Alloc], top: int) -> dict[str, Any]:
    rc, pc = Counter(a.size for a in real), Counter(a.size for a in pred)
    lines_r = _lines(real)
    lines_p = _lines(pred)

    def row(size: int) -> dict[str, Any]:
        r, p = rc[size], pc[size]
        out: dict[str, Any] = {"size": size, "real": r, "predicted": p, "bytes": size * (r - p)}
        if lines_r.get(size):
            out["real_lines"] = lines_r[size].most_common(3)
        if lines_p.get(size):
            out["predicted_lines"] = lines_p[size].most_common(3)
        return out

    only_r = sorted((s for s in rc if s not in pc), key=lambda s: -s * rc[s])
    only_p = sorted((s for s in pc if s not in rc), key=lambda s: -s * pc[s])
    both = sorted((s for s in rc if s in pc and rc[s] != pc[s]), key=lambda s: -abs(
        s * (rc[s] - pc[s])))  # fmt: skip
    return {
        "real": {"allocs": sum(rc.values()), "bytes": sum(s * c for s, c in rc.items())},
        "predicted": {"allocs": sum(pc.values()), "bytes": sum(s * c for s, c in pc.items())},
        "only_real_bytes": sum(s * rc[s] for s in only_r),
        "only_predicted_bytes": sum(s * pc[s] for s in only_p),
        "count_differs_bytes": sum(s * (rc[s] - pc[s]) for s in both),
        "only_real": [row(s) for s in only_r[:top]],
        "only_predicted": [row(s) for s in only_p[:top]],
        "count_differs": [row(s) for s in both[:top]],
        "only_real_sizes": len(only_r),
        "only_predicted_sizes": len(only_p),
        "count_differs_sizes": len(both),
    }


def _lines(allocs: list[Alloc]) -> dict[int, Counter[str]]:
    out: dict[int, Counter[str]] = {}
    for a in allocs:
        if a.where:
            out.setdefault(a.size, Counter())[a.where] += 1
    return out


def _size_class(size: int) -> str:
    return next(label for bound, label in SIZE_CLASSES if size <= bound)


def _peak(snap: Snapshot, allocs: list[Alloc], window: tuple[int, int] | None) -> dict[str, Any]:
    """The live allocations at the allocated peak (within ``window`` of events)."""
    tl = recorded_timeline(snap)
    lo, hi = window or (0, len(tl.allocated))
    series = tl.allocated[lo:hi]
    at = lo + max(range(len(series)), key=series.__getitem__) if series else -1
    peak = tl.allocated[at] if at >= 0 else sum(a.size for a in allocs if a.event < 0)
    live = [a for a in allocs if a.event <= at and (a.free is None or a.free > at)]
    group = {"by_size_class": _size_class, "by_phase": lambda a: a.phase or NO_PHASE}
    out: dict[str, Any] = {
        "event": at,
        "allocated_bytes": peak,
        "peak_reserved_bytes": tl.peak_reserved_bytes,
        "live_allocations": len(live),
        "live_requested_bytes": sum(a.size for a in live),
    }
    for name, key in group.items():
        c: Counter[str] = Counter()
        for a in live:
            c[key(a.size) if name == "by_size_class" else key(a)] += a.size
        out[name] = dict(sorted(c.items(), key=lambda kv: -kv[1]))
    if any(a.category for a in live if a.event >= 0):
        c = Counter()
        for a in live:
            c[a.category or "other"] += a.size
        out["by_category"] = dict(sorted(c.items(), key=lambda kv: -kv[1]))
    return out


def _window(allocs: list[Alloc], step: str | None, events: int) -> tuple[int, int] | None:
    if step is None:
        return None
    mine = [a.event for a in allocs if a.step == step and a.event >= 0 and a.phase != "setup"]
    if not mine:
        raise ValueError(f"the prediction has no allocations of step {step!r}")
    later = [a.event for a in allocs if a.event > mine[-1] and a.step not in (step, None)]
    return mine[0], (later[0] if later else events)


def diff_snapshots(
    real: Snapshot, predicted: Snapshot, config: DiffConfig | None = None
) -> dict[str, Any]:
    """The diff document (module docstring); ``identical`` when nothing differs."""
    cfg = config or DiffConfig()
    ra, pa_all = allocations(real), allocations(predicted)
    window = _window(pa_all, cfg.step, len(predicted.trace))
    pa = [a for a in pa_all if cfg.step is None or a.event < 0 or a.phase == "setup"
          or window[0] <= a.event < window[1]]  # fmt: skip
    phases = _phases(ra, pa)
    order = [p for p in (*PHASES, NO_PHASE) if any(a.phase == p for a in (*ra, *pa))]
    per_phase = []
    for p in order:
        table = _sizes([a for a in ra if a.phase == p], [a for a in pa if a.phase == p], cfg.top)
        per_phase.append({"phase": p} | table)
    overall = _sizes(ra, pa, cfg.top)
    peaks = {"real": _peak(real, ra, None), "predicted": _peak(predicted, pa, window)}
    differing = sum(t["only_real_sizes"] + t["only_predicted_sizes"] + t["count_differs_sizes"]
                    for t in per_phase)  # fmt: skip
    same_peak = all(
        peaks["real"][k] == peaks["predicted"][k]
        for k in ("allocated_bytes", "peak_reserved_bytes", "by_size_class", "by_phase")
    )
    return {
        "real": _side(real, ra),
        "predicted": _side(predicted, pa) | {"step": cfg.step},
        "phases_from": phases,
        "identical": differing == 0 and same_peak,
        "differing_sizes": differing,
        "phases": per_phase,
        "sizes": overall,
        "peak": peaks,
    }


def _side(snap: Snapshot, allocs: list[Alloc]) -> dict[str, Any]:
    before = [a for a in allocs if a.event < 0]
    return {
        "file": snap.source,
        "device": snap.device,
        "events": len(snap.trace),
        "allocs": len(allocs) - len(before),
        "blocks_before_recording": len(before),
        "bytes_before_recording": sum(a.size for a in before),
        "frames": any(a.where for a in allocs),
    }
