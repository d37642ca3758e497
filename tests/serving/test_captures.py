"""A request's capture budget (`serving.captures.Work`); the worker process itself is
exercised end to end in test_api_captures.py."""

from __future__ import annotations

import time

import pytest
from memgnn.serving.captures import CaptureWorker, Work
from memgnn.serving.graphs import RequestError


def test_a_request_takes_at_most_its_captures():
    work = Work(deadline=time.monotonic() + 60, max_captures=2)
    work.take_capture("m")
    work.take_capture("m")
    with pytest.raises(RequestError) as err:
        work.take_capture("m")
    assert err.value.status == 413 and "max_captures_per_request" in str(err.value)


def test_deadline_and_cancel_stop_the_work():
    late = Work(deadline=time.monotonic() - 1, max_captures=1)
    with pytest.raises(RequestError, match="time limit"):
        late.check()
    work = Work.unbounded()
    work.check()
    work.cancelled.set()
    with pytest.raises(RequestError, match="cancelled"):
        work.check()


def test_a_closed_worker_refuses_captures_without_starting_a_process():
    worker = CaptureWorker(timeout_s=5)
    worker.close()
    with pytest.raises(RequestError) as err:
        worker.capture({"spec": "mlp"}, Work.unbounded())
    assert err.value.status == 503 and worker._proc is None
