"""Durable state of the service through SQLAlchemy 2.x: live samples and uploaded graphs.

SQLite by default (WAL journal, synchronous=FULL: a committed sample survives a kill -9
and a power cut); any database URL (PostgreSQL) lets several replicas share samples and
graphs. Every write commits before the call returns. Tested on SQLite and PostgreSQL 15
(psycopg 3; `postgresql://` uses it when psycopg2 is absent): replicas starting together
create or migrate the tables one at a time (a PostgreSQL advisory lock), and a sample
`key` sent to two replicas at once is stored once (the unique key; the loser reads the
winner's id). Messages and logs show the URL without its password.

Residual correction for (graph id, device, metric, model version), from each writer's
last `window` samples, combined across writers so that no single writer controls it
(`serving.corrections`: the rule and what it guarantees). One writer's window: each ratio
measured / predicted is first clipped to [1/max_scale, max_scale] (no sample, however
absurd, moves an answer by more than that factor); its peak log-scale is
n / (n + prior) * log(median of the peak ratios) (`prior`, in samples, is how much the
model's own answer is trusted: one sample moves half-way in log at prior = 1); its bound
log-scale log max(1, max of the bound ratios). The writers' log-scales are combined by
their median, clamped to +-k * log(writer_max_scale) for k writers agreeing in direction.
Samples of another model version do not count: a reloaded model starts uncorrected.

Each sample keeps its provenance: who wrote it (`principal`: the writer's name, "token"
for the single `--token`, or "anonymous"), from where (`client`, the peer address), the
caller's `source` label, and when. Samples stored before writers were named count as
the writer they name (NULL: "unknown").
"""

from __future__ import annotations

import json
import logging
import math
import statistics
import time
from dataclasses import dataclass
from typing import Any

from memgnn.predictor.answer.types import Correction
from memgnn.serving.corrections import (
    DEFAULT_MAX_SCALE,
    DEFAULT_PRIOR,
    DEFAULT_WRITER_MAX_SCALE,
    UNKNOWN_WRITER,
    correction_of_writers,
)
from memgnn.serving.database import open_engine
from sqlalchemy import (
    BigInteger,
    Float,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    func,
    inspect,
    select,
    text,
)
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, sessionmaker

log = logging.getLogger(__name__)

RATIO_MIN, RATIO_MAX = 1e-3, 1e3  # what a stored ratio can hold
PROVENANCE = ("principal", "client", "source")  # columns added after the first release
WRITER_INDEX = "ix_memgnn_samples_writer"  # added with per-writer corrections
SCHEMA_LOCK = 0x6D656D676E6E  # "memgnn": PostgreSQL advisory lock key of schema changes


class Base(DeclarativeBase):
    pass


class SampleRow(Base):
    __tablename__ = "memgnn_samples"
    # 64-bit ids everywhere (SQLite's rowid alias must be spelled INTEGER)
    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    key: Mapped[str | None] = mapped_column(String(128), unique=True, nullable=True)
    graph_id: Mapped[str] = mapped_column(String(64))
    device: Mapped[str] = mapped_column(String(64))
    metric: Mapped[str] = mapped_column(String(32))
    model_version: Mapped[str] = mapped_column(String(128))
    scenario: Mapped[str] = mapped_column(String(16))
    sizes: Mapped[str] = mapped_column(Text)  # JSON
    measured_bytes: Mapped[int] = mapped_column(BigInteger)
    predicted_bytes: Mapped[int] = mapped_column(BigInteger)
    bound_bytes: Mapped[int] = mapped_column(BigInteger)
    peak_ratio: Mapped[float] = mapped_column(Float)
    bound_ratio: Mapped[float] = mapped_column(Float)
    created_at: Mapped[float] = mapped_column(Float)
    principal: Mapped[str | None] = mapped_column(String(128), nullable=True)
    client: Mapped[str | None] = mapped_column(String(128), nullable=True)
    source: Mapped[str | None] = mapped_column(String(128), nullable=True)

    __table_args__ = (
        Index("ix_memgnn_samples_lookup", "graph_id", "device", "metric", "model_version", "id"),
        Index(WRITER_INDEX, "graph_id", "device", "metric", "model_version", "principal", "id"),
    )


class GraphRow(Base):
    __tablename__ = "memgnn_graphs"
    graph_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    blob: Mapped[bytes] = mapped_column(LargeBinary)  # gzip-compressed StepGraph JSON
    n_nodes: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[float] = mapped_column(Float)


