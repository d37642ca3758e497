"""The residual store: durable samples, correction statistics, graphs, SQLite settings.

Tests taking `db_url` (tests/serving/conftest.py) run on SQLite and on a throwaway
PostgreSQL server (skipped where none can start)."""

from __future__ import annotations

import math
import sqlite3
import threading

import pytest
from memgnn.predictor.answer.types import Correction
from memgnn.serving.store import RATIO_MAX, Sample, Store, correction_from, ratio
from sqlalchemy import (
    BigInteger,
    Column,
    Float,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    create_engine,
    inspect,
    text,
)


def sample(measured: int, predicted: int = 1000, **kw) -> Sample:
    fields = dict(
        graph_id="g1",
        device="h100-80gb",
        metric="reserved",
        model_version="v1",
        scenario="worst",
        sizes={"B": 8},
        measured_bytes=measured,
        predicted_bytes=predicted,
        bound_bytes=predicted,
    )
    return Sample(**(fields | kw))


@pytest.fixture
def store(db_url):
    # plain one-writer stats: no prior, no bound on one writer's reach
    s = Store(db_url, window=4, prior=0, writer_max_scale=4.0)
    yield s
    s.close()


@pytest.fixture
def sqlite_store(tmp_path):
    s = Store(f"sqlite:///{tmp_path / 'deep' / 'samples.db'}", window=4, prior=0)
    yield s
    s.close()


def test_sqlite_runs_in_wal_with_full_sync(sqlite_store, tmp_path):
    with sqlite_store.engine.connect() as conn:
        raw = conn.connection.dbapi_connection
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert raw.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    assert (tmp_path / "deep" / "samples.db").is_file()  # parent folders are created


def test_empty_correction_is_neutral(store):
    assert store.correction("g1", "h100-80gb", "reserved", "v1") == Correction()


def test_correction_is_median_and_max_over_the_window(store):
    for m in (5000, 1100, 1200, 1300, 1400):  # the first falls out of a window of 4
        store.add_sample(sample(m))
    c = store.correction("g1", "h100-80gb", "reserved", "v1")
    assert c.samples == 4
    assert c.peak_scale == pytest.approx(1.25)  # median of 1.1, 1.2, 1.3, 1.4
    assert c.bound_scale == pytest.approx(1.4)


def test_bound_scale_never_below_one(store):
    for m in (500, 600, 700):
        store.add_sample(sample(m))
    c = store.correction("g1", "h100-80gb", "reserved", "v1")
    assert c.peak_scale == pytest.approx(0.6) and c.bound_scale == 1.0


def test_corrections_are_per_graph_device_metric_and_version(store):
    store.add_sample(sample(2000))
    for key in [
        ("g2", "h100-80gb", "reserved", "v1"),
        ("g1", "a100-80gb", "reserved", "v1"),
        ("g1", "h100-80gb", "allocated", "v1"),
        ("g1", "h100-80gb", "reserved", "v2"),
    ]:
        assert store.correction(*key).samples == 0
    assert store.correction("g1", "h100-80gb", "reserved", "v1").peak_scale == 2.0


def test_ratios_are_clipped():
    assert ratio(10**15, 1) == RATIO_MAX
    assert ratio(0, 0) == 1.0 and ratio(5, 0) == RATIO_MAX
    assert correction_from([], []) == Correction()


def test_keys_make_retries_idempotent(store):
    first = store.add_sample(sample(1500, key="run-7/step-100"))
    again = store.add_sample(sample(1500, key="run-7/step-100"))
    assert first[1] is True and again == (first[0], False)
    assert store.count_samples() == 1
    with pytest.raises(ValueError):
        sample(-1)
    with pytest.raises(ValueError):
        sample(0)


def test_samples_listing(store):
    for m in (1100, 1200):
        store.add_sample(sample(m))
    store.add_sample(sample(900, device="cpu", metric="allocated"))
    rows = store.samples("g1")
    assert [r["measured_bytes"] for r in rows] == [900, 1200, 1100]  # newest first
    assert rows[0]["sizes"] == {"B": 8}
    assert len(store.samples("g1", device="h100-80gb", metric="reserved")) == 2


