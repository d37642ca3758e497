"""A replay trace as int64 arrays (numba-free, so the simulator can build one cheaply)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["OP_ALLOC", "OP_FREE", "OP_MARK", "OP_EMPTY_CACHE", "EventArrays", "encode_events"]

OP_ALLOC, OP_FREE, OP_MARK, OP_EMPTY_CACHE = 0, 1, 2, 3


@dataclass(kw_only=True, slots=True)
class EventArrays:
    """A trace as int64 arrays: op (0 alloc, 1 free, 2 mark), key, nbytes, stream.

    Keys are dense ids ``0 .. n_keys-1``; a mark's key is its index into ``marks``."""

    op: np.ndarray
    key: np.ndarray
    nbytes: np.ndarray
    stream: np.ndarray
    n_keys: int
    marks: list[Any] = field(default_factory=list)

    def __post_init__(self) -> None:
        n = len(self.op)
        for name in ("op", "key", "nbytes", "stream"):
            a = np.ascontiguousarray(getattr(self, name), dtype=np.int64)
            if a.ndim != 1 or len(a) != n:
                raise ValueError(f"events: {name} must be 1-d of length {n}, got {a.shape}")
            setattr(self, name, a)
        if n and (self.nbytes.min() < 0):
            i = int(np.argmax(self.nbytes < 0))
            raise ValueError(f"event {i}: negative allocation size {int(self.nbytes[i])}")
        if n and (self.op.min() < 0 or self.op.max() > OP_EMPTY_CACHE):
            i = int(np.argmax((self.op < 0) | (self.op > OP_EMPTY_CACHE)))
            raise ValueError(f"event {i}: unknown op code {int(self.op[i])}")
        data = (self.op == OP_ALLOC) | (self.op == OP_FREE)
        if data.any() and (self.key[data].min() < 0 or self.key[data].max() >= self.n_keys):
            raise ValueError(f"events: keys must lie in [0, {self.n_keys})")
        m = self.op == OP_MARK
        if m.any() and (self.key[m].min() < 0 or self.key[m].max() >= len(self.marks)):
            raise ValueError(f"events: mark keys must lie in [0, {len(self.marks)})")


def encode_events(events: Iterable[Sequence], held: Sequence[Any] = ()) -> EventArrays:
    """("alloc", key, nbytes[, stream]) / ("free", key, ...) / ("mark", *label) /
    ("empty_cache",) tuples; ``held`` keys (of a seeded state) get the first ids."""
    ops: list[int] = []
    keys: list[int] = []
    sizes: list[int] = []
    streams: list[int] = []
    ids: dict[Any, int] = {k: i for i, k in enumerate(held)}
    marks: list[Any] = []
    for i, ev in enumerate(events):
        kind = ev[0]
        if kind == "mark":
            ops.append(OP_MARK)
            keys.append(len(marks))
            marks.append(tuple(ev[1:]))
            sizes.append(0)
            streams.append(0)
            continue
        if kind == "empty_cache":
            ops.append(OP_EMPTY_CACHE)
            keys.append(0)
            sizes.append(0)
            streams.append(0)
            continue
        if kind not in ("alloc", "free"):
            raise ValueError(f"event {i}: unknown op {kind!r}")
        ops.append(OP_ALLOC if kind == "alloc" else OP_FREE)
        keys.append(ids.setdefault(ev[1], len(ids)))
        sizes.append(int(ev[2]) if kind == "alloc" else 0)
        streams.append(int(ev[3]) if len(ev) > 3 else 0)
    return EventArrays(
        op=np.array(ops, dtype=np.int64),
        key=np.array(keys, dtype=np.int64),
        nbytes=np.array(sizes, dtype=np.int64),
        stream=np.array(streams, dtype=np.int64),
        n_keys=len(ids),
        marks=marks,
    )
