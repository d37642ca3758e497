"""Safe loading of ``torch.cuda.memory._dump_snapshot()`` pickles (plain or gzip).

A snapshot is plain Python data (dict, list, str, int, float, bool, None, tuple). It is
read by :mod:`predictor.snapshot.unpickle`, which runs only the opcodes of plain data
(nothing a file names is ever imported or called) and counts decompressed bytes, values,
object bytes and nesting while it builds, stopping at the first limit of
:class:`LoadLimits`. The result is then checked to be a snapshot (a dict with
``segments`` and ``device_traces``; the old list-only format, a bare list of segments, is
refused with an error that says so), every event and segment to have the fields the
replay reads, and :mod:`predictor.snapshot.checks` refuses absurd sizes, blocks outside
their segment, overlapping segments and double frees.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memgnn.predictor.snapshot.checks import check_geometry, check_sizes, double_frees
from memgnn.predictor.snapshot.unpickle import GZIP_MAGIC, LoadLimits, SnapshotError, bounded_load

logger = logging.getLogger(__name__)

__all__ = [
    "LoadLimits",
    "Snapshot",
    "SnapshotError",
    "load_snapshot",
    "load_snapshots",
    "loads_snapshot",
    "read_snapshot_data",
    "snapshot_from_dict",
]


@dataclass(kw_only=True, slots=True)
class Snapshot:
    """The parts of a snapshot the replay uses; ``device`` picks the trace."""

    segments: list[dict[str, Any]]
    trace: list[dict[str, Any]]
    device: int
    allocator_settings: dict[str, Any] | None = None
    source: str = ""
    other_devices: list[int] = field(default_factory=list)
    memgnn: dict[str, Any] | None = None  # what a memgnn export was made from (model, sizes)
    double_frees: list[int] = field(default_factory=list)  # tolerated; the replay skips them
    load_work: dict[str, int] | None = None  # bytes, objects, memory_bytes, depth (loader)


def _unpickle(raw: bytes, limits: LoadLimits, what: str) -> tuple[Any, dict[str, Any]]:
    return bounded_load(raw, limits, what)


def _document(obj: Any, what: str) -> tuple[list[dict], list[list[dict]]]:
    """The checked ``segments`` and ``device_traces`` of a snapshot dict."""
    if isinstance(obj, list):
        raise SnapshotError(
            f"{what} is a bare list (the old _snapshot() format with segments only, or not "
            "a snapshot): replay needs device_traces; record with "
            "torch.cuda.memory._record_memory_history() and save with _dump_snapshot()"
        )
    if not isinstance(obj, dict) or "segments" not in obj or "device_traces" not in obj:
        keys = sorted(map(str, obj))[:8] if isinstance(obj, dict) else type(obj).__name__
        raise SnapshotError(
            f"{what} is not a CUDA memory snapshot (need a dict with 'segments' and "
            f"'device_traces', got {keys})"
        )
    segments, traces = obj["segments"], obj["device_traces"]
    if not isinstance(segments, list) or not all(isinstance(s, dict) for s in segments):
        raise SnapshotError(f"{what}: 'segments' must be a list of dicts")
    if not isinstance(traces, list) or not all(isinstance(t, list) for t in traces):
        raise SnapshotError(f"{what}: 'device_traces' must be a list of lists (one per device)")
    for d, trace in enumerate(traces):
        for i, ev in enumerate(trace):
            _check_event(ev, i, d, what)
    for k, seg in enumerate(segments):
        _check_segment(seg, k, what)
    return segments, traces


def _as_snapshots(
    obj: Any,
    devices: list[int] | None,
    what: str,
    limits: LoadLimits,
    tolerate_double_free: bool,
) -> list[Snapshot]:
    """One :class:`Snapshot` per device in ``devices`` (None: every device with a trace,
    or device 0 when none has one)."""
    segments, traces = _document(obj, what)
    check_sizes(traces, limits, what)
    check_geometry(segments, limits, what)
    used = [d for d, t in enumerate(traces) if t]
    if devices is None:
        devices = used or [0]
    settings = obj.get("allocator_settings")
    meta = obj.get("memgnn")
    out = []
    for device in devices:
        if not 0 <= device < max(len(traces), 1):
            raise SnapshotError(f"{what}: no trace for device {device} ({len(traces)} devices)")
        trace = traces[device] if traces else []
        frees = double_frees(trace, device, what, tolerate=tolerate_double_free)
        out.append(
            Snapshot(
                memgnn=meta if isinstance(meta, dict) else None,
                segments=[s for s in segments if s.get("device", device) == device],
                trace=trace,
                device=device,
                allocator_settings=settings if isinstance(settings, dict) else None,
                source=what,
                other_devices=[d for d in used if d != device],
                double_frees=frees,
            )
        )
    return out


_MEMORY_ACTIONS = (
    "alloc",
    "free_requested",
    "free_completed",
    "segment_alloc",
    "segment_free",
    "segment_map",
    "segment_unmap",
)


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_event(ev: Any, i: int, device: int, what: str) -> None:
    where = f"{what}: trace event {i}" + (f" of device {device}" if device else "")
    if not isinstance(ev, dict) or not isinstance(ev.get("action"), str):
        raise SnapshotError(f"{where} is not a dict with an 'action'")
    act = ev["action"]
    if act in _MEMORY_ACTIONS:
        if not (_is_count(ev.get("addr")) and _is_count(ev.get("size"))):
            raise SnapshotError(f"{where} ({act}) needs non-negative int addr and size")
    elif act == "oom":  # PyTorch records size and device_free (memgnn's old exports: addr)
        if not _is_count(ev.get("size")) or not _is_count(ev.get("device_free", 0)):
            raise SnapshotError(f"{where} (oom) needs non-negative int size and device_free")
    if not isinstance(ev.get("stream", 0), int):
        raise SnapshotError(f"{where} has a non-int stream")


def _check_segment(seg: dict, k: int, what: str) -> None:
    if not (_is_count(seg.get("address")) and _is_count(seg.get("total_size"))):
        raise SnapshotError(f"{what}: segment {k} needs int address and total_size")
    if not isinstance(seg.get("device", 0), int):
        raise SnapshotError(f"{what}: segment {k} has a non-int device")
    blocks = seg.get("blocks", [])
    if not isinstance(blocks, list) or not all(
        isinstance(b, dict) and _is_count(b.get("address")) and _is_count(b.get("size"))
        for b in blocks
    ):
        raise SnapshotError(f"{what}: segment {k} blocks need int address and size")


def _loads(
    raw: bytes,
    devices: list[int] | None,
    limits: LoadLimits | None,
    what: str,
    tolerate_double_free: bool,
) -> list[Snapshot]:
    limits = limits or LoadLimits()
    obj, work = _unpickle(raw, limits, what)
    snaps = _as_snapshots(obj, devices, what, limits, tolerate_double_free)
    for snap in snaps:
        snap.load_work = work
    return snaps


def loads_snapshot(
    raw: bytes,
    *,
    device: int | None = None,
    limits: LoadLimits | None = None,
    what: str = "",
    tolerate_double_free: bool = False,
) -> Snapshot:
    """Parse snapshot bytes (pickle, optionally gzip); raises :class:`SnapshotError`.
    ``device`` None: the first device with a trace."""
    what = what or "snapshot"
    if device is None:  # the first device with a trace
        snaps = _loads(raw, None, limits, what, tolerate_double_free)
        return snaps[0]
    return _loads(raw, [device], limits, what, tolerate_double_free)[0]


def snapshot_from_dict(obj: Any, *, device: int | None = None, what: str = "") -> Snapshot:
    """Check an in-memory snapshot dict (e.g. from :mod:`predictor.snapshot.export`)."""
    devices = None if device is None else [device]
    return _as_snapshots(obj, devices, what or "snapshot", LoadLimits(), False)[0]


def _read_file(path: Path, limits: LoadLimits) -> bytes:
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(2)
            if head != GZIP_MAGIC and size > limits.max_bytes:
                raise SnapshotError(
                    f"{path} is larger than max_bytes={limits.max_bytes} bytes "
                    "(LoadLimits.max_bytes)"
                )
            # gzip input is bounded by the decompressed limit; the compressed file is smaller.
            return head + f.read(limits.max_bytes + 1)
    except OSError as exc:
        raise SnapshotError(f"cannot read snapshot {path}: {exc.strerror or exc}") from None


def read_snapshot_data(path: str | Path, *, limits: LoadLimits | None = None) -> dict[str, Any]:
    """The raw snapshot dict of a file (checked as :func:`load_snapshot` does), e.g. to
    add a key and write it back."""
    limits = limits or LoadLimits()
    obj, _ = _unpickle(_read_file(Path(path), limits), limits, str(path))
    _as_snapshots(obj, None, str(path), limits, False)
    return obj


def load_snapshot(
    path: str | Path,
    *,
    device: int | None = None,
    limits: LoadLimits | None = None,
    tolerate_double_free: bool = False,
) -> Snapshot:
    """Load one device of a ``_dump_snapshot`` file safely (the module docstring);
    ``device`` None: the first device with a trace."""
    limits = limits or LoadLimits()
    path = Path(path)
    raw = _read_file(path, limits)
    snap = loads_snapshot(
        raw,
        device=device,
        limits=limits,
        what=str(path),
        tolerate_double_free=tolerate_double_free,
    )
    logger.debug("loaded %s: %d segments, %d events", path, len(snap.segments), len(snap.trace))
    return snap


def load_snapshots(
    path: str | Path, *, limits: LoadLimits | None = None, tolerate_double_free: bool = False
) -> list[Snapshot]:
    """Every device with a trace in a ``_dump_snapshot`` file (one unpickling)."""
    limits = limits or LoadLimits()
    path = Path(path)
    return _loads(_read_file(path, limits), None, limits, str(path), tolerate_double_free)
