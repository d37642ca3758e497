"""StepGraph: the captured training step, one schedule per control-flow path.

Stored columnar (lists per field) as gzip-compressed JSON with a format name and version.
Byte sizes are expressions in the named symbols (see `predictor.ir.expr`), interned in one
table. The graph id is the SHA-256 of the canonical JSON of the content.

Per path:
- nodes: op, phase, step (0 first / 1 steady), micro-step, module, inputs/outputs
  (storage uids read / written; views and in-place ops write an existing storage);
- storages: byte-size expression index, dtype, category, the node that allocated it
  (-1: alive before the step) and the node after which it was freed (-1: outlives it).
  `nbytes` is what the storage takes in the CUDA caching allocator. Version 2 adds, where a
  path has storages elsewhere (offloading), `place` (codes into `vocab.PLACES`) and
  `place_nbytes` (the bytes at that place; "0" for device storages, whose `nbytes` is "0"
  when they live elsewhere), so every reader of `nbytes` counts device bytes only.
Edges are data dependencies: from the last node that wrote a storage to each reader.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import json
import logging
import os
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from memgnn.predictor.ir.expr import ExprTable, validate_source
from memgnn.predictor.ir.vocab import CATEGORIES, PHASES, PLACES, SCENARIOS

log = logging.getLogger(__name__)

FORMAT = "memgnn.stepgraph"
VERSION = 2  # 2: optional storage columns `place` / `place_nbytes` (offloading)
READS = (1, 2)  # versions this memgnn loads (a version 1 graph has every storage on device)
NODE_FIELDS = ("op", "phase", "step", "micro", "module", "inputs", "outputs", "scratch")
STORAGE_FIELDS = ("nbytes", "dtype", "category", "alloc", "free")
PLACE_FIELDS = ("place", "place_nbytes")  # version 2, where a path has off-device storages
# The largest batch, sequence or other size a query may give: a step at 2^31 tokens or
# samples fits on no device, and the size formulas stay inside int64 below it.
MAX_SIZE = (1 << 31) - 1


@dataclass(kw_only=True, slots=True)
class PathGraph:
    """One control-flow path: its branch decisions, nodes and storages (columnar)."""

    conditions: list[dict[str, Any]]
    nodes: dict[str, list]
    storages: dict[str, list]
    _cache: dict[str, Any] | None = field(default=None, repr=False, compare=False)

    def __getstate__(self) -> dict[str, Any]:
        """Pickle the columns only (the cache is rebuilt on use)."""
        return {f: None if f == "_cache" else getattr(self, f) for f in self.__dataclass_fields__}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name, value in state.items():
            object.__setattr__(self, name, value)

    def array(self, table: str, column: str) -> np.ndarray:
        """An integer column ("nodes" or "storages") as int64, converted once and cached
        (per-query code reads these for every prediction; read-only)."""
        key = f"{table}.{column}"
        return self.cached(key, lambda: np.asarray(getattr(self, table)[column], dtype=np.int64))

    def cached(self, key: str, make: Any) -> Any:
        """`make()` once per path (derived arrays: the columns never change after load)."""
        if self._cache is None:
            self._cache = {}
        value = self._cache.get(key)
        if value is None:
            value = self._cache[key] = make()
            if isinstance(value, np.ndarray):
                value.flags.writeable = False
        return value

    @property
    def num_nodes(self) -> int:
        return len(self.nodes["op"])

    @property
    def num_storages(self) -> int:
        return len(self.storages["nbytes"])

    @property
    def has_places(self) -> bool:
        """Whether some storage of this path lives off the device (`place` column)."""
        return "place" in self.storages

    def edges(self) -> np.ndarray:
        """Data-dependency edges [2, E] (src node -> dst node), deduplicated."""
        last_writer: dict[int, int] = {}
        src: list[int] = []
        dst: list[int] = []
        for i, (ins, outs) in enumerate(zip(self.nodes["inputs"], self.nodes["outputs"])):
            seen = set()
            for uid in ins:
                w = last_writer.get(uid)
                if w is not None and w not in seen:
                    seen.add(w)
                    src.append(w)
                    dst.append(i)
            for uid in outs:
                last_writer[uid] = i
        return np.array([src, dst], dtype=np.int64).reshape(2, -1)


@dataclass(kw_only=True, slots=True)
class StepGraph:
    model: dict[str, Any]
    train: dict[str, Any]
    symbols: dict[str, int]  # named input sizes with their trace example values
    data_symbols: dict[str, dict[str, str]]  # name -> {lo, balanced, hi, op, module}
    guards: list[str]
    exprs: list[str]
    paths: list[PathGraph]
    meta: dict[str, Any] = field(default_factory=dict)
    version: int = VERSION  # of the format it was written in (a loaded graph keeps its own)
    _table: ExprTable | None = field(default=None, repr=False, compare=False)

    def __getstate__(self) -> dict[str, Any]:
        """Pickle without the compiled expression table (its functions do not pickle)."""
        return {f: None if f == "_table" else getattr(self, f) for f in self.__dataclass_fields__}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name, value in state.items():
            object.__setattr__(self, name, value)

    # ---- identity and validation -------------------------------------------------------
    def content(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": self.version,
            "model": self.model,
            "train": self.train,
            "symbols": self.symbols,
            "data_symbols": self.data_symbols,
            "guards": self.guards,
            "exprs": self.exprs,
            "paths": [
                {"conditions": p.conditions, "nodes": p.nodes, "storages": p.storages}
                for p in self.paths
            ],
        }

    @property
    def graph_id(self) -> str:
        blob = json.dumps(self.content(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:32]

    @property
    def all_symbols(self) -> list[str]:
        return [*self.symbols, *self.data_symbols]

    def table(self) -> ExprTable:
        if self._table is None:
            self._table = ExprTable(self.exprs, self.all_symbols)
        return self._table

    def validate(self) -> None:
        """Structural checks; ValueError names what is wrong."""
        if not self.paths:
            raise ValueError("step graph has no paths")
        self.table()
        for g in self.guards:
            validate_source(g, self.all_symbols)
        for name, ds in self.data_symbols.items():
            for key in ("lo", "balanced", "hi"):
                if key not in ds:
                    raise ValueError(f"data symbol {name} lacks its {key} bound")
                validate_source(ds[key], list(self.symbols))
        for k, p in enumerate(self.paths):
            _validate_path(p, k, len(self.exprs))
            if p.has_places and self.version < 2:
                raise ValueError(f"path {k}: storage places need step graph version 2")

    # ---- evaluation ---------------------------------------------------------------------
    def resolve_sizes(self, sizes: dict[str, int], scenario: str = "worst") -> dict[str, int]:
        """Input sizes plus the data-dependent symbols at a scenario (min/balanced/worst)."""
        if scenario not in SCENARIOS:
            raise ValueError(f"unknown scenario {scenario!r}; expected one of {SCENARIOS}")
        out: dict[str, int] = {}
        for sym in self.symbols:
            if sym not in sizes:
                raise ValueError(f"size for symbol {sym!r} is missing")
            v = sizes[sym]
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"size {sym} must be a positive integer, got {v!r}")
            if v > MAX_SIZE:
                raise ValueError(f"size {sym}={v} is over {MAX_SIZE} (2^31 - 1): no step fits")
            out[sym] = int(v)
        unknown = set(sizes) - set(self.symbols)
        if unknown:
            raise ValueError(f"unknown size symbols {sorted(unknown)}; graph has {self.symbols}")
        key = {"min": "lo", "balanced": "balanced", "worst": "hi"}[scenario]
        if self.data_symbols:
            names = list(self.data_symbols)
            vals = _table_of(tuple(self.data_symbols[n][key] for n in names), tuple(self.symbols))
            out.update(zip(names, vals.evaluate_exact(out)))
        return out

    def violated_guards(self, resolved: dict[str, int]) -> list[str]:
        if not self.guards:
            return []
        ok = _table_of(tuple(self.guards), tuple(self.all_symbols)).evaluate_exact(resolved)
        return [g for g, good in zip(self.guards, ok) if not good]

    def storage_bytes(self, path: int, resolved: dict[str, int]) -> np.ndarray:
        """Bytes of every storage of a path at resolved sizes (int64)."""
        return self._lookup(self.paths[path].array("storages", "nbytes"), resolved)

    @property
    def has_places(self) -> bool:
        """Whether some storage lives off the device (host or unified memory)."""
        return any(p.has_places for p in self.paths)

    def place_bytes(self, path: int, resolved: dict[str, int]) -> tuple[np.ndarray, np.ndarray]:
        """(place code of every storage of a path, its bytes at that place): code 0 and 0
        bytes for device storages (their bytes are `storage_bytes`)."""
        p = self.paths[path]
        if not p.has_places:
            n = p.num_storages
            return np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
        return p.array("storages", "place"), self._lookup(
            p.array("storages", "place_nbytes"), resolved
        )

    def scratch_bytes(self, path: int, resolved: dict[str, int]) -> np.ndarray:
        """Kernel scratch bytes of every node of a path at resolved sizes (int64)."""
        return self._lookup(self.paths[path].array("nodes", "scratch"), resolved)

    def _lookup(self, expr_idx: np.ndarray, resolved: dict[str, int]) -> np.ndarray:
        if not len(expr_idx):
            return np.zeros(0, dtype=np.int64)
        per_expr = self.table().evaluate(resolved)
        return per_expr[expr_idx]

    # ---- files --------------------------------------------------------------------------
    def save(self, path: str | Path) -> str:
        """Write the graph as gzip'd JSON, durably and atomically (`durable_write`); the
        gzip header holds no name or time, so the same graph gives the same bytes (and
        `file_sha256`). Returns the graph id."""
        data = self.content() | {"meta": self.meta, "graph_id": self.graph_id}
        blob = json.dumps(data, separators=(",", ":")).encode()
        durable_write(Path(path), gzip.compress(blob, compresslevel=6, mtime=0))
        return self.graph_id

    @classmethod
    def from_dict(cls, data: Any, source: str = "<dict>") -> StepGraph:
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(f"{source}: not a memgnn step graph (format field missing)")
        if data.get("version") not in READS:
            raise ValueError(
                f"{source}: step graph version {data.get('version')!r} is not supported "
                f"(this memgnn reads versions {', '.join(map(str, READS))}); re-capture it"
            )
        try:
            graph = cls(
                model=data["model"],
                train=data["train"],
                symbols=data["symbols"],
                data_symbols=data["data_symbols"],
                guards=data["guards"],
                exprs=data["exprs"],
                paths=[
                    PathGraph(conditions=p["conditions"], nodes=p["nodes"], storages=p["storages"])
                    for p in data["paths"]
                ],
                meta=data.get("meta", {}),
                version=data["version"],
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"{source}: malformed step graph, missing field {exc}") from None
        graph.validate()
        stored = data.get("graph_id")
        if stored is not None and stored != graph.graph_id:
            raise ValueError(f"{source}: content hash mismatch (file edited or corrupt)")
        return graph

    @classmethod
    def load(cls, path: str | Path) -> StepGraph:
        path = Path(path)
        if not path.is_file():
            raise ValueError(f"step graph file not found: {path}")
        try:
            with gzip.open(path, "rb") as f:
                data = json.loads(f.read())
        except (OSError, EOFError, zlib.error, json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"{path}: corrupt step graph file ({exc})") from None
        return cls.from_dict(data, str(path))


@functools.lru_cache(maxsize=256)
def _table_of(sources: tuple[str, ...], symbols: tuple[str, ...]) -> ExprTable:
    """A compiled table of formulas (guards, data-symbol bounds), kept for the next query:
    parsing and compiling them is most of a small query's cost."""
    return ExprTable(sources, symbols)


