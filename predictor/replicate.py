"""Synthesise the schedule of an N-block model from a capture of the same model at d blocks.

Input: one captured `PathGraph` whose nodes and storages carry the index of their block
(`predictor.blocks`; None: outside every block), d >= 3. Block 0 is the first, block d-1
the last and blocks 1..d-2 are middle blocks; the N-block schedule keeps the first and the
last block and repeats middle block 1 N-2 times, wherever the blocks occur: in the
forward (ascending), the backward and checkpoint recomputation (descending), the
optimizer's per-parameter ops (ascending), inside the tensor lists of foreach/fused ops,
and in the order storages are created (their uids).

A reference between blocks is relative: a node of block b reading a storage of block b-1
reads, in copy m, the storage of block m-1 (the previous block's output, say); a node
outside every block reads the first or the last block. The same holds for the node that
allocates or frees a storage. Anything else (a middle block read from outside, a block
reading one two away, blocks in another order, blocks of different lengths or ops) raises
`NotRepeated`; so does a schedule that, rebuilt at N = d, is not the captured one
(`replicate` checks this before building any other depth).
"""

from __future__ import annotations

from memgnn.predictor.blocks import NotRepeated
from memgnn.predictor.graph import PathGraph

__all__ = ["replicate"]

Key = tuple[int, int | None]


class _Plan:
    def __init__(self, path: PathGraph, nlayer: list, slayer: list, d: int, prefix: str):
        if d < 3:
            raise ValueError(f"replication needs a capture of >= 3 blocks, got {d}")
        self.p, self.nl, self.sl, self.d, self.prefix = path, nlayer, slayer, d, prefix
        self.names = [f"{prefix}{i}" for i in range(d)]
        self.nby, self.npos = _by_tag(nlayer, d, "nodes")
        self.sby, self.spos = _by_tag(slayer, d, "storages")
        self._check_alike()

    def _module(self, module: str, tag: int | None, lam: int | None) -> str:
        for t, name in enumerate(self.names):
            if module == name or module.startswith(name + "."):
                if t != tag:
                    raise NotRepeated(f"a node of block {tag} runs in module {module!r}")
                return f"{self.prefix}{lam}{module[len(name) :]}"
        return module

    def _check_alike(self) -> None:
        n, s = self.p.nodes, self.p.storages
        for k in range(len(self.nby[0])):
            sigs = set()
            for t in range(self.d):
                i = self.nby[t][k]
                sigs.add(
                    (
                        n["op"][i], n["phase"][i], n["step"][i], n["micro"][i], n["scratch"][i],
                        self._module(n["module"][i], t, -1),
                        len(n["inputs"][i]), len(n["outputs"][i]),
                    )
                )  # fmt: skip
            if len(sigs) > 1:
                raise NotRepeated(f"node {k} of each block differs between blocks: {sigs}")
        for k in range(len(self.sby[0])):
            sigs = {
                (s["nbytes"][u], s["dtype"][u], s["category"][u], s["alloc"][u] == -1)
                for u in (self.sby[t][k] for t in range(self.d))
            }
            if len(sigs) > 1:
                raise NotRepeated(f"storage {k} of each block differs between blocks: {sigs}")

    def tmpl(self, lam: int, n: int) -> int:
        return 0 if lam == 0 else self.d - 1 if lam == n - 1 else 1

    def _relative(self, tag: int, ctx: int | None, lam: int | None, n: int) -> int:
        if ctx is None:
            if tag == 0:
                return 0
            if tag == self.d - 1:
                return n - 1
            raise NotRepeated(f"outside the blocks, something refers to middle block {tag}")
        if abs(tag - ctx) > 1:
            raise NotRepeated(f"block {ctx} refers to block {tag}")
        out = lam + tag - ctx
        if not 0 <= out < n:
            raise NotRepeated(f"block {ctx} refers to block {tag}: none at copy {out}")
        return out

    def storage(self, u: int, ctx: int | None, lam: int | None, n: int) -> Key:
        tag = self.sl[u]
        if tag is None:
            return u, None
        out = self._relative(tag, ctx, lam, n)
        return self.sby[self.tmpl(out, n)][self.spos[u]], out

    def node(self, f: int, ctx: int | None, lam: int | None, n: int) -> Key:
        tag = self.nl[f]
        if tag is None:
            return f, None
        out = self._relative(tag, ctx, lam, n)
        return self.nby[self.tmpl(out, n)][self.npos[f]], out

    def build(self, n: int) -> tuple[dict[str, list], dict[str, list]]:
        p, d = self.p, self.d
        s_order = _expand(self.sl, d, n, "storages")
        n_order = _expand(self.nl, d, n, "nodes")
        uid = {key: i for i, key in enumerate(s_order)}
        idx = {key: i for i, key in enumerate(n_order)}
        nodes: dict[str, list] = {k: [] for k in p.nodes}
        for i, lam in n_order:
            tag = self.nl[i]
            for col in ("op", "phase", "step", "micro", "scratch"):
                nodes[col].append(p.nodes[col][i])
            nodes["module"].append(self._module(p.nodes["module"][i], tag, lam))
            for col in ("inputs", "outputs"):
                refs = p.nodes[col][i]
                if tag is None:
                    where = f"{col} of node {i} ({p.nodes['op'][i]})"
                    tags = [self.sl[u] for u in refs]
                    keys = [(refs[k], lam_k) for k, lam_k in _expand(tags, d, n, where)]
                else:
                    keys = [self.storage(u, tag, lam, n) for u in refs]
                nodes[col].append([_get(uid, key) for key in keys])
        storages: dict[str, list] = {k: [] for k in p.storages}
        for u, lam in s_order:
            tag = self.sl[u]
            for col in ("nbytes", "dtype", "category"):
                storages[col].append(p.storages[col][u])
            for col in ("alloc", "free"):
                f = p.storages[col][u]
                storages[col].append(-1 if f == -1 else _get(idx, self.node(f, tag, lam, n)))
        return nodes, storages


