"""Captures of model specs in a child process the server can kill.

A symbolic capture runs the model's own code for seconds to minutes, and a capture in a
thread cannot be interrupted. So the server sends a spec (name, hparams, training spec,
target) to a worker process (spawned once, torch imported once, reused), waits without
holding any lock that cached-graph requests need, and kills the worker when the capture
runs past `capture_timeout_s`, when the request's own budget or capture count runs out,
when the client goes away, or when the server shuts down. The next capture spawns a
fresh worker. The worker answers with the graph file's bytes (`graph_bytes`); the server
validates them like an upload.

`Work` is one request's budget: a deadline, a capture count, and a cancel flag.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from memgnn.serving.graphs import RequestError

log = logging.getLogger(__name__)

POLL_S = 0.05


@dataclass(kw_only=True, slots=True)
class Work:
    """A request's budget for captures: `deadline` (time.monotonic), `max_captures`, and
    `cancelled` (set when the client disconnects or the server stops)."""

    deadline: float
    max_captures: int
    captures: int = 0
    cancelled: threading.Event = field(default_factory=threading.Event)

    @classmethod
    def unbounded(cls) -> Work:
        return cls(deadline=float("inf"), max_captures=1 << 30)

    def take_capture(self, what: str) -> None:
        if self.captures >= self.max_captures:
            raise RequestError(
                f"this request needs more than {self.max_captures} captures (the server's "
                f"limit, max_captures_per_request) to answer for {what}; ask for fewer "
                "variants or upload graphs captured locally",
                status=413,
                loc=("body", "model"),
            )
        self.captures += 1

    def check(self) -> None:
        if self.cancelled.is_set():
            raise RequestError("request cancelled", status=503, loc=("body",))
        if time.monotonic() > self.deadline:
            raise RequestError(
                "request ran past the server's time limit (request_timeout_s)",
                status=503,
                loc=("body",),
            )


def _worker_main(conn: Any) -> None:  # pragma: no cover - runs in the child process
    """The child: capture each job it is sent, answer ("ok", gzip bytes) or an error."""
    from memgnn.predictor.capture.cache import capture_cached
    from memgnn.predictor.quiet import filter_noise
    from memgnn.predictor.spec.train import TrainSpec
    from memgnn.predictor.zoo import resolve
    from memgnn.serving.graphs import graph_bytes

    filter_noise()  # the libraries' import notes, as in the CLI (predictor.quiet)
    conn.send(("ready",))
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            return
        try:
            bundle = resolve(job["spec"], job["model_args"], job["task"])
            graph = capture_cached(
                bundle,
                TrainSpec.of(**job["train"]),
                target=job["target"],
                sm=job["sm"],
                sizes=job["sizes"],
            )
            conn.send(("ok", graph_bytes(graph)))
        except ValueError as exc:
            conn.send(("user", str(exc)))
        except Exception as exc:  # the model's own code failed on these hparams
            conn.send(("error", f"{type(exc).__name__}: {exc}"))


class CaptureWorker:
    """One capture at a time in one killable child process (see the module docstring)."""

    def __init__(self, *, timeout_s: float, start_timeout_s: float = 120.0):
        self.timeout_s, self.start_timeout_s = timeout_s, start_timeout_s
        self._lock = threading.Lock()  # one capture in the child at a time
        self._state = threading.Lock()  # guards _proc / _conn / _closed
        self._proc: Any = None
        self._conn: Any = None
        self._closed = False

    def _start(self, work: Work) -> None:
        ctx = mp.get_context("spawn")  # no fork of a threaded server
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_worker_main, args=(child,), name="memgnn-capture", daemon=True)
        proc.start()
        child.close()
        with self._state:
            if self._closed:
                proc.kill()
                raise RequestError("the server is shutting down", status=503, loc=("body",))
            self._proc, self._conn = proc, parent
        self._wait(work, time.monotonic() + self.start_timeout_s, "start")

    def _wait(self, work: Work, until: float, what: str) -> tuple:
        conn = self._conn
        while True:
            if self._closed:
                self.kill()
                raise RequestError("the server is shutting down", status=503, loc=("body",))
            try:
                work.check()
            except RequestError:
                self.kill()
                raise
            if time.monotonic() > until:
                self.kill()
                raise RequestError(
                    f"capture did not {what} within {self.timeout_s:g} s "
                    "(capture_timeout_s); capture locally and upload the graph instead",
                    status=503,
                    loc=("body", "model"),
                )
            try:
                if conn.poll(POLL_S):
                    return conn.recv()
            except (EOFError, OSError):
                self.kill()
                if self._closed:
                    raise RequestError(
                        "the server is shutting down", status=503, loc=("body",)
                    ) from None
                raise RequestError(
                    "the capture worker exited (killed, or out of memory)",
                    status=503,
                    loc=("body", "model"),
                ) from None

    def capture(self, job: dict[str, Any], work: Work) -> bytes:
        """The gzip graph bytes of `job`; RequestError on a timeout, a cancel, a model
        that cannot be captured (422) or shutdown (503)."""
        while not self._lock.acquire(timeout=POLL_S):  # queue behind the capture in flight
            if self._closed:
                raise RequestError("the server is shutting down", status=503, loc=("body",))
            work.check()
        try:
            if self._proc is None or not self._proc.is_alive():
                self._start(work)
            self._conn.send(job)
            reply = self._wait(work, time.monotonic() + self.timeout_s, "finish")
        finally:
            self._lock.release()
        if reply[0] == "ok":
            return reply[1]
        msg = f"cannot capture {job['spec']}: {reply[1]}"
        if reply[0] == "error":
            log.warning("%s", msg)
        raise RequestError(msg, loc=("body", "model"))

    def kill(self) -> None:
        """Stop the child now (a capture in flight is lost; the next one respawns)."""
        with self._state:
            proc, conn = self._proc, self._conn
            self._proc = self._conn = None
        if proc is not None and proc.is_alive():
            proc.kill()
            proc.join(5)
            log.info("capture worker %s stopped", proc.pid)
        if conn is not None:
            conn.close()

    def close(self) -> None:
        """Shutdown: kill the child; waiting and later captures answer 503."""
        with self._state:
            self._closed = True
        self.kill()


__all__ = ["CaptureWorker", "Work"]
