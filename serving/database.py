"""Opening a database URL for `serving.store`: the driver, SQLite's durability settings,
and the URL as messages and logs show it (without its password).

`postgresql://` names SQLAlchemy's default driver, psycopg2; with only psycopg (3)
installed (`pip install 'memgnn[postgres]'`) the URL uses that one. A SQLite database
runs in WAL mode with synchronous=FULL (a committed sample survives a kill -9 and a
power cut) and its parent folders are created.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url


def open_engine(url: str) -> tuple[Engine, str]:
    """(engine, the URL to show); ValueError for a bad URL or a missing driver."""
    url = _with_driver(url)
    shown = make_url(url).render_as_string(hide_password=True)
    kwargs: dict[str, Any] = {"pool_pre_ping": True}
    if url.startswith("sqlite"):
        kwargs["connect_args"] = {"check_same_thread": False, "timeout": 10}
        _make_parent(url)
    try:
        engine = create_engine(url, **kwargs)
    except Exception as exc:  # bad URL, missing driver
        raise ValueError(f"cannot open database {shown!r}: {exc}") from None
    if engine.dialect.name == "sqlite":
        event.listen(engine, "connect", _sqlite_pragmas)
    return engine, shown


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA busy_timeout=10000")
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=FULL")
    cur.close()


def _with_driver(url: str) -> str:
    """The URL with psycopg as its driver where it names none and psycopg2 is absent."""
    try:
        parsed = make_url(url)
    except Exception as exc:  # unparsable URL
        raise ValueError(f"bad database URL {url!r}: {exc}") from None
    if parsed.drivername != "postgresql" or importlib.util.find_spec("psycopg2") is not None:
        return url
    if importlib.util.find_spec("psycopg") is None:
        return url  # create_engine names the missing driver
    return parsed.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)


def _make_parent(url: str) -> None:
    try:
        database = make_url(url).database
    except Exception as exc:  # unparsable URL
        raise ValueError(f"bad database URL {url!r}: {exc}") from None
    if database and database != ":memory:" and not database.startswith("file:"):
        Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)


__all__ = ["open_engine"]