def test_graphs_are_content_addressed(store):
    assert store.put_graph("abc", b"\x1f\x8bdata", 10) is True
    assert store.put_graph("abc", b"\x1f\x8bother", 10) is False  # first one stays
    assert store.get_graph("abc") == b"\x1f\x8bdata"
    assert store.get_graph("missing") is None
    assert store.has_graph("abc") and not store.has_graph("missing")


def test_committed_samples_are_visible_to_another_connection(sqlite_store, tmp_path):
    sqlite_store.add_sample(sample(1234))
    # no close, no checkpoint: a fresh sqlite3 connection (as after a crash) sees the row
    conn = sqlite3.connect(tmp_path / "deep" / "samples.db")
    assert conn.execute("SELECT measured_bytes FROM memgnn_samples").fetchall() == [(1234,)]
    conn.close()


def test_two_stores_share_one_database(db_url):
    a, b = (Store(db_url, prior=0, writer_max_scale=4.0) for _ in range(2))  # two replicas
    a.add_sample(sample(3000))
    assert b.correction("g1", "h100-80gb", "reserved", "v1").peak_scale == pytest.approx(3.0)
    a.close(), b.close()


def test_concurrent_writers(store):
    errors = []

    def write(k: int) -> None:
        try:
            for i in range(10):
                store.add_sample(sample(1000 + i, key=f"{k}-{i}"))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and store.count_samples() == 40


def test_bad_urls_are_value_errors(tmp_path):
    with pytest.raises(ValueError):
        Store("nosuchdialect://x/y")
    with pytest.raises(ValueError):
        Store("sqlite:///x.db", window=0)
    assert Store(f"sqlite:///{tmp_path / 'p.db'}").ping()


def test_few_samples_are_trusted_less():
    """log(peak_scale) = n / (n + prior) * log(median): half-way at one sample, prior 1."""
    one = correction_from([2.0], [2.0], prior=1.0)
    assert one.peak_scale == pytest.approx(math.sqrt(2.0)) and one.bound_scale == 2.0
    three = correction_from([2.0, 2.0, 2.0], [1.0, 1.0, 1.0], prior=1.0)
    assert three.peak_scale == pytest.approx(2.0**0.75)
    assert correction_from([2.0], [2.0], prior=0).peak_scale == 2.0
    many = correction_from([0.5] * 1000, [0.5] * 1000, prior=1.0)
    assert many.peak_scale == pytest.approx(0.5, rel=1e-3) and many.bound_scale == 1.0


def test_a_correction_step_is_bounded():
    c = correction_from([1e-3], [1e3], prior=0, max_scale=4.0)
    assert c.peak_scale == 0.25 and c.bound_scale == 4.0
    with pytest.raises(ValueError):
        correction_from([1.0], [1.0], max_scale=0.5)


def _first_release_table(url: str) -> None:
    """memgnn_samples as the first release created it (no provenance), with one row."""
    meta = MetaData()
    Table(
        "memgnn_samples",
        meta,
        Column("id", Integer, primary_key=True, autoincrement=True),
        Column("key", String(128), unique=True, nullable=True),
        *(Column(n, String(64)) for n in ("graph_id", "device", "metric", "model_version")),
        Column("scenario", String(16)),
        Column("sizes", Text),
        *(Column(n, BigInteger) for n in ("measured_bytes", "predicted_bytes", "bound_bytes")),
        *(Column(n, Float) for n in ("peak_ratio", "bound_ratio", "created_at")),
    )
    engine = create_engine(url)
    with engine.begin() as conn:
        meta.create_all(conn)
        conn.execute(
            text(
                "INSERT INTO memgnn_samples (graph_id, device, metric, model_version, scenario, "
                "sizes, measured_bytes, predicted_bytes, bound_bytes, peak_ratio, bound_ratio, "
                "created_at) VALUES ('g1', 'h100-80gb', 'reserved', 'v1', 'worst', '{}', "
                "1100, 1000, 1000, 1.1, 1.1, 0)"
            )
        )
    engine.dispose()


