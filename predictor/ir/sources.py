"""The line of the user's code that made each recorded op (`memgnn explain`'s file:line).

`SourceFinder` walks the Python stack at an op's dispatch outwards, past PyTorch, the
standard library and memgnn's own machinery (the recorder, the capture, the emulated
libraries), to the first other frame: the model's code (a zoo model, transformers'
`modeling_*.py`, peft's layer, a `py:` factory) or the training loop (`capture/step.py`,
where the walk stops: the autograd engine's backward ops have no model line of their own
and are named by the loop's `loss.backward()` line). Paths are shown relative to the
import root they were found under (`transformers/models/gpt2/modeling_gpt2.py:123`), so a
graph names the same lines on every machine. Each code object is judged once; the walk
costs a dict lookup per frame (`benchmarks/explain_capture_cost.py` measures it).
"""

from __future__ import annotations

import contextlib
import os
import sys
from types import CodeType, FrameType
from typing import Any

import torch

__all__ = ["SourceFinder", "display_path", "node_sources", "storage_shapes", "store_sources"]

_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the predictor package
_SKIP_DIRS = tuple(
    os.path.join(d, "")
    for d in (
        os.path.dirname(os.path.abspath(torch.__file__)),
        os.path.dirname(os.path.abspath(contextlib.__file__)),  # the standard library
        *(os.path.join(_HERE, sub) for sub in ("ir", "capture", "emulate", "sim", "memory")),
    )
)
_STOP = os.path.join(_HERE, "capture", "step.py")  # the training loop: the walk ends here
_SKIP, _KEEP, _END = 0, 1, 2


def display_path(filename: str) -> str:
    """`filename` relative to the longest import root holding it (memgnn's own files as
    `memgnn/predictor/...`); as given where none does."""
    path = os.path.abspath(filename)
    if path.startswith(os.path.join(_HERE, "")):
        return "memgnn/predictor/" + os.path.relpath(path, _HERE)
    best = ""
    for root in sys.path:
        root = os.path.join(os.path.abspath(root or os.getcwd()), "")
        if path.startswith(root) and len(root) > len(best):
            best = root
    return path[len(best) :] if best else path


class SourceFinder:
    """`find()` -> "path:line" of the innermost user frame of the running op ("" for none)."""

    def __init__(self) -> None:
        self._kind: dict[CodeType, tuple[int, str]] = {}

    def _judge(self, code: CodeType) -> tuple[int, str]:
        name = code.co_filename
        path = os.path.abspath(name) if not name.startswith("<") else name
        if path == _STOP:
            kind = _END
        elif path.startswith("<") or path.startswith(_SKIP_DIRS):
            kind = _SKIP
        else:
            kind = _KEEP
        got = self._kind[code] = (kind, display_path(path) if kind != _SKIP else "")
        return got

    def find(self, frame: FrameType | None = None) -> str:
        f = frame if frame is not None else sys._getframe(1)
        kinds = self._kind
        while f is not None:
            code = f.f_code
            got = kinds.get(code) or self._judge(code)
            if got[0] != _SKIP:
                return f"{got[1]}:{f.f_lineno}"
            f = f.f_back
        return ""


def store_sources(graph: Any) -> None:
    """Move the paths' `source` node columns into `graph.meta["sources"]` (`table`: each
    distinct file:line once; `paths`: per path, each node's index into it), and the
    `shape` storage columns (comma-separated size formulas) into `meta["shapes"]` alike,
    so they travel with the graph but do not change its id (they say where, not how much)."""
    for table, column, key in (("nodes", "source", "sources"), ("storages", "shape", "shapes")):
        cols = [getattr(p, table).pop(column, None) for p in graph.paths]
        if any(c is None for c in cols):
            continue
        index: dict[str, int] = {}
        paths = [[index.setdefault(v, len(index)) for v in col] for col in cols]
        graph.meta[key] = {"table": list(index), "paths": paths}


def node_sources(graph: Any, path: int) -> list[str] | None:
    """Each node's file:line on `path` ("" for none), None where the graph has none (a
    capture without them, or one from before they were recorded)."""
    return _column(graph, "sources", path, graph.paths[path].num_nodes)


def storage_shapes(graph: Any, path: int) -> list[str] | None:
    """Each storage's shape on `path` as comma-separated size formulas ("" unknown)."""
    return _column(graph, "shapes", path, graph.paths[path].num_storages)


def _column(graph: Any, key: str, path: int, n: int) -> list[str] | None:
    got = graph.meta.get(key)
    if not isinstance(got, dict):
        return None
    try:
        table, idx = got["table"], got["paths"][path]
        out = [table[i] for i in idx]
    except (KeyError, IndexError, TypeError):
        return None
    return out if len(out) == n else None
