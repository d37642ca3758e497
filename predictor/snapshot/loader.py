"""Safe loading of ``torch.cuda.memory._dump_snapshot()`` pickles (plain or gzip).

A snapshot is plain Python data (dict, list, str, int, float, bool, None, tuple), so it
is read with an :class:`pickle.Unpickler` whose ``find_class`` always raises: nothing a
file names is ever imported or called. The decompressed size and the nesting depth are
bounded, and the result is checked to be a snapshot (a dict with ``segments`` and
``device_traces``; the old list-only format, a bare list of segments, is refused with an
error that says so).
"""

from __future__ import annotations

import gzip
import io
import logging
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memgnn.predictor.errors import UserError

logger = logging.getLogger(__name__)

__all__ = [
    "LoadLimits",
    "Snapshot",
    "SnapshotError",
    "load_snapshot",
    "loads_snapshot",
    "read_snapshot_data",
    "snapshot_from_dict",
]

_GZIP_MAGIC = b"\x1f\x8b"
_PLAIN = (str, int, float, bool, bytes, type(None))


class SnapshotError(UserError):
    """The file is not a snapshot this loader accepts (the message says why)."""


@dataclass(kw_only=True, slots=True)
class LoadLimits:
    """Bounds on what a snapshot file may make the loader do."""

    max_bytes: int = 1 << 30  # decompressed pickle bytes
    max_depth: int = 64  # nesting of containers

    def __post_init__(self) -> None:
        if self.max_bytes < 1:
            raise ValueError(f"max_bytes must be >= 1, got {self.max_bytes}")
        if self.max_depth < 4:
            raise ValueError(f"max_depth must be >= 4, got {self.max_depth}")


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


class _DataOnlyUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):  # noqa: ARG002 - refuse every global
        raise SnapshotError(
            f"refusing to load {module}.{name}: a snapshot holds only plain data, and this "
            "file asks to import code"
        )

    def persistent_load(self, pid):  # noqa: ARG002
        raise SnapshotError("refusing a pickle with persistent ids (not a snapshot)")


def _read_limited(stream: io.BufferedIOBase, limit: int, what: str) -> bytes:
    data = stream.read(limit + 1)
    if len(data) > limit:
        raise SnapshotError(f"{what} is larger than the limit of {limit} bytes (decompressed)")
    return data


def _decompress(raw: bytes, limit: int, what: str) -> bytes:
    if not raw.startswith(_GZIP_MAGIC):
        if len(raw) > limit:
            raise SnapshotError(f"{what} is larger than the limit of {limit} bytes")
        return raw
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(raw)) as gz:
            return _read_limited(gz, limit, what)
    except (OSError, EOFError) as exc:
        raise SnapshotError(f"{what} is not a readable gzip file: {exc}") from None


def _check_depth(obj: Any, max_depth: int, what: str) -> None:
    """Iterative walk: every value is plain data and containers nest <= max_depth."""
    stack: list[tuple[Any, int]] = [(obj, 1)]
    seen: set[int] = set()  # shared sub-objects (pickle memo) are walked once
    while stack:
        value, depth = stack.pop()
        if isinstance(value, _PLAIN):
            continue
        if depth > max_depth:
            raise SnapshotError(f"{what} nests deeper than {max_depth} levels")
        if id(value) in seen:
            continue
        seen.add(id(value))
        if isinstance(value, dict):
            stack.extend((v, depth + 1) for v in value.values())
            stack.extend((k, depth + 1) for k in value.keys())
        elif isinstance(value, (list, tuple, set, frozenset)):
            stack.extend((v, depth + 1) for v in value)
        else:  # pragma: no cover - the unpickler builds nothing else without find_class
            raise SnapshotError(f"{what} holds a {type(value).__name__}, not plain data")


def _unpickle(data: bytes, limits: LoadLimits, what: str) -> Any:
    # Depth is checked after loading; the unpickler itself is bounded by max_bytes, and
    # Python's own recursion limit stops pathological nesting while building.
    try:
        obj = _DataOnlyUnpickler(io.BytesIO(data)).load()
    except SnapshotError:
        raise
    except RecursionError:
        raise SnapshotError(f"{what} nests too deeply to load") from None
    except MemoryError:
        raise SnapshotError(f"{what} asks for more memory than is available") from None
    except Exception as exc:  # any malformed pickle (UnpicklingError, EOF, KeyError, ...)
        raise SnapshotError(f"{what} is not a readable pickle: {exc!r}") from None
    _check_depth(obj, limits.max_depth, what)
    return obj


