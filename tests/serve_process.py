"""`memgnn serve` in a subprocess for the tests that need a real server process (a kill -9,
several replicas): start it, wait until /readyz answers, stop it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]


def start_serve(db_url: str, port: int, *args: str, timeout_s: float = 120) -> subprocess.Popen:
    """`memgnn serve --model analytic --db DB_URL --port PORT ARGS...`, ready (/readyz 200);
    AssertionError if it exits or is not ready within `timeout_s`."""
    cmd = [sys.executable, "-m", "memgnn.cli", "serve", "--port", str(port)]
    cmd += ["--model", "analytic", "--db", db_url, "--log-level", "warning", *args]
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"server exited with {proc.returncode}"
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    proc.wait(10)
    raise AssertionError(f"server on port {port} not ready in {timeout_s} s")


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL past 20 s."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


__all__ = ["start_serve", "stop"]
