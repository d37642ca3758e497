"""Who holds the peak: each live block named by module path, source line, aten op and
category, with why it is alive (`memgnn explain`'s tables).

A block is a storage of the captured step (`predictor.ir.graph`), a cuBLAS workspace or a
node's kernel scratch (`predictor.sim.live.PeakMoment`). A storage is named by the node
that allocated it: its op, its module (the innermost module whose forward ran it; a
backward or optimizer op runs in no module's forward and is named by the module of the
forward tensors or parameters it reads, see `node_modules`), its file:line
(`predictor.ir.sources`) and its shape (the first tensor seen on it, at these sizes).
Storages alive before the step (parameters, optimizer state made in an earlier step) are
named by the first node reading them.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from memgnn.predictor.ir.expr import ExprTable
from memgnn.predictor.ir.graph import PathGraph, StepGraph
from memgnn.predictor.ir.sources import node_sources, storage_shapes
from memgnn.predictor.ir.vocab import CATEGORIES, PHASES
from memgnn.predictor.sim.live import CUBLAS_KEYS, PeakMoment

__all__ = ["Block", "blocks_at", "group", "layer_pattern", "node_modules"]

ROOT = "<root>"
_INDEX = re.compile(r"\.\d+(?=\.|$)")
_FORWARD = PHASES.index("forward")
_BACKWARD = PHASES.index("backward")


@dataclass(kw_only=True, slots=True)
class Block:
    """One live block at the peak."""

    bytes: int
    category: str  # CATEGORIES, or cublas_workspace / kernel_scratch
    module: str  # "" where none is known
    source: str  # file:line; "" where none is known or recorded
    op: str  # the aten op that allocated it; "" for one alive before the step
    shape: list[int] | None
    dtype: str
    why: str
    storage: int | None = None  # its uid on the path (None: workspace, scratch)
    allocated_at: int = -1  # node (-1: before the step)
    freed_at: int = -1  # node after which it goes (-1: it outlives the step)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def node_modules(p: PathGraph) -> tuple[list[str], list[str]]:
    """(each node's module, each storage's module). Forward nodes keep the module recorded;
    a node recorded outside any module (backward, optimizer) is named by what it reads: a
    saved activation by the module whose forward computed from it (the op that saved it
    for backward), a parameter by the first module reading it; one reading gradients only
    (a bias's) by the node before it in the same phase (the same autograd node), else by
    its inputs' own modules; the most specific of the most common wins. A storage takes
    its allocating node's module, one alive before the step the first module reading it."""
    mods = list(p.nodes["module"])
    alloc, phase = p.storages["alloc"], p.nodes["phase"]
    smod = [""] * p.num_storages
    for u in range(p.num_storages):
        if alloc[u] < 0:
            named = (mods[i] for i in _readers(p, u) if mods[i] and mods[i] != ROOT)
            smod[u] = next(named, "") or next((mods[i] for i in _readers(p, u) if mods[i]), "")
    saver: dict[int, str] = {}  # a forward-made storage -> the one module reading it there
    for i, (ins, outs) in enumerate(zip(p.nodes["inputs"], p.nodes["outputs"])):
        if not mods[i]:
            named = [_saver(p, u, mods, saver) if alloc[u] >= 0 else smod[u] for u in ins]
            named = [m for m in named if m]
            if not named and i and phase[i - 1] == phase[i] and mods[i - 1]:
                named = [mods[i - 1]]  # reads only gradients: the autograd node's (a bias's)
            if not named:
                named = [smod[u] for u in ins if smod[u]]
            if named:
                counts = Counter(named)
                top = max(counts.values())
                mods[i] = max((m for m, c in counts.items() if c == top), key=len)
        for u in outs:
            if alloc[u] == i:
                smod[u] = mods[i]
    return mods, smod


def _saver(p: PathGraph, u: int, mods: list[str], memo: dict[int, str]) -> str:
    """The module whose forward computed from `u` (made by the step's input or forward):
    the one that did, or the innermost where they nest (a block and its own linear); ""
    where unrelated modules did (the root module counts only where no other did)."""
    got = memo.get(u)
    if got is None:
        a = p.storages["alloc"][u]
        if p.nodes["phase"][a] > _FORWARD:  # made in backward or later: saved by none
            got = ""
        else:
            makes = _makers(p)  # an op computing from it, not a view of it
            phase = p.nodes["phase"]
            readers = {mods[i] for i in _readers(p, u) if phase[i] == _FORWARD and makes[i]}
            readers.discard("")
            if len(readers) > 1:
                readers.discard(ROOT)
            deepest = max(readers, key=len, default="")
            # readers on one line of nesting (a block and its own linear): the innermost
            nested = all(deepest == r or deepest.startswith(r + ".") for r in readers)
            got = deepest if readers and nested else ""
        memo[u] = got
    return got


def _readers(p: PathGraph, u: int) -> list[int]:
    """The nodes reading storage `u`, in order (an index built once per path)."""

    def make() -> list[list[int]]:
        out: list[list[int]] = [[] for _ in range(p.num_storages)]
        for i, ins in enumerate(p.nodes["inputs"]):
            for v in ins:
                out[v].append(i)
        return out

    return p.cached("explain.readers", make)[u]


def _makers(p: PathGraph) -> list[bool]:
    """Whether each node allocates a storage (a view or an in-place op does not)."""

    def make() -> list[bool]:
        out = [False] * p.num_nodes
        for a in p.storages["alloc"]:
            if a >= 0:
                out[a] = True
        return out

    return p.cached("explain.makers", make)


def blocks_at(graph: StepGraph, moment: PeakMoment) -> list[Block]:
    """Every live block at `moment`, largest first (ties: by storage)."""
    p = graph.paths[moment.path]
    mods, smod = node_modules(p)
    sources = node_sources(graph, moment.path)
    shapes = storage_shapes(graph, moment.path)
    shape_of = _shape_evaluator(graph, shapes, moment.resolved)
    alloc, free, cat = p.storages["alloc"], p.storages["free"], p.storages["category"]
    out = []
    for u, nb in moment.storages.items():
        a = alloc[u]
        first = a if a >= 0 else next(iter(_readers(p, u)), -1)
        category = CATEGORIES[cat[u]]
        out.append(
            Block(
                bytes=nb, category=category, module=smod[u],
                source=sources[first] if sources is not None and first >= 0 and a >= 0 else "",
                op=p.nodes["op"][a] if a >= 0 else "", shape=shape_of(u),
                dtype=p.storages["dtype"][u],
                why=_why(p, u, category, moment, mods),
                storage=u, allocated_at=a, freed_at=free[u],
            )
        )  # fmt: skip
    for name, nb in moment.extra.items():
        if name in CUBLAS_KEYS:
            thread = "backward (autograd) thread" if name.endswith("backward") else "main thread"
            why = f"cuBLAS workspace of the {thread}: allocated at its first matmul, kept"
            out.append(Block(bytes=nb, category="cublas_workspace", module="", source="",
                             op="", shape=[nb], dtype="uint8", why=why))  # fmt: skip
        else:
            i = int(name.rsplit("-", 1)[1])
            out.append(
                Block(
                    bytes=nb, category="kernel_scratch", module=mods[i],
                    source=sources[i] if sources is not None else "", op=p.nodes["op"][i],
                    shape=[nb], dtype="uint8", allocated_at=i, freed_at=i,
                    why=f"scratch the CUDA kernel of {p.nodes['op'][i]} allocates inside the op",
                )
            )  # fmt: skip
    out.sort(key=lambda b: (-b.bytes, b.storage if b.storage is not None else -1))
    return out


def _shape_evaluator(graph: StepGraph, shapes: list[str] | None, resolved: dict[str, int]):
    if shapes is None:
        return lambda u: None
    dims = sorted({d for s in shapes if s and s != "?" for d in s.split(",")})
    value: dict[str, int] = {}
    if dims:
        try:
            value = dict(zip(dims, ExprTable(dims, graph.all_symbols).evaluate_exact(resolved)))
        except (ValueError, ArithmeticError):
            value = {}

    def shape(u: int) -> list[int] | None:
        s = shapes[u]
        if s == "":
            return []  # a scalar
        if s == "?" or any(d not in value for d in s.split(",")):
            return None
        return [int(value[d]) for d in s.split(",")]

    return shape


def _why(p: PathGraph, u: int, category: str, m: PeakMoment, mods: Sequence[str]) -> str:
    alloc, free = p.storages["alloc"][u], p.storages["free"][u]
    ops, phases = p.nodes["op"], p.nodes["phase"]
    made = f"{ops[alloc]} in {mods[alloc] or 'no module'}" if alloc >= 0 else ""
    if category == "parameter":
        return "a parameter (alive for the whole run)"
    if category == "gradient":
        return "a gradient: written by backward, kept for the optimizer step" + (
            f" (made by {made})" if made else ""
        )
    if category == "optimizer_state":
        return "optimizer state, kept across steps" + (f" (made by {made})" if made else "")
    if category == "input":
        return "the batch (an input of the step)"
    if category == "comm":
        return f"a collective's buffer ({made})" if made else "a collective's buffer"
    later = [i for i in _readers(p, u) if phases[i] == _BACKWARD and i > max(alloc, m.node)]
    makes = _makers(p)  # a reader that computes (makes a storage), not a view of it
    reader = next((i for i in later if makes[i]), later[0] if later else None)
    if category == "activation":
        by = f", read in backward by {ops[reader]}" if reader is not None else ""
        return f"saved for backward: output of {made}{by}"
    if free < 0:
        return f"an output the loop keeps past the step ({made})"
    if alloc == m.node:
        return f"being allocated at the peak: output of {made}"
    gone = f", freed after {ops[free]} ({PHASES[phases[free]]})"
    return f"a temporary: output of {made}{gone}"


def layer_pattern(module: str) -> str:
    """The module path with its layer indices as `*` (`model.layers.*.mlp.down_proj`): the
    same module of every repeated block, one row."""
    return _INDEX.sub(".*", module)


def group(blocks: Sequence[Block], key: str, top: int | None = None) -> list[dict[str, Any]]:
    """Bytes and block counts per value of `key` (module, source, op, category, or
    `layers`: the module with its layer indices as `*`), largest first; with `top`, the
    rest summed into one `(other)` row."""
    acc: dict[str, list[int]] = {}
    for b in blocks:
        if key == "layers":
            name = layer_pattern(b.module) if b.module else _unnamed(b, "module")
        else:
            name = getattr(b, key) or _unnamed(b, key)
        row = acc.setdefault(name, [0, 0])
        row[0] += b.bytes
        row[1] += 1
    rows = [{"name": k, "bytes": v[0], "blocks": v[1]} for k, v in acc.items()]
    rows.sort(key=lambda r: (-r["bytes"], r["name"]))
    if top is not None and len(rows) > top:
        rest = rows[top:]
        rows = rows[:top] + [
            {
                "name": f"(other: {len(rest)})",
                "bytes": sum(r["bytes"] for r in rest),
                "blocks": sum(r["blocks"] for r in rest),
            }
        ]
    return rows


def _unnamed(b: Block, key: str) -> str:
    if b.category in ("cublas_workspace", "kernel_scratch") and key != "category":
        return f"({b.category})"
    if key == "source" and b.allocated_at < 0:
        return "(made before the step: model / optimizer setup)"
    if key == "source":
        return "(no line recorded)"
    if key == "op":
        return "(made before the step)"
    return "(no module)"
