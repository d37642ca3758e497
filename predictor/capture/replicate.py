"""Synthesise the schedule of an N-block model from a capture of the same model at d blocks.

Input: one captured `PathGraph` whose nodes and storages carry the index of their block
(`predictor.ir.blocks`; None: outside every block), d >= 4. Block 0 is the first, block d-1
the last, blocks 1..d-2 are middle blocks. The N-block schedule keeps the first and the
last block as captured (they may differ from the others: the first block of a frozen
embedding computes no input gradient) and repeats a middle block N-2 times, wherever
blocks occur: the forward (ascending), the backward and checkpoint recomputation
(descending), the optimizer's per-parameter ops (ascending), inside the tensor lists of
foreach/fused ops, and in the order storages are created (their uids).

A reference between blocks is relative: a node of a middle block reading a storage of the
block before it reads, in copy m, the storage of block m-1. Copy m takes what it reads
from the block before it from middle block d-2 (whose previous block is a middle one)
unless m-1 is the first block (then from middle block 1), and what it reads from the
block after it from middle block 1 unless m+1 is the last (then from block d-2); both
middle blocks must agree on every such offset. Sizes and ops of copy 1 are middle block
1's, of the later copies block d-2's (the shape environment can write a size expression of
the second block in another form than those of the later ones). A node outside every
block reads the first or the last block. The node that allocates or frees a storage is
found the same way. Anything else (a middle block read from outside, a block reading one
two away, blocks in another order, middle blocks of different lengths or ops) raises
`NotRepeated`; so does a schedule that, rebuilt at N = d, is not the captured one
(`replicate` checks this before building any other depth).
"""

from __future__ import annotations

from memgnn.predictor.ir.blocks import NotRepeated
from memgnn.predictor.ir.graph import PathGraph

__all__ = ["replicate"]

Key = tuple[int, int | None]


