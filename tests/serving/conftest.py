"""Databases for the store and the API tests: SQLite, and a throwaway PostgreSQL server
(`tests/postgres_server.py`) where this machine can run one; else those cases skip,
naming why."""

from __future__ import annotations

import itertools
import os

import pytest
from postgres_server import PostgresUnavailable, postgres_server

_names = itertools.count()


@pytest.fixture(scope="session")
def postgres():
    """One PostgreSQL server for the session (each xdist worker starts its own)."""
    try:
        with postgres_server() as server:
            yield server
    except PostgresUnavailable as exc:
        pytest.skip(f"no PostgreSQL server: {exc}")


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request, tmp_path):
    """An empty database's SQLAlchemy URL: a SQLite file, or a new PostgreSQL database
    (dropped afterwards)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'samples.db'}"
        return
    server = request.getfixturevalue("postgres")
    name = f"t{os.getpid()}_{next(_names)}"
    yield server.create_database(name)
    server.drop_database(name)
