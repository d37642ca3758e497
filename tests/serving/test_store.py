"""The residual store: durable samples, correction statistics, graphs, SQLite settings."""

from __future__ import annotations

import math
import sqlite3
import threading

import pytest
from memgnn.predictor.answer.types import Correction
from memgnn.serving.store import RATIO_MAX, Sample, Store, correction_from, ratio


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
def store(tmp_path):
    # plain one-writer stats: no prior, no bound on one writer's reach
    url = f"sqlite:///{tmp_path / 'deep' / 'samples.db'}"
    s = Store(url, window=4, prior=0, writer_max_scale=4.0)
    yield s
    s.close()


def test_sqlite_runs_in_wal_with_full_sync(store, tmp_path):
    with store.engine.connect() as conn:
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


def test_committed_samples_are_visible_to_another_connection(store, tmp_path):
    store.add_sample(sample(1234))
    # no close, no checkpoint: a fresh sqlite3 connection (as after a crash) sees the row
    conn = sqlite3.connect(tmp_path / "deep" / "samples.db")
    assert conn.execute("SELECT measured_bytes FROM memgnn_samples").fetchall() == [(1234,)]
    conn.close()


def test_two_stores_share_one_database(tmp_path):
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    a, b = (Store(url, prior=0, writer_max_scale=4.0) for _ in range(2))  # two replicas
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


def test_an_old_database_gains_the_provenance_columns(tmp_path):
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)  # the table as the first release created it
    conn.execute(
        "CREATE TABLE memgnn_samples (id INTEGER PRIMARY KEY, key VARCHAR(128) UNIQUE, "
        "graph_id VARCHAR(64), device VARCHAR(64), metric VARCHAR(32), "
        "model_version VARCHAR(128), scenario VARCHAR(16), sizes TEXT, "
        "measured_bytes BIGINT, predicted_bytes BIGINT, bound_bytes BIGINT, "
        "peak_ratio FLOAT, bound_ratio FLOAT, created_at FLOAT)"
    )
    conn.execute(
        "INSERT INTO memgnn_samples VALUES (1, NULL, 'g1', 'h100-80gb', 'reserved', 'v1', "
        "'worst', '{}', 1100, 1000, 1000, 1.1, 1.1, 0)"
    )
    conn.commit(), conn.close()
    store = Store(f"sqlite:///{path}", prior=0)
    store.add_sample(sample(1300, principal="token", client="10.0.0.7", source="run-3"))
    rows = store.samples("g1")
    assert [r["source"] for r in rows] == ["run-3", None]  # the old row is kept
    assert rows[0]["principal"] == "token" and rows[0]["client"] == "10.0.0.7"
    assert store.correction("g1", "h100-80gb", "reserved", "v1").samples == 2
    store.close()


def test_an_old_database_migrates_to_per_writer_corrections(tmp_path):
    """A database of the last release (provenance columns, no writer index) gains the
    index; its rows count as the writers they name, unnamed ones as "unknown"."""
    path = tmp_path / "prev.db"
    old = Store(f"sqlite:///{path}", prior=0)
    with old.engine.begin() as conn:
        conn.exec_driver_sql("DROP INDEX ix_memgnn_samples_writer")
    for m in (1100, 1100):
        old.add_sample(sample(m, principal="token"))
    old.add_sample(sample(1100))  # no principal (rows from before provenance)
    old.close()
    conn = sqlite3.connect(path)
    assert "ix_memgnn_samples_writer" not in {
        r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")
    }
    conn.close()
    store = Store(f"sqlite:///{path}", prior=0)
    conn = sqlite3.connect(path)
    assert "ix_memgnn_samples_writer" in {
        r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")
    }
    conn.close()
    store.add_sample(sample(1100, principal="alice"))
    c = store.correction("g1", "h100-80gb", "reserved", "v1")
    assert (c.samples, c.writers) == (4, 3)  # token, unknown, alice: they agree
    assert c.peak_scale == pytest.approx(1.1) and not c.capped
    store.close()


def test_each_writer_keeps_its_own_window(tmp_path):
    """A flood from one writer does not push the others' samples out of the window."""
    store = Store(f"sqlite:///{tmp_path / 'w.db'}", window=4, prior=0)
    for name in ("alice", "bob"):
        store.add_sample(sample(1100, principal=name))
    for _ in range(50):
        store.add_sample(sample(100, principal="mallory"))
    c = store.correction("g1", "h100-80gb", "reserved", "v1")
    assert (c.samples, c.writers) == (1 + 1 + 4, 3)
    assert c.peak_scale == pytest.approx(1.1)  # the median: the honest writers' 1.1
    store.close()