class _Plan:
    def __init__(self, path: PathGraph, nlayer: list, slayer: list, d: int, prefix: str):
        if d < 4:
            raise ValueError(f"replication needs a capture of >= 4 blocks, got {d}")
        self.p, self.nl, self.sl, self.d, self.prefix = path, nlayer, slayer, d, prefix
        self.a, self.z = 1, d - 2  # the first and the last middle block
        self.names = [f"{prefix}{i}" for i in range(d)]
        self.nby, self.npos = _by_tag(nlayer, d, "nodes")
        self.sby, self.spos = _by_tag(slayer, d, "storages")
        self._check_alike()

    def _block_of(self, module: str) -> tuple[int, str] | None:
        for t, name in enumerate(self.names):
            if module == name or module.startswith(name + "."):
                return t, module[len(name) :]
        return None

    def _check_alike(self) -> None:
        """Middle blocks run the same ops and make the same kinds of storage (size
        expressions and module names may differ in form: that they are alike is what
        rebuilding the captured depth checks)."""
        n, s = self.p.nodes, self.p.storages
        middles = range(self.a, self.z + 1)
        for k in range(len(self.nby[self.a])):
            sigs = {
                (n["op"][i], n["phase"][i], n["step"][i], n["micro"][i],
                 len(n["inputs"][i]), len(n["outputs"][i]))
                for i in (self.nby[t][k] for t in middles)
            }  # fmt: skip
            if len(sigs) > 1:
                raise NotRepeated(f"node {k} of each middle block differs: {sigs}")
        for k in range(len(self.sby[self.a])):
            sigs = {
                (s["dtype"][u], s["category"][u], s["alloc"][u] == -1)
                for u in (self.sby[t][k] for t in middles)
            }
            if len(sigs) > 1:
                raise NotRepeated(f"storage {k} of each middle block differs: {sigs}")

    def _offset(self, tag: int | None, ctx: int) -> int | None:
        return None if tag is None else tag - ctx

    def _target(self, tag: int, ctx: int | None, lam: int | None, n: int) -> int:
        """The copy that block `tag` is, seen from block `ctx` at copy `lam`."""
        if ctx is None:
            if tag in (0, self.d - 1):
                return 0 if tag == 0 else n - 1
            raise NotRepeated(f"outside the blocks, something refers to middle block {tag}")
        if abs(tag - ctx) > 1:
            raise NotRepeated(f"block {ctx} refers to block {tag}")
        assert lam is not None
        return lam + tag - ctx

    def _key(self, ref: int, tag: int | None, by: list, pos: dict, out: int, n: int) -> Key:
        """Item `ref` (of block `tag`) as copy `out`: first/last as they are, a middle
        block's by its position among the middle blocks."""
        if tag is None:
            return ref, None
        if out == 0 or out == n - 1:
            if tag != (0 if out == 0 else self.d - 1):
                raise NotRepeated(f"block {tag} stands for copy {out} of {n}")
            return ref, out
        if not self.a <= tag <= self.z:
            raise NotRepeated(f"block {tag} stands for middle copy {out}")
        return by[self.a][pos[ref]], out

    def _resolve(self, refs: list[int], src: list[int], lam: int, n: int, storages: bool):
        """A reference (one per source block in `src`: the item's own for first and last,
        middle blocks 1 and d-2 for a middle copy) as a key of copy `lam`."""
        tags_of = self.sl if storages else self.nl
        by, pos = (self.sby, self.spos) if storages else (self.nby, self.npos)
        first_last = (0, self.d - 1)
        if len(src) == 1:
            (ref,), (ctx,) = refs, src
            tag = tags_of[ref]
            if not storages and {tag, ctx} == set(first_last):
                # the last block's storage dies in the first block (or the reverse): a
                # lifetime across the blocks (a held graph freed at once), seen as from
                # outside the blocks
                ctx = None
            out = lam if tag is None else self._target(tag, ctx, lam, n)
            return self._key(ref, tag, by, pos, out, n)
        if not storages and len(set(refs)) == 1 and tags_of[refs[0]] in first_last:
            # every middle block's storage dies at one node of the first or last block
            # (bitsandbytes < 0.43.2's kept inputs, freed with the graph): that node
            tag = tags_of[refs[0]]
            return self._key(refs[0], tag, by, pos, self._target(tag, None, lam, n), n)
        offsets = {self._offset(tags_of[r], c) for r, c in zip(refs, src)}
        if len(offsets) > 1 or (None in offsets and len(set(refs)) > 1):
            raise NotRepeated(f"middle blocks refer differently: {refs} from blocks {src}")
        (offset,) = offsets
        if offset is None:
            return refs[0], None
        out = lam + offset
        if offset == -1 and out != 0:  # the previous block is a middle one: as seen by d-2
            ref, ctx = refs[1], src[1]
        elif offset == 1 and out == n - 1:  # the next block is the last: as seen by d-2
            ref, ctx = refs[1], src[1]
        else:
            ref, ctx = refs[0], src[0]
        if abs(offset) > 1 or not 0 <= out < n:
            raise NotRepeated(f"block {ctx} refers to block {tags_of[ref]}")
        return self._key(ref, tags_of[ref], by, pos, out, n)

    def _sources(self, item: int, tag: int | None, by: list, pos: dict) -> tuple[list, list]:
        if tag is None or tag in (0, self.d - 1):
            return [item], [tag]
        k = pos[item]
        return [by[self.a][k], by[self.z][k]], [self.a, self.z]

    def _module(self, items: list[int], src: list, lam: int | None, n: int) -> str:
        """Module names inside a block are relative to the node's block, as references
        are (a node can name the block before it, whose recomputation ran last)."""
        found = [self._block_of(self.p.nodes["module"][i]) for i in items]
        if all(f is None for f in found):
            return self.p.nodes["module"][items[0]]
        if any(f is None for f in found) or len({f[1] for f in found if f}) > 1:
            raise NotRepeated(f"middle blocks run in different modules: {found}")
        offsets = {f[0] - (c or 0) for f, c in zip(found, src) if f}
        if len(offsets) > 1:
            raise NotRepeated(f"middle blocks name modules differently: {found}")
        first = found[0]
        assert first is not None
        tag = first[0]
        out = self._target(tag, src[0], lam, n)
        return f"{self.prefix}{out}{first[1]}"

    def build(self, n: int) -> tuple[dict[str, list], dict[str, list]]:
        p, d = self.p, self.d
        phase = [(a, b, c) for a, b, c in zip(p.nodes["phase"], p.nodes["step"], p.nodes["micro"])]
        s_keys: list = []  # a storage first seen as an input (alloc -1) goes with the one before
        for a in p.storages["alloc"]:
            s_keys.append((s_keys[-1] if s_keys else None) if a == -1 else phase[a])
        s_order = _expand(self.sl, d, n, self.a, "storages", s_keys)
        n_order = _expand(self.nl, d, n, self.a, "nodes", phase)
        uid = {key: i for i, key in enumerate(s_order)}
        idx = {key: i for i, key in enumerate(n_order)}
        nodes: dict[str, list] = {k: [] for k in p.nodes}
        for i, lam in n_order:
            tag = self.nl[i]
            items, src = self._sources(i, tag, self.nby, self.npos)
            base = items[-1] if len(items) > 1 and lam != 1 else items[0]
            extra_nodes = sorted(_NODE_EXTRA.intersection(p.nodes))
            for col in ("op", "phase", "step", "micro", "scratch", *extra_nodes):
                nodes[col].append(p.nodes[col][base])
            nodes["module"].append(self._module(items, src, lam, n))
            for col in ("inputs", "outputs"):
                refs = p.nodes[col][i]
                if tag is None:
                    where = f"{col} of node {i} ({p.nodes['op'][i]})"
                    tags = [self.sl[u] for u in refs]
                    keys = [(refs[k], lam_k) for k, lam_k in _expand(tags, d, n, self.a, where)]
                else:
                    lists = [p.nodes[col][j] for j in items]
                    keys = [
                        self._resolve(list(slot), src, lam, n, storages=True)
                        for slot in zip(*lists)
                    ]
                nodes[col].append([_get(uid, key) for key in keys])
        storages: dict[str, list] = {k: [] for k in p.storages}
        for u, lam in s_order:
            items, src = self._sources(u, self.sl[u], self.sby, self.spos)
            base = items[-1] if len(items) > 1 and lam != 1 else items[0]
            extra = (_PLACE_COLUMNS | _STORAGE_EXTRA).intersection(p.storages)
            for col in ("nbytes", "dtype", "category", *sorted(extra)):
                storages[col].append(p.storages[col][base])
            for col in ("alloc", "free"):
                fs = [p.storages[col][j] for j in items]
                if fs[0] == -1:
                    if len(set(fs)) > 1:
                        raise NotRepeated(f"middle blocks' storages differ in {col}: {fs}")
                    storages[col].append(-1)
                    continue
                if -1 in fs:
                    raise NotRepeated(f"middle blocks' storages differ in {col}: {fs}")
                key = self._resolve(fs, src, lam, n, storages=False)
                storages[col].append(_get(idx, key))
        return nodes, storages


