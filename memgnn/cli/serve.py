"""`memgnn serve`: argument parsing and the uvicorn launch.

    memgnn serve --host 127.0.0.1 --port 8000 [--model PATH|URI] [--db URL] [--token T]
                 [--writer NAME:TOKEN ... | --tokens-file FILE] [--workers K]

One worker runs the app object in-process; several workers import
`memgnn.serving.app:app_from_env` (the config travels in environment variables).
"""

from __future__ import annotations

import argparse
import logging
import os

import uvicorn

from memgnn.serving.config import TOKEN_ENV_VAR, ServeConfig, default_state_dir
from memgnn.serving.ratelimit import RateLimit
from memgnn.serving.server import GRACEFUL_S, Server
from memgnn.serving.writers import (
    TOKENS_ENV_VAR,
    parse_writers,
    read_tokens_file,
    writers_from_env,
)

log = logging.getLogger(__name__)


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """The `memgnn serve` options."""
    g = parser.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback)")
    g.add_argument("--port", type=int, default=8000)
    g.add_argument("--workers", type=int, default=1, help="uvicorn worker processes")
    g.add_argument(
        "--model",
        default=None,
        help="model: default | analytic | DIR | models:/NAME@ALIAS (mlflow)",
    )
    g.add_argument(
        "--db", default=None, help="database URL (default: sqlite:///STATE_DIR/samples.db)"
    )
    g.add_argument(
        "--state-dir",
        default=None,
        help=f"state folder (default: $MEMGNN_STATE or {default_state_dir()})",
    )
    g.add_argument(
        "--token", default=None, help=f"bearer token for write endpoints (or ${TOKEN_ENV_VAR})"
    )
    g.add_argument(
        "--writer",
        action="append",
        default=None,
        metavar="NAME:TOKEN",
        help="a named write credential (repeatable; each sample records its writer, and "
        f"no single writer controls the live correction); also ${TOKENS_ENV_VAR}",
    )
    g.add_argument(
        "--tokens-file",
        default=None,
        metavar="FILE",
        help="named write credentials, one NAME:TOKEN a line (# comments)",
    )
    g.add_argument(
        "--writer-max-scale",
        type=float,
        default=None,
        help="how far one writer alone may move an answer, either way (1.25)",
    )
    g.add_argument("--capture-timeout", type=float, default=None, help="seconds per capture (120)")
    g.add_argument("--max-request-bytes", type=int, default=None)
    g.add_argument("--max-nodes", type=int, default=None)
    g.add_argument("--graph-cache", type=int, default=None, help="graphs kept in memory")
    g.add_argument("--blas-threads", type=int, default=None, help="BLAS threads per worker (1)")
    g.add_argument(
        "--allow-anonymous-writes",
        action="store_true",
        help="accept uploads and samples without a token (trusted networks only; "
        "default: writes need --token, else they are refused)",
    )
    g.add_argument(
        "--allow-local-specs",
        action="store_true",
        help="accept hf:PATH and py:module:factory specs (trusted clients only)",
    )
    g.add_argument(
        "--snapshot-rate", type=float, default=None, metavar="PER_MIN",
        help="POST /snapshots/replay (no token needed): calls a minute per client "
        "(30, bursts of 8)",
    )  # fmt: skip
    g.add_argument(
        "--snapshot-slots", type=int, default=None, metavar="N",
        help="POST /snapshots/replay: replays at once across clients (1); past it, 429",
    )  # fmt: skip
    g.add_argument(
        "--log-level", default="info", choices=("critical", "error", "warning", "info", "debug")
    )


def config_from_args(args: argparse.Namespace) -> ServeConfig:
    """A validated ServeConfig from parsed `memgnn serve` arguments (ValueError if bad)."""
    writers = writers_from_env(os.environ.get(TOKENS_ENV_VAR))
    for more in (
        read_tokens_file(args.tokens_file) if args.tokens_file else {},
        parse_writers(args.writer or [], where="--writer"),
    ):
        twice = sorted(set(writers) & set(more))
        if twice:
            raise ValueError(f"writer {twice[0]!r} given twice")
        writers.update(more)
    fields: dict = {
        "model": args.model,
        "database_url": args.db,
        "token": args.token or os.environ.get(TOKEN_ENV_VAR) or None,
        "writers": writers,
        "allow_local_specs": args.allow_local_specs,
        "allow_anonymous_writes": args.allow_anonymous_writes,
    }
    if args.state_dir:
        fields["state_dir"] = args.state_dir
    for arg, name in (
        ("max_request_bytes", "max_request_bytes"),
        ("max_nodes", "max_nodes"),
        ("graph_cache", "graph_cache_size"),
        ("blas_threads", "blas_threads"),
        ("capture_timeout", "capture_timeout_s"),
        ("writer_max_scale", "correction_writer_max_scale"),
    ):
        value = getattr(args, arg)
        if value is not None:
            fields[name] = value
    given = {"rate_per_min": args.snapshot_rate, "slots": args.snapshot_slots}
    fields["snapshot_limit"] = RateLimit(**{k: v for k, v in given.items() if v is not None})
    return ServeConfig(**fields)


def serve_cmd(args: argparse.Namespace) -> int:
    """Run the server until interrupted; returns the exit status."""
    if not 0 < args.port < 65536:
        raise ValueError(f"--port must be in 1..65535, got {args.port}")
    if args.workers < 1:
        raise ValueError(f"--workers must be >= 1, got {args.workers}")
    config = config_from_args(args)
    if not config.has_writers and config.allow_anonymous_writes:
        log.warning("serving on %s without a token: write endpoints are open", args.host)
    elif not config.has_writers:
        log.info("no --token/--writer: write endpoints (uploads, samples, reloads) are refused")
    common = {
        "host": args.host,
        "port": args.port,
        "log_level": args.log_level,
        "timeout_graceful_shutdown": GRACEFUL_S,
    }
    if args.workers == 1:
        from memgnn.serving.app import create_app

        app = create_app(config)
        Server(uvicorn.Config(app, **common), app).run()
    else:
        os.environ.update(config.to_env())
        uvicorn.run("memgnn.serving.app:app_from_env", factory=True, workers=args.workers, **common)
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_serve_arguments(p)
    p.set_defaults(func=serve_cmd)
