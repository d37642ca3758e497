"""Opening a database URL (serving/database.py): the driver for a plain postgresql://
URL, SQLite's settings and folders, and no password in messages."""

from __future__ import annotations

import importlib.util

import pytest
from memgnn.serving.database import open_engine
from memgnn.serving.store import Store


def test_a_plain_postgresql_url_uses_psycopg(postgres):
    """`postgresql://` names psycopg2; with only psycopg (3) installed it is used."""
    url = postgres.create_database("plain_url")
    store = Store(url.replace("postgresql+psycopg://", "postgresql://"))
    assert store.ping()
    if importlib.util.find_spec("psycopg2") is None:
        assert store.engine.dialect.driver == "psycopg"
    store.close()
    postgres.drop_database("plain_url")


def test_messages_do_not_show_the_password():
    pytest.importorskip("psycopg")
    with pytest.raises(ValueError, match="cannot create tables") as err:
        Store("postgresql+psycopg://memgnn:s3cret@127.0.0.1:1/nothing")
    assert "s3cret" not in str(err.value) and "***" in str(err.value)


def test_sqlite_gets_its_folder_and_bad_urls_are_value_errors(tmp_path):
    engine, shown = open_engine(f"sqlite:///{tmp_path / 'a' / 'b' / 's.db'}")
    assert (tmp_path / "a" / "b").is_dir() and shown.endswith("s.db")
    engine.dispose()
    with pytest.raises(ValueError, match="cannot open database"):
        open_engine("nosuchdialect://x/y")
    with pytest.raises(ValueError, match="bad database URL"):
        open_engine("not a url")