@dataclass(kw_only=True, slots=True)
class Sample:
    graph_id: str
    device: str
    metric: str
    model_version: str
    scenario: str
    sizes: dict[str, int]
    measured_bytes: int
    predicted_bytes: int
    bound_bytes: int
    key: str | None = None
    principal: str | None = None  # who wrote it: the writer's name, or "anonymous"
    client: str | None = None  # the peer address
    source: str | None = None  # the caller's label (a run, a host, a tool)

    def __post_init__(self) -> None:
        if self.measured_bytes <= 0:
            raise ValueError(f"measured_bytes must be > 0, got {self.measured_bytes}")


def ratio(measured: int, predicted: int) -> float:
    if predicted <= 0:
        return 1.0 if measured <= 0 else RATIO_MAX
    return min(max(measured / predicted, RATIO_MIN), RATIO_MAX)


def correction_from(
    peak_ratios: list[float],
    bound_ratios: list[float],
    *,
    prior: float = DEFAULT_PRIOR,
    max_scale: float = DEFAULT_MAX_SCALE,
) -> Correction:
    """The correction of one window of ratios, as if one writer sent them all and no
    writer bound applied (see the module docstring; `Store.correction` combines writers)."""
    if not peak_ratios:
        return Correction()
    if prior < 0 or max_scale < 1:
        raise ValueError(f"need prior >= 0 and max_scale >= 1, got {prior}, {max_scale}")

    def clip(r: float) -> float:
        return min(max(r, 1.0 / max_scale), max_scale)

    n = len(peak_ratios)
    median = statistics.median(clip(r) for r in peak_ratios)
    trust = n / (n + prior)
    return Correction(
        peak_scale=median if trust == 1 else math.exp(trust * math.log(median)),
        bound_scale=max(1.0, max(clip(r) for r in bound_ratios)),
        samples=n,
    )


