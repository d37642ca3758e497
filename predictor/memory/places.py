"""Memory off the device: the host (pinned, pageable) and unified-memory peaks of a step.

A captured storage that an offloading library keeps off the GPU (`vocab.PLACES`) counts
nothing in the CUDA caching allocator (its `nbytes` is 0: every device figure, sweep,
simulator, GNN, leaves it out) and its bytes at its place in `place_nbytes`. This module
sweeps those bytes with the same liveness machinery: each place's peak over the step, the
host's (pinned + pageable together) and what lives on the host at that peak, by category.
The figures go into an answer's `breakdown` next to the device peak, each its own number:

- `host_pinned_peak_bytes`: page-locked host memory (`pin_memory=True` buffers);
- `host_pageable_peak_bytes`: ordinary host memory (an optimizer's state on the CPU);
- `host_peak_bytes`: the peak of the two together, `host_categories` what it holds;
- `managed_peak_bytes`: CUDA unified memory (bitsandbytes' paged optimizer states): not
  in the allocator's allocated or reserved bytes; on the device while resident, so an
  answer's device total counts it (the driver pages it out only under pressure).

On a CPU device the host is the same RAM as the "device": the figures stay separate (the
peak counts device-place storages, as on a GPU) and the breakdown says so.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from memgnn.predictor.ir.graph import PathGraph, StepGraph
from memgnn.predictor.ir.vocab import CATEGORIES, PLACES, category_bytes

__all__ = ["place_breakdown", "place_peaks"]

_PINNED, _PAGEABLE, _MANAGED = (PLACES.index(p) for p in ("pinned", "pageable", "managed"))
CPU_NOTE = (
    "a CPU device: the host figures are in the same RAM as the peak, which counts only "
    "storages not offloaded"
)


def _curves(p: PathGraph, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(bytes alive before the first node [K], live bytes after each node's allocations
    [K, N]) for K byte assignments of a path's storages (`analytic.live_curves`' rule:
    a storage freed after node i still counts at node i)."""
    alloc, free = p.array("storages", "alloc"), p.array("storages", "free")
    n = p.num_nodes
    initial = rows[:, alloc < 0].sum(axis=1)
    added = np.zeros((len(rows), n + 1), dtype=np.int64)
    made = alloc >= 0
    for k, row in enumerate(rows):
        added[k] += np.bincount(alloc[made] + 1, weights=row[made], minlength=n + 1).astype(
            np.int64
        )
        gone = free >= 0
        added[k] -= np.bincount(free[gone] + 2, weights=row[gone], minlength=n + 2)[: n + 1].astype(
            np.int64
        )
    live = np.cumsum(added, axis=1)[:, 1:] + initial[:, None]
    return initial, live


def _peak(initial: np.ndarray, live: np.ndarray) -> np.ndarray:
    """[K] peak of each curve (the state before the first node included)."""
    if live.shape[1] == 0:
        return initial
    return np.maximum(initial, live.max(axis=1))


def place_peaks(graph: StepGraph, path: int, resolved: dict[str, int]) -> dict[str, Any]:
    """The off-device figures of one path (see the module docstring); zeros for a graph
    whose storages all live on the device."""
    codes, nbytes = graph.place_bytes(path, resolved)
    host = np.where((codes == _PINNED) | (codes == _PAGEABLE), nbytes, 0)
    rows = np.stack(
        [
            np.where(codes == _PINNED, nbytes, 0),
            np.where(codes == _PAGEABLE, nbytes, 0),
            host,
            np.where(codes == _MANAGED, nbytes, 0),
        ]
    )
    initial, live = _curves(graph.paths[path], rows)
    peaks = _peak(initial, live)
    at = -1 if live.shape[1] == 0 or initial[2] >= live[2].max() else int(np.argmax(live[2]))
    return {
        "host_pinned_peak_bytes": int(peaks[0]),
        "host_pageable_peak_bytes": int(peaks[1]),
        "host_peak_bytes": int(peaks[2]),
        "managed_peak_bytes": int(peaks[3]),
        "host_categories": _categories_at(graph, path, host, at),
    }


def _categories_at(graph: StepGraph, path: int, nbytes: np.ndarray, node: int) -> dict[str, int]:
    p = graph.paths[path]
    alloc, free = p.array("storages", "alloc"), p.array("storages", "free")
    cat = p.array("storages", "category")
    alive = alloc < 0 if node < 0 else (alloc <= node) & ((free < 0) | (free >= node))
    per = np.bincount(cat[alive], weights=nbytes[alive], minlength=len(CATEGORIES))
    return {c: v for c, v in category_bytes(per).items() if v}


def place_breakdown(
    graph: StepGraph, path: int, resolved: dict[str, int], *, gpu: bool
) -> dict[str, Any]:
    """The breakdown entries of a graph with off-device storages (empty for one without,
    so answers without offloading keep their form)."""
    if not graph.has_places:
        return {}
    out = place_peaks(graph, path, resolved)
    if not gpu:
        out["host_note"] = CPU_NOTE
    return out
