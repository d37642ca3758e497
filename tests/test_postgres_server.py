"""The test suite's throwaway PostgreSQL (tests/postgres_server.py) says why it cannot
start, so the tests needing it skip instead of failing."""

from __future__ import annotations

import postgres_server
import pytest
from postgres_server import PostgresUnavailable
from postgres_server import postgres_server as start


def test_no_binaries_is_a_reason_not_a_failure(monkeypatch, tmp_path):
    pytest.importorskip("psycopg")
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(postgres_server, "SEARCH", ())
    with pytest.raises(PostgresUnavailable, match="no PostgreSQL binaries"):
        with start():
            pass


def test_no_driver_is_a_reason_not_a_failure(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "psycopg", None)  # import psycopg: ImportError
    with pytest.raises(PostgresUnavailable, match="memgnn\\[postgres\\]"):
        with start():
            pass
