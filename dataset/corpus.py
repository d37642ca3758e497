"""The profiling corpus on disk: Parquet record parts + a content-addressed graph store.

    DIR/manifest.json            format name and schema version
    DIR/parts/part-*.parquet     record rows, written whole and atomically (tmp + rename)
    DIR/graphs/<graph_id>.json.gz  one symbolic StepGraph per distinct (model, training config)

Every file is written durably: tmp file, fsync, rename, fsync of the folder
(`predictor.ir.graph.durable_write`), so a crash (even kill -9 or a power cut mid-write)
leaves at most a `*.tmp` file, which is ignored and removed. Rows carry a deterministic
`job_id`; readers drop duplicate job ids (a row without a transient error wins, then one
whose graph is stored, then the first part). A row that names a graph records the sha256
of the graph file's bytes (`graph_sha256`; rows written before that column existed have
none, and their graphs are verified by parsing).

Reading changes nothing: `Corpus` skips a part that fails to read and notes it in
`corrupt_parts`, and `graph_problems` lists graph files that are corrupt. The writer
(`memgnn dataset build`) repairs: it moves a corrupt part aside as `*.corrupt` and a
corrupt graph file as `*.json.gz.corrupt`, and counts their jobs as not done, so the
resumed build profiles those jobs and re-captures those graphs.
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from memgnn.dataset.record import ProfileRecord
from memgnn.predictor.ir.graph import StepGraph, durable_replace, durable_write, file_sha256

log = logging.getLogger(__name__)

FORMAT = "memgnn.corpus"
SCHEMA_VERSION = 1
JSON_COLUMNS = ("hparams", "sizes", "train", "breakdown", "stats")
SCHEMA = pa.schema(
    [
        ("job_id", pa.string()),
        ("schema_version", pa.int32()),
        ("graph_id", pa.string()),  # the symbolic capture in graphs/ (features)
        ("family", pa.string()),
        ("model", pa.string()),
        ("hparams", pa.string()),  # JSON
        ("sizes", pa.string()),  # JSON {"B": .., "S": ..}
        ("train", pa.string()),  # JSON TrainSpec
        ("precision", pa.string()),
        ("optimizer", pa.string()),
        ("checkpointing", pa.string()),
        ("grad_accum", pa.int32()),
        ("backend", pa.string()),
        ("device", pa.string()),
        ("device_name", pa.string()),
        ("torch_version", pa.string()),
        ("peak_allocated_bytes", pa.int64()),
        ("peak_reserved_bytes", pa.int64()),
        ("device_total_bytes", pa.int64()),
        ("breakdown", pa.string()),  # JSON
        ("stats", pa.string()),  # JSON
        ("seconds", pa.float64()),
        ("error", pa.string()),
        ("graph_sha256", pa.string()),  # of graphs/<graph_id>.json.gz; null in older rows
    ]
)


def record_row(job_id: str, record: ProfileRecord, graph_id: str | None) -> dict[str, Any]:
    """A corpus row from a ProfileRecord (nested fields as JSON text)."""
    r = record.model_dump()
    row = {name: r.get(name) for name in SCHEMA.names if name in r}
    for col in JSON_COLUMNS:
        row[col] = json.dumps(r[col], sort_keys=True, default=str)
    row.update(
        job_id=job_id,
        schema_version=SCHEMA_VERSION,
        graph_id=graph_id,
        precision=record.train.get("precision"),
        optimizer=record.train.get("optimizer"),
        checkpointing=record.train.get("checkpointing"),
        grad_accum=record.train.get("grad_accum"),
    )
    return row


class CorpusWriter:
    """Append-only writer; see the module docstring for the crash guarantees and repairs.

    After `done_job_ids`, `set_aside` lists the corrupt parts it moved aside and
    `bad_graphs` the graph files it found corrupt or missing (id -> reason)."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        (self.root / "parts").mkdir(parents=True, exist_ok=True)
        (self.root / "graphs").mkdir(parents=True, exist_ok=True)
        manifest = self.root / "manifest.json"
        if manifest.exists():
            _check_manifest(manifest)
        else:
            _atomic_write(manifest, json.dumps({"format": FORMAT, "version": SCHEMA_VERSION}))
        for tmp in self.root.rglob("*.tmp"):
            tmp.unlink()
        self._sha: dict[str, str] = {}
        self._verified: set[str] = set()  # stored graph files known to be good
        self.set_aside: list[str] = []
        self.bad_graphs: dict[str, str] = {}

    def _graph_path(self, graph_id: str) -> Path:
        return self.root / "graphs" / f"{graph_id}.json.gz"

    def has_graph(self, graph_id: str) -> bool:
        return self._graph_path(graph_id).is_file()

    def add_graph(self, graph: StepGraph) -> bool:
        """Store the graph unless a good copy is stored; True if it wrote the file. A
        stored file this writer has not verified (`done_job_ids` verifies those the rows
        name) is parsed first and rewritten if it is corrupt."""
        gid = graph.graph_id
        path = self._graph_path(gid)
        if path.is_file() and gid not in self._verified:
            try:
                StepGraph.load(path)
                self._verified.add(gid)
            except ValueError as exc:
                log.warning("corrupt graph file %s (%s): rewritten", path, exc)
        if path.is_file() and gid in self._verified:
            return False
        graph.save(path)
        self._verified.add(gid)
        self._sha[gid] = file_sha256(path)
        return True

    def graph_sha256(self, graph_id: str) -> str | None:
        """The checksum of a stored graph file (None if it is not stored)."""
        if graph_id not in self._sha and self.has_graph(graph_id):
            self._sha[graph_id] = file_sha256(self._graph_path(graph_id))
        return self._sha.get(graph_id)

    def write_rows(self, rows: list[dict[str, Any]]) -> Path | None:
        """Write rows as one new part file, atomically; a row naming a stored graph gets
        that file's checksum unless it carries one."""
        if not rows:
            return None
        rows = [
            r | {"graph_sha256": self.graph_sha256(r["graph_id"])}
            if r.get("graph_id") and not r.get("graph_sha256")
            else r
            for r in rows
        ]
        table = pa.Table.from_pylist(rows, schema=SCHEMA)
        path = self.root / "parts" / f"part-{uuid.uuid4().hex[:16]}.parquet"
        tmp = path.with_name(path.name + ".tmp")
        pq.write_table(table, tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        durable_replace(tmp, path)
        return path

    def done_job_ids(self) -> set[str]:
        """Jobs a resumed build skips: all with a row, but for transient failures and
        for jobs whose graph is corrupt or missing. Repairs what it finds: corrupt parts
        are moved aside as `*.corrupt`, corrupt graph files as `*.json.gz.corrupt`."""
        corpus = Corpus(self.root)
        t = corpus.table()
        for name, reason in corpus.corrupt_parts.items():
            part = self.root / "parts" / name
            bad = part.with_name(part.name + ".corrupt")
            log.warning("corrupt corpus part %s (%s): moved to %s; its jobs are redone",
                        part, reason, bad.name)  # fmt: skip
            part.replace(bad)
            self.set_aside.append(name)
        self.bad_graphs = corpus.graph_problems(t, missing=True)
        named = {g for g in t.column("graph_id").to_pylist() if g is not None}
        self._verified |= named - set(self.bad_graphs)
        for gid, reason in self.bad_graphs.items():
            path = self._graph_path(gid)
            if path.is_file():
                path.replace(path.with_name(path.name + ".corrupt"))
            log.warning("graph %s %s: its jobs are redone to re-capture it", gid, reason)
        jobs, errors = t.column("job_id").to_pylist(), t.column("error").to_pylist()
        gids = t.column("graph_id").to_pylist()
        return {
            job
            for job, error, gid in zip(jobs, errors, gids, strict=True)
            if not is_transient(error) and gid not in self.bad_graphs
        }


# errors of the machinery, not of the config: a resumed build profiles those jobs again
TRANSIENT_ERRORS = ("worker process died", "worker failed:")


def is_transient(error: str | None) -> bool:
    return bool(error) and error.startswith(TRANSIENT_ERRORS)


class Corpus:
    """Read side: the record table (deduplicated by job id) and the graph store."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        manifest = self.root / "manifest.json"
        if not manifest.is_file():
            raise ValueError(f"{self.root} is not a memgnn corpus (no manifest.json)")
        _check_manifest(manifest)
        self.corrupt_parts: dict[str, str] = {}  # part file name -> why it does not read

    def parts(self) -> list[Path]:
        return sorted((self.root / "parts").glob("part-*.parquet"))

    def table(self) -> pa.Table:
        """Every readable part's rows, one per job id: a job's row without a transient
        error (`TRANSIENT_ERRORS`, retried by a resumed build) wins over one with it, then
        one whose graph is stored over one whose graph is not (a re-captured graph), then
        the first. A part that does not read is skipped and noted in `corrupt_parts`;
        nothing on disk changes."""
        tables: list[pa.Table] = []
        self.corrupt_parts = {}
        for part in self.parts():
            try:
                tables.append(pq.read_table(part, schema=SCHEMA))
            except (pa.ArrowException, OSError) as exc:
                log.warning("corrupt corpus part %s (%s): its rows are left out", part, exc)
                self.corrupt_parts[part.name] = str(exc)
        stored = set(self.graph_ids())
        chosen: dict[str, tuple[int, int, tuple[bool, bool]]] = {}  # job -> (table, row, rank)
        for k, t in enumerate(tables):
            errors, gids = t.column("error").to_pylist(), t.column("graph_id").to_pylist()
            for i, job in enumerate(t.column("job_id").to_pylist()):
                rank = (is_transient(errors[i]), gids[i] is not None and gids[i] not in stored)
                if job not in chosen or rank < chosen[job][2]:
                    chosen[job] = (k, i, rank)
        keep: list[list[int]] = [[] for _ in tables]
        for k, i, _ in chosen.values():
            keep[k].append(i)
        out = [
            t if len(rows) == t.num_rows else t.take(pa.array(sorted(rows), type=pa.int64()))
            for t, rows in zip(tables, keep, strict=True)
            if rows
        ]
        return pa.concat_tables(out) if out else SCHEMA.empty_table()

    def records(self, *, ok_only: bool = True) -> list[dict[str, Any]]:
        rows = self.table().to_pylist()
        for row in rows:
            for col in JSON_COLUMNS:
                row[col] = json.loads(row[col]) if row[col] else {}
        return [r for r in rows if not (ok_only and r["error"])]

    def graph(self, graph_id: str) -> StepGraph:
        return StepGraph.load(self.root / "graphs" / f"{graph_id}.json.gz")

    def verify_graph(self, graph_id: str, sha256: str | None = None) -> str | None:
        """Why the stored graph file is not usable, or None: a file whose bytes match the
        recorded `sha256` is good; without one (older rows) or on a mismatch the file is
        parsed and its content hash checked (`StepGraph.load`)."""
        path = self.root / "graphs" / f"{graph_id}.json.gz"
        if not path.is_file():
            return "is missing"
        if sha256 is not None and file_sha256(path) == sha256:
            return None
        try:
            StepGraph.load(path)
        except ValueError as exc:
            why = "fails its recorded checksum and " if sha256 is not None else ""
            return f"{why}does not load ({str(exc).removeprefix(str(path) + ': ')})"
        return None

    def graph_problems(self, table: pa.Table | None = None, *, missing: bool = False):
        """{graph id: why it is unusable} over the graphs the rows of `table` (default:
        `table()`) name: corrupt files, and missing ones too if `missing`."""
        t = self.table() if table is None else table
        recorded: dict[str, str | None] = {}
        for gid, sha in zip(t.column("graph_id").to_pylist(),
                            t.column("graph_sha256").to_pylist(), strict=True):  # fmt: skip
            if gid is not None and not recorded.get(gid):
                recorded[gid] = sha
        out = {}
        for gid, sha in sorted(recorded.items()):
            why = self.verify_graph(gid, sha)
            if why is not None and (missing or why != "is missing"):
                out[gid] = why
        return out

    def graph_ids(self) -> list[str]:
        return sorted(
            p.name.removesuffix(".json.gz") for p in (self.root / "graphs").glob("*.json.gz")
        )


def _check_manifest(path: Path) -> None:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: unreadable corpus manifest ({exc})") from None
    if data.get("format") != FORMAT or data.get("version") != SCHEMA_VERSION:
        raise ValueError(
            f"{path}: corpus format {data.get('format')!r} version {data.get('version')!r} "
            f"is not {FORMAT!r} version {SCHEMA_VERSION}"
        )


def _atomic_write(path: Path, text: str) -> None:
    durable_write(path, text.encode())