class Store:
    """Samples and graphs in one database (see the module docstring)."""

    def __init__(
        self,
        url: str,
        *,
        window: int = 32,
        prior: float = DEFAULT_PRIOR,
        max_scale: float = DEFAULT_MAX_SCALE,
        writer_max_scale: float = DEFAULT_WRITER_MAX_SCALE,
    ):
        if window < 1:
            raise ValueError("window must be >= 1")
        correction_of_writers(  # validates them
            [([1.0], [1.0])], prior=prior, max_scale=max_scale, writer_max_scale=writer_max_scale
        )
        self.url, self.window, self.prior, self.max_scale = url, window, prior, max_scale
        self.writer_max_scale = writer_max_scale
        self.engine, self.where = open_engine(url)  # where: the URL without its password
        self.sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._create_tables()

    def _create_tables(self) -> None:
        """Create or migrate the tables in one transaction. Replicas starting together:
        on PostgreSQL they take turns (an advisory lock held to the commit: DDL is
        transactional there); on SQLite the loser of a race retries."""
        for attempt in range(3):
            try:
                with self.engine.begin() as conn:
                    if conn.dialect.name == "postgresql":
                        conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": SCHEMA_LOCK})
                    Base.metadata.create_all(conn)
                    self._add_provenance_columns(conn)
                return
            except DBAPIError as exc:  # a table, column or index created meanwhile
                if attempt == 2:
                    raise ValueError(f"cannot create tables in {self.where!r}: {exc}") from None
                time.sleep(0.2 * (attempt + 1))

    def _add_provenance_columns(self, conn: Connection) -> None:
        """A database created before samples kept their provenance gains its columns, and
        one created before corrections were per writer the index that reads them."""
        found = inspect(conn)
        have = {c["name"] for c in found.get_columns(SampleRow.__tablename__)}
        indexes = {i["name"] for i in found.get_indexes(SampleRow.__tablename__)}
        for name in PROVENANCE:
            if name not in have:
                conn.execute(
                    text(f"ALTER TABLE {SampleRow.__tablename__} ADD COLUMN {name} VARCHAR(128)")
                )
                log.info("database %s: added column samples.%s", self.where, name)
        if WRITER_INDEX not in indexes:
            index = next(i for i in SampleRow.__table__.indexes if i.name == WRITER_INDEX)
            index.create(conn, checkfirst=True)
            log.info("database %s: added index %s", self.where, WRITER_INDEX)

    def close(self) -> None:
        self.engine.dispose()

    def ping(self) -> bool:
        try:
            with self.engine.connect() as conn:
                conn.execute(text("SELECT 1"))
            return True
        except Exception as exc:  # any driver error means "not ready"
            log.warning("database not reachable: %s", exc)
            return False

    # ---- samples ------------------------------------------------------------------------
    def add_sample(self, s: Sample) -> tuple[int, bool]:
        """Store a sample durably; (row id, created). A repeated `key` is not stored twice."""
        row = SampleRow(
            key=s.key,
            graph_id=s.graph_id,
            device=s.device,
            metric=s.metric,
            model_version=s.model_version,
            scenario=s.scenario,
            sizes=json.dumps(s.sizes, sort_keys=True),
            measured_bytes=s.measured_bytes,
            predicted_bytes=s.predicted_bytes,
            bound_bytes=s.bound_bytes,
            peak_ratio=ratio(s.measured_bytes, s.predicted_bytes),
            bound_ratio=ratio(s.measured_bytes, s.bound_bytes),
            created_at=time.time(),
            principal=s.principal,
            client=s.client,
            source=s.source,
        )
        with self.sessions() as session:
            session.add(row)
            try:
                session.commit()
                return row.id, True
            except IntegrityError:
                session.rollback()
                if s.key is None:
                    raise
        with self.sessions() as session:
            found = session.scalar(select(SampleRow.id).where(SampleRow.key == s.key))
        if found is None:
            raise ValueError(f"sample key {s.key!r} conflicts but no row holds it")
        return found, False

    def correction(self, graph_id: str, device: str, metric: str, version: str) -> Correction:
        """Each writer's last `window` samples, combined across writers (module docstring).
        The writers of the key first (a covering index), then one indexed query of at
        most `window` rows per writer."""
        where = (
            SampleRow.graph_id == graph_id,
            SampleRow.device == device,
            SampleRow.metric == metric,
            SampleRow.model_version == version,
        )
        windows: dict[str, tuple[list[float], list[float]]] = {}
        with self.sessions() as session:
            names = session.scalars(select(SampleRow.principal).where(*where).distinct()).all()
            for name in names:
                who = SampleRow.principal.is_(None) if name is None else SampleRow.principal == name
                rows = session.execute(
                    select(SampleRow.peak_ratio, SampleRow.bound_ratio)
                    .where(*where, who)
                    .order_by(SampleRow.id.desc())
                    .limit(self.window)
                ).all()
                peaks, bounds = windows.setdefault(name or UNKNOWN_WRITER, ([], []))
                peaks.extend(r[0] for r in rows)
                bounds.extend(r[1] for r in rows)
        return correction_of_writers(
            windows.values(),
            prior=self.prior,
            max_scale=self.max_scale,
            writer_max_scale=self.writer_max_scale,
        )

    def samples(
        self, graph_id: str, device: str | None = None, metric: str | None = None, limit: int = 100
    ) -> list[dict[str, Any]]:
        """The most recent samples of a graph (newest first)."""
        stmt = select(SampleRow).where(SampleRow.graph_id == graph_id)
        if device is not None:
            stmt = stmt.where(SampleRow.device == device)
        if metric is not None:
            stmt = stmt.where(SampleRow.metric == metric)
        with self.sessions() as session:
            rows = session.scalars(stmt.order_by(SampleRow.id.desc()).limit(limit)).all()
        return [_sample_dict(r) for r in rows]

    def count_samples(self) -> int:
        with self.sessions() as session:
            return int(session.scalar(select(func.count()).select_from(SampleRow)) or 0)

    # ---- graphs -------------------------------------------------------------------------
    def put_graph(self, graph_id: str, blob: bytes, n_nodes: int) -> bool:
        """Store a graph's compressed JSON; False if it was already there."""
        with self.sessions() as session:
            if session.get(GraphRow, graph_id) is not None:
                return False
            session.add(
                GraphRow(graph_id=graph_id, blob=blob, n_nodes=n_nodes, created_at=time.time())
            )
            try:
                session.commit()
            except IntegrityError:  # another replica stored it meanwhile
                session.rollback()
                return False
        return True

    def has_graph(self, graph_id: str) -> bool:
        with self.sessions() as session:
            found = session.scalar(select(GraphRow.graph_id).where(GraphRow.graph_id == graph_id))
        return found is not None

    def get_graph(self, graph_id: str) -> bytes | None:
        with self.sessions() as session:
            row = session.get(GraphRow, graph_id)
            return None if row is None else row.blob


def _sample_dict(r: SampleRow) -> dict[str, Any]:
    return {
        "id": r.id,
        "key": r.key,
        "graph_id": r.graph_id,
        "device": r.device,
        "metric": r.metric,
        "model_version": r.model_version,
        "scenario": r.scenario,
        "sizes": json.loads(r.sizes),
        "measured_bytes": r.measured_bytes,
        "predicted_bytes": r.predicted_bytes,
        "bound_bytes": r.bound_bytes,
        "peak_ratio": r.peak_ratio,
        "created_at": r.created_at,
        "principal": r.principal,
        "client": r.client,
        "source": r.source,
    }
