"""A throwaway PostgreSQL server for the tests: `initdb` + `pg_ctl` in a temp folder.

    with postgres_server() as pg:          # PostgresUnavailable (a reason) if it cannot
        url = pg.create_database("t1")     # postgresql+psycopg://memgnn@127.0.0.1:PORT/t1

PostgreSQL refuses to run as root: as root the server runs as the `postgres` system user
(else `nobody`) through subprocess's `user=`, in a temp folder that user owns; as any
other user it runs as that user. It listens on 127.0.0.1 on a free port (its unix socket
in the temp folder), trusts local connections (user `memgnn`, no password) and runs
with fsync off: it is thrown away, and the tests kill memgnn's servers, never it.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

USER = "memgnn"  # the database superuser initdb creates
SEARCH = ("/usr/local/bin", "/usr/lib/postgresql/*/bin", "/usr/local/pgsql/bin")


class PostgresUnavailable(RuntimeError):
    """Why no server could be started here (a test skips with it)."""


def find_bin_dir() -> Path:
    """The folder holding `initdb`, `pg_ctl` and `postgres` ($PATH first)."""
    initdb = shutil.which("initdb")
    candidates = [Path(initdb).parent] if initdb else []
    for pattern in SEARCH:
        found = sorted(Path("/").glob(pattern.lstrip("/")), reverse=True)  # newest major first
        candidates.extend(found)
    for folder in candidates:
        if all(os.access(folder / b, os.X_OK) for b in ("initdb", "pg_ctl", "postgres")):
            return folder
    raise PostgresUnavailable(f"no PostgreSQL binaries (initdb, pg_ctl) on $PATH or in {SEARCH}")


def _run_as() -> pwd.struct_passwd | None:
    """The user to run PostgreSQL as: None for this one, a system user when root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    raise PostgresUnavailable("running as root and no postgres/nobody user to switch to")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(kw_only=True, slots=True)
class PostgresServer:
    bin_dir: Path
    root: Path  # the temp folder: data/, the socket, the log
    port: int
    user: pwd.struct_passwd | None

    @property
    def data(self) -> Path:
        return self.root / "data"

    def url(self, database: str) -> str:
        return f"postgresql+psycopg://{USER}@127.0.0.1:{self.port}/{database}"

    def _run(self, *args: str, timeout: float = 120) -> None:
        kw = {} if self.user is None else {"user": self.user.pw_uid, "group": self.user.pw_gid}
        if self.user is not None:
            kw["extra_groups"] = []
        env = os.environ | {"LC_ALL": "C", "LANG": "C", "PGTZ": "UTC"}
        try:
            done = subprocess.run(
                [str(self.bin_dir / args[0]), *args[1:]],
                cwd=self.root,
                env=env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=timeout,
                **kw,
            )
        except PermissionError as exc:  # cannot switch user
            raise PostgresUnavailable(f"cannot run {args[0]} as {self.user}: {exc}") from None
        except subprocess.TimeoutExpired:
            raise PostgresUnavailable(f"{args[0]} took over {timeout} s") from None
        if done.returncode != 0:
            log = self.root / "server.log"
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise PostgresUnavailable(
                f"{' '.join(args[:2])} failed ({done.returncode}): {done.stderr[-2000:]}{tail}"
            )

    def start(self) -> None:
        self._run("initdb", "-D", str(self.data), "-U", USER, "--auth=trust", "--no-sync",
                  "--encoding=UTF8", "--locale=C")  # fmt: skip
        options = (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200 "
            "-c shared_buffers=32MB"
        )
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "server.log"),
                  "-o", options, "-w", "-t", "60", "start")  # fmt: skip

    def stop(self) -> None:
        with contextlib.suppress(PostgresUnavailable):
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop", timeout=60)

    def _admin(self, sql: str) -> None:
        import psycopg

        with psycopg.connect(
            host="127.0.0.1", port=self.port, user=USER, dbname="postgres", autocommit=True
        ) as conn:
            conn.execute(sql)

    def create_database(self, name: str) -> str:
        """A new empty database; its SQLAlchemy URL."""
        self._admin(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def drop_database(self, name: str) -> None:
        self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.contextmanager
def postgres_server() -> Iterator[PostgresServer]:
    """Start a server (PostgresUnavailable if this machine cannot), yield it, stop it and
    remove its folder."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        raise PostgresUnavailable(
            "the psycopg driver is not installed (pip install 'memgnn[postgres]')"
        ) from None
    bin_dir, user = find_bin_dir(), _run_as()
    root = Path(tempfile.mkdtemp(prefix="memgnn-pg-"))  # short: a socket path has <108 bytes
    try:
        if user is not None:
            os.chown(root, user.pw_uid, user.pw_gid)
        root.chmod(0o700)
        for attempt in range(3):  # another process may take the free port first
            server = PostgresServer(bin_dir=bin_dir, root=root, port=_free_port(), user=user)
            try:
                server.start()
                break
            except PostgresUnavailable as exc:
                if "could not bind" not in str(exc) or attempt == 2:
                    raise
                shutil.rmtree(server.data, ignore_errors=True)
        try:
            yield server
        finally:
            server.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


__all__ = ["PostgresServer", "PostgresUnavailable", "find_bin_dir", "postgres_server"]
