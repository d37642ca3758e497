"""Write credentials with names: who sent a sample (issue 27).

A server may hold several writers, each a NAME and its bearer TOKEN: `--writer NAME:TOKEN`
(repeatable), `--tokens-file FILE` (one `NAME:TOKEN` a line; blank lines and `#` comments
skipped), `$MEMGNN_TOKENS` (`NAME:TOKEN` items separated by commas or newlines). The
single `--token T` (`$MEMGNN_TOKEN`) stays the writer "token". A request's writer name is
stored with its sample (`principal`) and the live correction is combined across writers
(`serving.corrections`), so no one credential holder controls it.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterable, Mapping
from pathlib import Path

TOKENS_ENV_VAR = "MEMGNN_TOKENS"
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$")
RESERVED = frozenset({"token", "anonymous", "unknown"})  # names the server gives itself


def parse_writer(item: str, *, where: str = "writer") -> tuple[str, str]:
    """`NAME:TOKEN` -> (name, token); ValueError naming `where` if malformed."""
    name, sep, token = item.strip().partition(":")
    if not sep or not NAME_RE.match(name):
        raise ValueError(
            f"{where}: expected NAME:TOKEN with NAME of letters, digits, _.@- "
            f"(at most 64), got {_redacted(item)!r}"
        )
    check_writer(name, token, where=where)
    return name, token


def check_writer(name: str, token: str, *, where: str = "writer") -> None:
    if not NAME_RE.match(name):
        raise ValueError(f"{where}: bad writer name {name!r} (letters, digits, _.@-)")
    if name in RESERVED:
        raise ValueError(f"{where}: writer name {name!r} is reserved ({sorted(RESERVED)})")
    if not token.strip() or token != token.strip() or len(token) > 4096:
        raise ValueError(f"{where}: writer {name!r} has a blank or padded token")


def parse_writers(items: Iterable[str], *, where: str = "writer") -> dict[str, str]:
    """Several `NAME:TOKEN` items -> {name: token}; a name or a token given twice is an
    error (a shared token could not say who wrote)."""
    out: dict[str, str] = {}
    for item in items:
        name, token = parse_writer(item, where=where)
        if name in out:
            raise ValueError(f"{where}: writer {name!r} given twice")
        out[name] = token
    check_distinct(out, where=where)
    return out


def check_distinct(writers: Mapping[str, str], *, where: str = "writers") -> None:
    if len(set(writers.values())) != len(writers):
        raise ValueError(f"{where}: two writers share a token")


def read_tokens_file(path: str | Path) -> dict[str, str]:
    """A `--tokens-file`: one `NAME:TOKEN` a line; blank lines and `#` comments skipped."""
    try:
        text = Path(path).expanduser().read_text()
    except OSError as exc:
        raise ValueError(f"--tokens-file {path}: {exc.strerror or exc}") from None
    items = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            items.append(line)
    return parse_writers(items, where=f"--tokens-file {path}")


def writers_from_env(value: str | None) -> dict[str, str]:
    """`$MEMGNN_TOKENS`: `NAME:TOKEN` items separated by commas or newlines."""
    if not value:
        return {}
    items = [x for x in re.split(r"[,\n]", value) if x.strip()]
    return parse_writers(items, where=f"${TOKENS_ENV_VAR}")


def writers_to_env(writers: Mapping[str, str]) -> str:
    return ",".join(f"{name}:{token}" for name, token in writers.items())


def writer_of(writers: Mapping[str, str], presented: str) -> str | None:
    """The name whose token is `presented`, else None. Every token is compared (in
    constant time each), so the time taken does not say which one nearly matched."""
    found = None
    given = presented.encode()
    for name, token in writers.items():
        if secrets.compare_digest(given, token.encode()):
            found = name
    return found


def _redacted(item: str) -> str:
    name, sep, _ = item.strip().partition(":")
    return f"{name}:***" if sep else "***"


__all__ = [
    "TOKENS_ENV_VAR",
    "check_writer",
    "parse_writers",
    "read_tokens_file",
    "writer_of",
    "writers_from_env",
    "writers_to_env",
]
