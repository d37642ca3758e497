"""Turn a finished recorder into a columnar `PathGraph`, interning size expressions."""

from __future__ import annotations

from typing import Any

import torch
from memgnn.predictor.capture.branches import CaptureError
from memgnn.predictor.ir.expr import sympy_to_source
from memgnn.predictor.ir.graph import PathGraph
from memgnn.predictor.ir.recorder import CATEGORIES, PHASES, StepRecorder, live_categories
from memgnn.predictor.ir.vocab import PLACES


class ExprInterner:
    """Size expressions -> indices into one shared table of sources."""

    def __init__(self) -> None:
        self.sources: list[str] = []
        self._index: dict[str, int] = {}
        self._cache: dict[Any, str] = {}

    def source(self, value: Any, names: dict[Any, str], env: Any | None) -> str:
        if not isinstance(value, torch.SymInt):
            return str(int(value))
        expr = value.node.expr
        key = (expr, id(names))
        src = self._cache.get(key)
        if src is None:
            import sympy

            canonical = sympy.expand(env.replace(expr) if env is not None else expr)
            src = self._cache[key] = sympy_to_source(canonical, names)
        return src

    def add(self, value: Any, names: dict[Any, str], env: Any | None) -> int:
        src = self.source(value, names, env)
        idx = self._index.get(src)
        if idx is None:
            idx = self._index[src] = len(self.sources)
            self.sources.append(src)
        return idx


def path_from_recorder(
    rec: StepRecorder,
    conditions: list[dict[str, Any]],
    interner: ExprInterner,
    names: dict[Any, str],
    env: Any | None,
) -> PathGraph:
    live_categories(rec)
    phase_code = {p: i for i, p in enumerate(PHASES)}
    cat_code = {c: i for i, c in enumerate(CATEGORIES)}
    nodes: dict[str, list] = {k: [] for k in ("op", "phase", "step", "micro", "module")}
    nodes["scratch"] = []
    nodes["inputs"], nodes["outputs"] = [], []
    if rec.sources is not None:  # moved to the graph's meta by the capture (`ir.sources`)
        nodes["source"] = [n.source for n in rec.nodes]
    for n in rec.nodes:
        nodes["op"].append(n.op)
        nodes["phase"].append(phase_code[n.phase])
        nodes["step"].append(n.step)
        nodes["micro"].append(n.micro)
        nodes["module"].append(n.module)
        nodes["inputs"].append(list(n.inputs))
        nodes["outputs"].append(list(n.outputs))
        nodes["scratch"].append(interner.add(n.scratch, names, env))
    storages: dict[str, list] = {k: [] for k in ("nbytes", "dtype", "category", "alloc", "free")}
    for s in rec.storages:
        try:
            storages["nbytes"].append(interner.add(s.nbytes, names, env))
        except ValueError as exc:
            node = rec.nodes[s.alloc_node] if s.alloc_node >= 0 else None
            where = f"op {node.op!r} in module {node.module!r}" if node else "a pre-step tensor"
            raise CaptureError(
                f"size of a storage made by {where} is not capturable: {exc}"
            ) from None
        storages["dtype"].append(s.dtype)
        storages["category"].append(cat_code[s.category])
        storages["alloc"].append(s.alloc_node)
        storages["free"].append(-1 if s.free_node is None else s.free_node)
    if rec.sources is not None:  # moved to the graph's meta with the lines (`ir.sources`)
        storages["shape"] = [_shape(s.shape, interner, names, env) for s in rec.storages]
    if any(s.place != "device" for s in rec.storages):
        _split_places(rec, storages, interner)
    return PathGraph(conditions=conditions, nodes=nodes, storages=storages)


def _split_places(rec: StepRecorder, storages: dict[str, list], interner: ExprInterner) -> None:
    """Storages off the device: their bytes move from `nbytes` (the CUDA allocator's) to
    `place_nbytes`, with their `place` code (graph format version 2)."""
    zero = interner.add(0, {}, None)
    storages["place"], storages["place_nbytes"] = [], []
    for u, s in enumerate(rec.storages):
        code = PLACES.index(s.place)
        storages["place"].append(code)
        if code == 0:
            storages["place_nbytes"].append(zero)
        else:
            storages["place_nbytes"].append(storages["nbytes"][u])
            storages["nbytes"][u] = zero


def _shape(shape: Any, interner: ExprInterner, names: dict[Any, str], env: Any | None) -> str:
    """A storage's first tensor's shape as comma-separated size formulas ("" if unknown)."""
    if shape is None:
        return ""
    try:
        return ",".join(interner.source(d, names, env) for d in shape)
    except ValueError:  # a size not in the named symbols: shown as unknown
        return "?"
