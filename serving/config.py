"""Server configuration: one validated dataclass, from arguments or from the environment.

`ServeConfig.to_env()` / `ServeConfig.from_env()` carry the config to uvicorn worker
processes (several workers import the app by name, so they cannot receive an object).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from memgnn.serving.ratelimit import RateLimit
from memgnn.serving.writers import (
    TOKENS_ENV_VAR,
    check_distinct,
    check_writer,
    writer_of,
    writers_from_env,
    writers_to_env,
)

ENV_VAR = "MEMGNN_SERVE_CONFIG"
TOKEN_ENV_VAR = "MEMGNN_TOKEN"
MiB = 1 << 20


def default_state_dir() -> Path:
    """Where the server keeps its database: $MEMGNN_STATE, else ~/.local/state/memgnn."""
    return Path(os.environ.get("MEMGNN_STATE", Path.home() / ".local" / "state" / "memgnn"))


@dataclass(kw_only=True, slots=True)
class ServeConfig:
    """What a server process needs. Every limit is checked per request.

    - `model`: None or "default" (the shipped learned model, else the analytic baseline),
      "analytic", a directory with an exported model, or an mlflow model URI
      (`models:/NAME@ALIAS`, `models:/NAME/VERSION`, `runs:/ID/PATH`).
    - `database_url`: any SQLAlchemy URL; default `sqlite:///<state_dir>/samples.db` (WAL,
      synchronous=FULL). Replicas that share one database share samples and graphs.
    - `token`: bearer token required on write endpoints (`POST /graphs`, `/samples`,
      `/admin/reload`). Without one the server refuses writes unless
      `allow_anonymous_writes` (a trusted network only: anyone reaching the port could
      poison the corrections every client gets). The writer "token".
    - `writers`: more write credentials, {NAME: TOKEN} (`--writer NAME:TOKEN`,
      `--tokens-file`, `$MEMGNN_TOKENS`: `serving.writers`); each sample records its
      writer's name (`principal`).
    - `allow_local_specs`: accept `hf:PATH` and `py:module:factory` model specs (they read
      server files and import code: only for trusted clients). Zoo names always work.
    - `correction_prior`: how many samples' worth of trust the model's own answer gets
      (the log-correction of n samples is shrunk by n / (n + prior)); 1 by default: on
      the accuracy benchmark a fully trusted single sample made the reserved p95 worse
      (15.95% -> 19.05%, `benchmarks/results/accuracy.md`, "gnn + 1 live"), so one sample
      moves an answer half-way. `correction_max_scale`: no correction scales an answer
      by more than this factor, either way.
    - `correction_writer_max_scale` (1.25): no single writer controls a correction. Each
      writer's own samples make its own correction, and the writers' corrections are
      combined by their median (`serving.corrections`), clamped so that one writer
      alone, however many samples it sends, moves an answer by at most this factor
      either way (k agreeing writers: this factor**k, never past
      `correction_max_scale`), and a writer among others cannot take the answer outside
      the range of the others' corrections. Set it to `correction_max_scale` to trust a
      single writer fully (the behaviour before issue 27).
    - Captures of model specs (`/predict`, `/plan` with `model`) run in a worker process
      that is killed past `capture_timeout_s`; a request may run `max_captures_per_request`
      captures within `request_timeout_s`; a zoo model's integer hparams may not exceed
      `max_hparam_scale` x the largest value of the zoo's range (or default).
    - `blas_threads`: BLAS threads per server process (numpy's live-byte curves). Requests
      are small; extra BLAS threads only spin and take the CPU other workers need.
    - `replay_budget_ms`: a request's default time budget for the exact replay (`method`
      auto replays when its estimate fits; requests may pass their own);
      `warm_replay`: compile the replay JIT in the background at start (`serving.routing`);
      `replay_wait_s`: how long a request asking `method: replay` waits for it.
    - `snapshot_limit`: `POST /snapshots/replay` needs no token (it stores nothing) and
      is bounded instead (`serving.ratelimit`): per client (its writer name with a valid
      token, else its address) `rate_per_min` calls a minute in bursts of `burst`, and
      `slots` replays at once across clients; past either, 429 with Retry-After.
    """

    model: str | None = None
    state_dir: Path = field(default_factory=default_state_dir)
    database_url: str | None = None
    token: str | None = None
    writers: dict[str, str] = field(default_factory=dict)
    max_request_bytes: int = 32 * MiB
    max_decompressed_bytes: int = 256 * MiB
    max_nodes: int = 200_000
    max_configs: int = 256
    graph_cache_size: int = 64
    correction_window: int = 32
    correction_prior: float = 1.0
    correction_max_scale: float = 4.0
    correction_writer_max_scale: float = 1.25
    correction_ttl_s: float = 1.0
    allow_local_specs: bool = False
    capture_timeout_s: float = 120.0
    request_timeout_s: float = 300.0
    max_captures_per_request: int = 8
    max_hparam_scale: float = 8.0
    allow_anonymous_writes: bool = False
    blas_threads: int = 1
    replay_budget_ms: float = 250.0
    warm_replay: bool = True
    replay_wait_s: float = 300.0
    snapshot_limit: RateLimit = field(default_factory=RateLimit)

    def __post_init__(self) -> None:
        self.state_dir = Path(self.state_dir).expanduser()
        if isinstance(self.snapshot_limit, dict):  # from_env's JSON
            self.snapshot_limit = RateLimit(**self.snapshot_limit)
        if not isinstance(self.snapshot_limit, RateLimit):
            raise ValueError(f"snapshot_limit must be a RateLimit, got {self.snapshot_limit!r}")
        if self.token is not None and not self.token.strip():
            raise ValueError("token must not be blank (leave it unset for no auth)")
        if not isinstance(self.writers, dict):
            raise ValueError("writers must be a {name: token} mapping")
        for name, token in self.writers.items():
            check_writer(name, token, where="writers")
        check_distinct({**self.writers, **({"token": self.token} if self.token else {})})
        for name in ("max_request_bytes", "max_decompressed_bytes", "max_nodes", "max_configs"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_decompressed_bytes < self.max_request_bytes:
            raise ValueError("max_decompressed_bytes must be >= max_request_bytes")
        if not 0 <= self.replay_budget_ms <= 600_000:
            raise ValueError(
                f"replay_budget_ms must be in [0, 600000], got {self.replay_budget_ms}"
            )
        if not 0 <= self.replay_wait_s <= 86_400:
            raise ValueError(f"replay_wait_s must be in [0, 86400], got {self.replay_wait_s}")
        if self.blas_threads < 1:
            raise ValueError(f"blas_threads must be >= 1, got {self.blas_threads}")
        if self.graph_cache_size < 1:
            raise ValueError(f"graph_cache_size must be >= 1, got {self.graph_cache_size}")
        if not 1 <= self.correction_window <= 10_000:
            raise ValueError(
                f"correction_window must be in [1, 10000], got {self.correction_window}"
            )
        if not 0 <= self.correction_prior <= 1000:
            raise ValueError(f"correction_prior must be in [0, 1000], got {self.correction_prior}")
        if not 1 <= self.correction_max_scale <= 1000:
            raise ValueError(
                f"correction_max_scale must be in [1, 1000], got {self.correction_max_scale}"
            )
        if not 1 <= self.correction_writer_max_scale <= self.correction_max_scale:
            raise ValueError(
                "correction_writer_max_scale must be in [1, correction_max_scale], got "
                f"{self.correction_writer_max_scale}"
            )
        for name in ("capture_timeout_s", "request_timeout_s"):
            if not 0 < getattr(self, name) <= 86_400:
                raise ValueError(f"{name} must be in (0, 86400], got {getattr(self, name)}")
        if not 1 <= self.max_captures_per_request <= 1024:
            raise ValueError(
                f"max_captures_per_request must be in [1, 1024], got "
                f"{self.max_captures_per_request}"
            )
        if self.max_hparam_scale < 1:
            raise ValueError(f"max_hparam_scale must be >= 1, got {self.max_hparam_scale}")
        if self.correction_ttl_s < 0:
            raise ValueError(f"correction_ttl_s must be >= 0, got {self.correction_ttl_s}")
        if self.database_url is not None and "://" not in self.database_url:
            raise ValueError(
                f"database_url {self.database_url!r} is not a URL "
                "(e.g. sqlite:///path/samples.db, postgresql://host/db)"
            )

    @property
    def has_writers(self) -> bool:
        """Whether any write credential is configured."""
        return self.token is not None or bool(self.writers)

    def writer_of(self, presented: str) -> str | None:
        """The writer whose credential was presented ("token" for `token`), else None."""
        return writer_of(
            {**self.writers, **({"token": self.token} if self.token else {})}, presented
        )

    @property
    def db_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{self.state_dir / 'samples.db'}"

    def to_env(self) -> dict[str, str]:
        """Environment variables that `from_env` reads back (the credentials travel
        separately, in $MEMGNN_TOKEN and $MEMGNN_TOKENS)."""
        data: dict[str, Any] = asdict(self)
        data["state_dir"] = str(self.state_dir)
        token = data.pop("token")
        writers = data.pop("writers")
        env = {ENV_VAR: json.dumps(data)}
        if token:
            env[TOKEN_ENV_VAR] = token
        if writers:
            env[TOKENS_ENV_VAR] = writers_to_env(writers)
        return env

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> ServeConfig:
        env = os.environ if environ is None else environ
        raw = env.get(ENV_VAR)
        try:
            data = json.loads(raw) if raw else {}
        except json.JSONDecodeError as exc:
            raise ValueError(f"{ENV_VAR} is not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ValueError(f"{ENV_VAR} must hold a JSON object")
        data.setdefault("token", env.get(TOKEN_ENV_VAR) or None)
        if "writers" not in data:
            data["writers"] = writers_from_env(env.get(TOKENS_ENV_VAR))
        try:
            return cls(**data)
        except TypeError as exc:
            raise ValueError(f"{ENV_VAR}: {exc}") from None