def _as_snapshot(obj: Any, device: int | None, what: str) -> Snapshot:
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
    used = [d for d, t in enumerate(traces) if t]
    if device is None:
        device = used[0] if used else 0
    if not 0 <= device < max(len(traces), 1):
        raise SnapshotError(f"{what}: no trace for device {device} ({len(traces)} devices)")
    trace = traces[device] if traces else []
    for i, ev in enumerate(trace):
        _check_event(ev, i, what)
    for k, seg in enumerate(segments):
        _check_segment(seg, k, what)
    settings = obj.get("allocator_settings")
    meta = obj.get("memgnn")
    return Snapshot(
        memgnn=meta if isinstance(meta, dict) else None,
        segments=[s for s in segments if s.get("device", device) == device],
        trace=trace,
        device=device,
        allocator_settings=settings if isinstance(settings, dict) else None,
        source=what,
        other_devices=[d for d in used if d != device],
    )


_MEMORY_ACTIONS = ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free")


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_event(ev: Any, i: int, what: str) -> None:
    if not isinstance(ev, dict) or not isinstance(ev.get("action"), str):
        raise SnapshotError(f"{what}: trace event {i} is not a dict with an 'action'")
    if ev["action"] in _MEMORY_ACTIONS:
        if not (_is_count(ev.get("addr")) and _is_count(ev.get("size"))):
            raise SnapshotError(
                f"{what}: trace event {i} ({ev['action']}) needs non-negative int addr and size"
            )
        if not isinstance(ev.get("stream", 0), int):
            raise SnapshotError(f"{what}: trace event {i} has a non-int stream")


def _check_segment(seg: dict, k: int, what: str) -> None:
    if not (_is_count(seg.get("address")) and _is_count(seg.get("total_size"))):
        raise SnapshotError(f"{what}: segment {k} needs int address and total_size")
    blocks = seg.get("blocks", [])
    if not isinstance(blocks, list) or not all(
        isinstance(b, dict) and _is_count(b.get("address")) and _is_count(b.get("size"))
        for b in blocks
    ):
        raise SnapshotError(f"{what}: segment {k} blocks need int address and size")


def loads_snapshot(
    raw: bytes, *, device: int | None = None, limits: LoadLimits | None = None, what: str = ""
) -> Snapshot:
    """Parse snapshot bytes (pickle, optionally gzip); raises :class:`SnapshotError`."""
    limits = limits or LoadLimits()
    what = what or "snapshot"
    obj = _unpickle(_decompress(raw, limits.max_bytes, what), limits, what)
    return _as_snapshot(obj, device, what)


def snapshot_from_dict(obj: Any, *, device: int | None = None, what: str = "") -> Snapshot:
    """Check an in-memory snapshot dict (e.g. from :mod:`predictor.snapshot.export`)."""
    return _as_snapshot(obj, device, what or "snapshot")


def _read_file(path: Path, limits: LoadLimits) -> bytes:
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(2)
            if head != _GZIP_MAGIC and size > limits.max_bytes:
                raise SnapshotError(f"{path} is larger than the limit of {limits.max_bytes} bytes")
            # gzip input is bounded by the decompressed limit; the compressed file is smaller.
            return head + f.read(limits.max_bytes + 1)
    except OSError as exc:
        raise SnapshotError(f"cannot read snapshot {path}: {exc.strerror or exc}") from None


def read_snapshot_data(path: str | Path, *, limits: LoadLimits | None = None) -> dict[str, Any]:
    """The raw snapshot dict of a file (checked as :func:`load_snapshot` does), e.g. to
    add a key and write it back."""
    limits = limits or LoadLimits()
    raw = _read_file(Path(path), limits)
    obj = _unpickle(_decompress(raw, limits.max_bytes, str(path)), limits, str(path))
    _as_snapshot(obj, None, str(path))
    return obj


def load_snapshot(
    path: str | Path, *, device: int | None = None, limits: LoadLimits | None = None
) -> Snapshot:
    """Load a ``_dump_snapshot`` file safely (see the module docstring)."""
    limits = limits or LoadLimits()
    path = Path(path)
    snap = loads_snapshot(_read_file(path, limits), device=device, limits=limits, what=str(path))
    logger.debug("loaded %s: %d segments, %d events", path, len(snap.segments), len(snap.trace))
    return snap