def _get(table: dict[Key, int], key: Key) -> int:
    try:
        return table[key]
    except KeyError:
        raise NotRepeated(f"no counterpart for {key} in the repeated schedule") from None


def _by_tag(tags: list, d: int, what: str) -> tuple[list[list[int]], dict[int, int]]:
    by: list[list[int]] = [[] for _ in range(d)]
    pos: dict[int, int] = {}
    for i, t in enumerate(tags):
        if t is None:
            continue
        if not 0 <= t < d:
            raise NotRepeated(f"{what}: block index {t} outside 0..{d - 1}")
        pos[i] = len(by[t])
        by[t].append(i)
    if len({len(b) for b in by}) > 1:
        raise NotRepeated(f"{what} per block differ: {[len(b) for b in by]}")
    return by, pos


def _expand(tags: list, d: int, n: int, what: str = "") -> list[Key]:
    """The sequence at n blocks: each group of consecutive block runs (0..d-1 or d-1..0)
    becomes first, n-2 copies of block 1, last; a lone first or last block stays."""
    out: list[Key] = []
    i, size = 0, len(tags)
    while i < size:
        if tags[i] is None:
            out.append((i, None))
            i += 1
            continue
        runs: list[tuple[int, int, int]] = []
        j = i
        while j < size and tags[j] is not None:
            k = j
            while k < size and tags[k] == tags[j]:
                k += 1
            runs.append((tags[j], j, k))
            j = k
        order = [r[0] for r in runs]
        start = {t: s for t, s, _ in runs}
        length = {e - s for _, s, e in runs}
        if order == list(range(d)):
            lams = range(n)
        elif order == list(range(d - 1, -1, -1)):
            lams = range(n - 1, -1, -1)
        elif order in ([0], [d - 1]):
            out.extend((x, 0 if order[0] == 0 else n - 1) for x in range(i, j))
            i = j
            continue
        else:
            raise NotRepeated(f"{what}: blocks run in the order {order}, not 0..{d - 1} or back")
        if len(length) > 1:
            raise NotRepeated(f"{what}: runs of blocks {order} differ in length {sorted(length)}")
        (width,) = length
        for lam in lams:
            t = 0 if lam == 0 else d - 1 if lam == n - 1 else 1
            out.extend((start[t] + x, lam) for x in range(width))
        i = j
    return out


def _reintern(
    nodes: dict[str, list], storages: dict[str, list], exprs: list[str]
) -> tuple[dict[str, list], dict[str, list], list[str]]:
    """Renumber expressions in order of first use (node scratch, then storage sizes), as a
    capture interns them, so the result is the graph a capture at that depth writes."""
    index: dict[int, int] = {}
    for col in (nodes["scratch"], storages["nbytes"]):
        for e in col:
            if e not in index:
                index[e] = len(index)
    nodes = nodes | {"scratch": [index[e] for e in nodes["scratch"]]}
    storages = storages | {"nbytes": [index[e] for e in storages["nbytes"]]}
    return nodes, storages, [exprs[e] for e in index]


def replicate(
    path: PathGraph,
    node_layers: list[int | None],
    storage_layers: list[int | None],
    exprs: list[str],
    *,
    depth: int,
    layers: int,
    prefix: str,
) -> tuple[PathGraph, list[str]]:
    """The path (and its expression table) at `layers` blocks from its capture at `depth`
    blocks named `prefix`0..; `NotRepeated` when the blocks are not copies of each other."""
    if layers < depth:
        raise ValueError(f"replicate builds >= {depth} blocks, got {layers}")
    plan = _Plan(path, node_layers, storage_layers, depth, prefix)
    nodes, storages = plan.build(depth)
    if nodes != path.nodes or storages != path.storages:
        bad = [k for k in path.nodes if nodes[k] != path.nodes[k]]
        bad += [k for k in path.storages if storages[k] != path.storages[k]]
        raise NotRepeated(f"the schedule rebuilt at {depth} blocks differs in {bad}")
    nodes, storages = plan.build(layers)
    nodes, storages, table = _reintern(nodes, storages, exprs)
    out = PathGraph(conditions=[dict(c) for c in path.conditions], nodes=nodes, storages=storages)
    return out, table