def durable_write(path: Path, data: bytes) -> None:
    """Write `data` to `path` so that a crash leaves the old file or the whole new one:
    write `path.tmp`, fsync it, rename it over `path`, fsync the folder."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    durable_replace(tmp, path)


def durable_replace(tmp: Path, path: Path) -> None:
    """Rename the already fsynced `tmp` over `path`, then fsync the folder (the rename)."""
    tmp.replace(path)
    if hasattr(os, "O_DIRECTORY"):  # POSIX; elsewhere the rename is as durable as it gets
        fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def file_sha256(path: str | Path) -> str:
    """Hex sha256 of a file's bytes (the checksum a corpus records for each graph file)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _validate_path(p: PathGraph, k: int, n_exprs: int) -> None:
    for name in NODE_FIELDS:
        if name not in p.nodes:
            raise ValueError(f"path {k}: nodes lack field {name!r}")
    for name in STORAGE_FIELDS:
        if name not in p.storages:
            raise ValueError(f"path {k}: storages lack field {name!r}")
    n, s = p.num_nodes, p.num_storages
    if any(len(p.nodes[f]) != n for f in NODE_FIELDS):
        raise ValueError(f"path {k}: node columns have different lengths")
    if any(len(p.storages[f]) != s for f in STORAGE_FIELDS):
        raise ValueError(f"path {k}: storage columns have different lengths")
    for col, limit in (("phase", len(PHASES)), ("category", len(CATEGORIES))):
        table = p.nodes if col == "phase" else p.storages
        if any(not isinstance(v, int) or not 0 <= v < limit for v in table[col]):
            raise ValueError(f"path {k}: bad {col} code")
    if any(not isinstance(e, int) or not 0 <= e < n_exprs for e in p.storages["nbytes"]):
        raise ValueError(f"path {k}: storage size refers to a missing expression")
    if any(not isinstance(e, int) or not 0 <= e < n_exprs for e in p.nodes["scratch"]):
        raise ValueError(f"path {k}: node scratch refers to a missing expression")
    for col in ("alloc", "free"):
        if any(not isinstance(v, int) or not -1 <= v < n for v in p.storages[col]):
            raise ValueError(f"path {k}: storage {col} refers to a missing node")
    present = [f for f in PLACE_FIELDS if f in p.storages]
    if present:
        if len(present) != len(PLACE_FIELDS) or any(len(p.storages[f]) != s for f in present):
            raise ValueError(f"path {k}: storage place columns are incomplete")
        if any(not isinstance(v, int) or not 0 <= v < len(PLACES) for v in p.storages["place"]):
            raise ValueError(f"path {k}: bad place code")
        if any(not isinstance(e, int) or not 0 <= e < n_exprs for e in p.storages["place_nbytes"]):
            raise ValueError(f"path {k}: storage place size refers to a missing expression")
    for col in ("inputs", "outputs"):
        for refs in p.nodes[col]:
            if any(not isinstance(u, int) or not 0 <= u < s for u in refs):
                raise ValueError(f"path {k}: node {col} refer to a missing storage")