_PLACE_COLUMNS = frozenset(("place", "place_nbytes"))  # graph format 2, where present
_NODE_EXTRA = frozenset(("source",))  # file:line per node, where recorded (`ir.sources`)
_STORAGE_EXTRA = frozenset(("shape",))  # the first tensor's shape, where recorded


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
    if len({len(b) for b in by[1 : d - 1]}) > 1:
        raise NotRepeated(f"{what} per block differ: {[len(b) for b in by]}")
    return by, pos


def _expand(
    tags: list, d: int, n: int, mid: int = 1, what: str = "", keys: list | None = None
) -> list[Key]:
    """The sequence at n blocks: each group of consecutive block runs (0..d-1 or d-1..0)
    becomes first, n-2 copies of middle block `mid`, last (the middle runs must be of one
    length); a lone first or last block stays."""
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
            while k < size and tags[k] == tags[j] and (keys is None or keys[k] == keys[j]):
                k += 1
            runs.append((tags[j], j, k))
            j = k
            if keys is not None and j < size and keys[j] != keys[i]:
                break  # a new phase starts a new group (backward's last block, then the
                # optimizer's first, with nothing outside the blocks between them)
        r = 0
        while r < len(runs):  # full ascending or descending groups, or a lone first/last
            tags_r = [t for t, _, _ in runs[r : r + d]]
            if tags_r == list(range(d)):
                lams, group = range(n), runs[r : r + d]
            elif tags_r == list(range(d - 1, -1, -1)):
                lams, group = range(n - 1, -1, -1), runs[r : r + d]
            elif runs[r][0] in (0, d - 1):
                t0, s0, e0 = runs[r]
                out.extend((x, 0 if t0 == 0 else n - 1) for x in range(s0, e0))
                r += 1
                continue
            else:
                order = [t for t, _, _ in runs]
                raise NotRepeated(
                    f"{what}: blocks run in the order {order}, not 0..{d - 1} or back"
                )
            span = {t: (s0, e0) for t, s0, e0 in group}
            widths = {span[t][1] - span[t][0] for t in range(1, d - 1)}
            if len(widths) > 1:
                raise NotRepeated(f"{what}: middle blocks' runs differ in length {sorted(widths)}")
            for lam in lams:
                t = 0 if lam == 0 else d - 1 if lam == n - 1 else mid
                out.extend((x, lam) for x in range(*span[t]))
            r += len(group)
        i = j
    return out


def _reintern(
    nodes: dict[str, list], storages: dict[str, list], exprs: list[str]
) -> tuple[dict[str, list], dict[str, list], list[str]]:
    """Renumber expressions in order of first use (node scratch, then storage sizes, then
    the "0" of storages' other place), as a capture interns them, so the result is the
    graph a capture at that depth writes."""
    index: dict[int, int] = {}
    sizes = storages["nbytes"]
    if "place" in storages:  # a storage's own size first, wherever it lives
        sizes = [
            b if code else a
            for a, b, code in zip(sizes, storages["place_nbytes"], storages["place"])
        ]
    for col in (nodes["scratch"], sizes, storages["nbytes"], storages.get("place_nbytes", ())):
        for e in col:
            if e not in index:
                index[e] = len(index)
    nodes = nodes | {"scratch": [index[e] for e in nodes["scratch"]]}
    storages = storages | {
        col: [index[e] for e in storages[col]]
        for col in ("nbytes", "place_nbytes")
        if col in storages
    }
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
    # a node's source line is what it shows, not what it allocates: not compared
    same = [k for k in path.nodes if k not in _NODE_EXTRA]
    kept = [k for k in path.storages if k not in _STORAGE_EXTRA]
    if any(nodes[k] != path.nodes[k] for k in same) or any(
        storages[k] != path.storages[k] for k in kept
    ):
        bad = [k for k in same if nodes[k] != path.nodes[k]]
        bad += [k for k in kept if storages[k] != path.storages[k]]
        raise NotRepeated(f"the schedule rebuilt at {depth} blocks differs in {bad}")
    nodes, storages = plan.build(layers)
    nodes, storages, table = _reintern(nodes, storages, exprs)
    out = PathGraph(conditions=[dict(c) for c in path.conditions], nodes=nodes, storages=storages)
    return out, table