def _indexes(url: str) -> set[str]:
    engine = create_engine(url)
    names = {i["name"] for i in inspect(engine).get_indexes("memgnn_samples")}
    engine.dispose()
    return names


def test_an_old_database_gains_the_provenance_columns(db_url):
    _first_release_table(db_url)
    store = Store(db_url, prior=0)
    store.add_sample(sample(1300, principal="token", client="10.0.0.7", source="run-3"))
    rows = store.samples("g1")
    assert [r["source"] for r in rows] == ["run-3", None]  # the old row is kept
    assert rows[0]["principal"] == "token" and rows[0]["client"] == "10.0.0.7"
    assert store.correction("g1", "h100-80gb", "reserved", "v1").samples == 2
    store.close()


def test_replicas_starting_together_on_an_old_database(db_url):
    """Several stores opening one old database at once (replicas starting together) all
    start; it is migrated once."""
    _first_release_table(db_url)
    stores, errors = [], []

    def open_store() -> None:
        try:
            stores.append(Store(db_url, prior=0))
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=open_store) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(stores) == 4
    assert "ix_memgnn_samples_writer" in _indexes(db_url)
    stores[0].add_sample(sample(1300, principal="token"))
    assert stores[3].correction("g1", "h100-80gb", "reserved", "v1").samples == 2
    for s in stores:
        s.close()


def test_an_old_database_migrates_to_per_writer_corrections(db_url):
    """A database of the last release (provenance columns, no writer index) gains the
    index; its rows count as the writers they name, unnamed ones as "unknown"."""
    old = Store(db_url, prior=0)
    with old.engine.begin() as conn:
        conn.exec_driver_sql("DROP INDEX ix_memgnn_samples_writer")
    for m in (1100, 1100):
        old.add_sample(sample(m, principal="token"))
    old.add_sample(sample(1100))  # no principal (rows from before provenance)
    old.close()
    assert "ix_memgnn_samples_writer" not in _indexes(db_url)
    store = Store(db_url, prior=0)
    assert "ix_memgnn_samples_writer" in _indexes(db_url)
    store.add_sample(sample(1100, principal="alice"))
    c = store.correction("g1", "h100-80gb", "reserved", "v1")
    assert (c.samples, c.writers) == (4, 3)  # token, unknown, alice: they agree
    assert c.peak_scale == pytest.approx(1.1) and not c.capped
    store.close()


def test_each_writer_keeps_its_own_window(db_url):
    """A flood from one writer does not push the others' samples out of the window."""
    store = Store(db_url, window=4, prior=0)
    for name in ("alice", "bob"):
        store.add_sample(sample(1100, principal=name))
    for _ in range(50):
        store.add_sample(sample(100, principal="mallory"))
    c = store.correction("g1", "h100-80gb", "reserved", "v1")
    assert (c.samples, c.writers) == (1 + 1 + 4, 3)
    assert c.peak_scale == pytest.approx(1.1)  # the median: the honest writers' 1.1
    store.close()


def test_replicas_racing_on_one_key_store_it_once(db_url):
    """Two stores (replicas) sent the same keyed samples at once: each key is stored
    once, and every caller gets that row's id."""
    a, b = (Store(db_url, prior=0) for _ in range(2))
    got: dict[str, list[tuple[int, bool]]] = {}
    lock, errors = threading.Lock(), []

    def write(store: Store, start: int) -> None:
        try:
            for i in range(start, start + 30):
                res = store.add_sample(sample(1000 + i % 7, key=f"race-{i % 30}"))
                with lock:
                    got.setdefault(f"race-{i % 30}", []).append(res)
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(s, k)) for s in (a, b) for k in (0, 15)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and a.count_samples() == 30
    for results in got.values():
        assert len(results) == 4 and len({r[0] for r in results}) == 1
        assert sum(created for _, created in results) == 1
    a.close(), b.close()


def test_a_large_graph_blob_round_trips(store):
    """A graph near the upload limit (32 MiB of gzip) is stored and read back intact."""
    blob = b"\x1f\x8b" + bytes(range(256)) * (24 * 4096)  # 24 MiB
    assert store.put_graph("big", blob, 10**5) is True
    assert store.get_graph("big") == blob
