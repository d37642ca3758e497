"""What a snapshot must satisfy before it is replayed: sane sizes, geometry, no double frees.

* **Sizes**: no allocation, segment, block, mapping or OOM request larger than
  ``LoadLimits.max_size_bytes`` (1 TiB by default, beyond any single device's memory),
  and no address range past 2**64 (a CUDA pointer is 64-bit).
* **Geometry** (the dump's ``segments``, per device): every block lies inside its segment,
  the blocks of a segment do not overlap, and segments do not overlap each other.
* **Frees** (each device's trace): a ``free_requested`` / ``free_completed`` of an address
  that is not allocated, after the trace has already shown it allocated or freed, is a
  double free. (The first event at an address may be a free: that block was allocated
  before recording began.) An ``alloc`` at an address that is still allocated is refused
  too. Before these checks the replay skipped a double free silently in both passes: the
  second free found no live block and did nothing. With ``tolerate_double_free`` it still
  does, and the events are listed.

Every error names the entry (segment ``k``, block ``j``, trace event ``i`` of device ``d``).
"""

from __future__ import annotations

from typing import Any

from memgnn.predictor.snapshot.unpickle import LoadLimits, SnapshotError

__all__ = ["check_geometry", "check_sizes", "double_frees"]

_ADDR_LIMIT = 1 << 64
_SIZED = (
    "alloc",
    "free_requested",
    "free_completed",
    "segment_alloc",
    "segment_free",
    "segment_map",
    "segment_unmap",
)


def _fmt(n: int) -> str:
    return f"{n} B (2^{n.bit_length() - 1}+)" if n >= 1 << 40 else f"{n} B"


def _range_ok(addr: int, size: int, limit: int) -> str | None:
    if size > limit:
        return f"size {_fmt(size)} is beyond any device (LoadLimits.max_size_bytes={limit})"
    if addr + size > _ADDR_LIMIT:
        return f"range {addr:#x}+{size} runs past the 64-bit address space"
    return None


def check_sizes(traces: list[list[dict[str, Any]]], limits: LoadLimits, what: str) -> None:
    """Every event's size (and address range) is one a device could hold."""
    limit = limits.max_size_bytes
    for d, trace in enumerate(traces):
        for i, ev in enumerate(trace):
            act = ev["action"]
            if act in _SIZED:
                bad = _range_ok(ev["addr"], ev["size"], limit)
            elif act == "oom" and isinstance(ev.get("size"), int) and ev["size"] > limit:
                bad = f"request {_fmt(ev['size'])} is beyond any device"
            else:
                bad = None
            if bad:
                raise SnapshotError(f"{what}: device {d} trace event {i} ({act}): {bad}")


def check_geometry(segments: list[dict[str, Any]], limits: LoadLimits, what: str) -> None:
    """Blocks inside their segment and disjoint; segments disjoint per device."""
    spans: dict[Any, list[tuple[int, int, int]]] = {}
    for k, seg in enumerate(segments):
        base, size = seg["address"], seg["total_size"]
        bad = _range_ok(base, size, limits.max_size_bytes)
        if bad:
            raise SnapshotError(f"{what}: segment {k} at {base:#x}: {bad}")
        end, prev_end = base + size, base
        for j, b in sorted(enumerate(seg.get("blocks", ())), key=lambda x: x[1]["address"]):
            a, s = b["address"], b["size"]
            if a < base or a + s > end:
                raise SnapshotError(
                    f"{what}: segment {k} block {j} [{a:#x}, +{s}) runs past its segment "
                    f"[{base:#x}, +{size})"
                )
            if a < prev_end:
                raise SnapshotError(
                    f"{what}: segment {k} block {j} at {a:#x} overlaps the block before it"
                )
            prev_end = a + s
        spans.setdefault(seg.get("device", 0), []).append((base, end, k))
    for device, items in spans.items():
        items.sort()
        for (a0, e0, k0), (a1, _, k1) in zip(items, items[1:]):
            if a1 < e0:
                raise SnapshotError(
                    f"{what}: segments {k0} and {k1} of device {device} overlap "
                    f"([{a0:#x}, {e0:#x}) and {a1:#x})"
                )


def double_frees(
    trace: list[dict[str, Any]], device: int, what: str, *, tolerate: bool
) -> list[int]:
    """Indices of double frees in ``trace`` (module docstring); raises unless ``tolerate``.
    An ``alloc`` over a live block is always refused."""
    state: dict[int, str] = {}  # addr -> "live" | "pending" (free requested) | "free"
    found: list[int] = []
    for i, ev in enumerate(trace):
        act = ev["action"]
        if act not in ("alloc", "free_requested", "free_completed"):
            continue
        addr = ev["addr"]
        now = state.get(addr)
        if act == "alloc":
            if now in ("live", "pending"):
                raise SnapshotError(
                    f"{what}: device {device} trace event {i} (alloc) at {addr:#x}: that "
                    "address is still allocated (its free was never completed)"
                )
            state[addr] = "live"
        elif act == "free_requested":
            if now in ("pending", "free"):
                found.append(i)
            else:
                state[addr] = "pending"
        elif now == "free" or now == "live":  # free_completed without a free_requested
            found.append(i)
        else:  # pending, or the first event here (its request predates the recording)
            state[addr] = "free"
    if found and not tolerate:
        i = found[0]
        raise SnapshotError(
            f"{what}: device {device} trace event {i} ({trace[i]['action']}) frees "
            f"{trace[i]['addr']:#x}, which is not allocated: a double free ({len(found)} in "
            "this trace); pass --tolerate-double-free to skip them as the replay did before"
        )
    return found
