"""The profiling corpus on disk: Parquet record parts + a content-addressed graph store.

    DIR/manifest.json            format name and schema version
    DIR/parts/part-*.parquet     record rows, written whole and atomically (tmp + rename)
    DIR/graphs/<graph_id>.json.gz  one symbolic StepGraph per distinct (model, training config)

Writes never modify a finished file, so a crash (even kill -9 mid-write) leaves at most a
`*.tmp` file, which is ignored and removed. A part that fails to read is moved aside as
`*.corrupt` and its jobs count as not done, so a resumed build redoes exactly those.
Rows carry a deterministic `job_id`; readers drop duplicate job ids (first part wins).
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

from dataset.record import ProfileRecord
from predictor.graph import StepGraph

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
    """Append-only writer; see the module docstring for the crash guarantees."""

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

    def has_graph(self, graph_id: str) -> bool:
        return (self.root / "graphs" / f"{graph_id}.json.gz").is_file()

    def add_graph(self, graph: StepGraph) -> str:
        gid = graph.graph_id
        if not self.has_graph(gid):
            graph.save(self.root / "graphs" / f"{gid}.json.gz")
        return gid

    def write_rows(self, rows: list[dict[str, Any]]) -> Path | None:
        """Write rows as one new part file, atomically."""
        if not rows:
            return None
        table = pa.Table.from_pylist(rows, schema=SCHEMA)
        path = self.root / "parts" / f"part-{uuid.uuid4().hex[:16]}.parquet"
        tmp = path.with_name(path.name + ".tmp")
        pq.write_table(table, tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        tmp.replace(path)
        return path

    def done_job_ids(self) -> set[str]:
        """Jobs a resumed build skips: all with a row, but for transient failures."""
        t = Corpus(self.root).table()
        return {
            job
            for job, error in zip(t.column("job_id").to_pylist(), t.column("error").to_pylist())
            if not is_transient(error)
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

    def parts(self) -> list[Path]:
        return sorted((self.root / "parts").glob("part-*.parquet"))

    def table(self) -> pa.Table:
        """Every readable part's rows, one per job id: a job's row without a transient
        error (`TRANSIENT_ERRORS`, retried by a resumed build) wins over one with it."""
        tables: list[pa.Table] = []
        for part in self.parts():
            try:
                tables.append(pq.read_table(part, schema=SCHEMA))
            except (pa.ArrowException, OSError) as exc:
                bad = part.with_name(part.name + ".corrupt")
                log.warning("corrupt corpus part %s (%s): moved to %s", part, exc, bad.name)
                part.replace(bad)
        chosen: dict[str, tuple[int, int, bool]] = {}  # job -> (table, row, transient)
        for k, t in enumerate(tables):
            errors = t.column("error").to_pylist()
            for i, job in enumerate(t.column("job_id").to_pylist()):
                transient = is_transient(errors[i])
                if job not in chosen or (chosen[job][2] and not transient):
                    chosen[job] = (k, i, transient)
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
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
