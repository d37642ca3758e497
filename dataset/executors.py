"""Where corpus jobs run: the worker function and the local / Ray executors.

`run_group(task)` is the unit of work: one config (model, hparams, TrainSpec, device) and
its jobs at several sizes. It captures the config's symbolic graph once (`capture_cached`,
cached inside the corpus folder; once per size for dims the model declares static),
profiles each job and returns plain rows plus the graphs.
It never raises for a job that fails: the row carries the error.

Executors yield `(task, result)` pairs in completion order, with a bounded number of tasks
in flight. `local` is a spawn-context process pool (workers=1 runs in-process); a task whose
worker process dies is retried alone in a fresh process, and if it dies again its jobs
become error rows. `ray` submits remote tasks (num_gpus=1 each for the cuda backend).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

EXECUTORS = ("local", "ray")
Task = dict[str, Any]
Result = dict[str, Any]


# ---- the worker function -------------------------------------------------------------------


def run_group(task: Task) -> Result:
    """Profile one config's jobs; plain data in, plain rows (+ the StepGraph) out."""
    import torch
    from memgnn.dataset.sampler import Job

    jobs = [Job.from_dict(d) for d in task["jobs"]]
    threads = task.get("threads")
    old_threads = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        return _run_jobs(jobs, task.get("cache_dir"))
    finally:
        if threads:
            torch.set_num_threads(old_threads)


def _run_jobs(jobs: list, cache_dir: str | None) -> Result:
    from memgnn.dataset.corpus import record_row
    from memgnn.dataset.profile import ProfileConfig, profile
    from memgnn.predictor.spec.train import TrainSpec
    from memgnn.predictor.zoo import make_bundle

    first = jobs[0]
    try:
        bundle = make_bundle(first.model, first.hparams)
        train = TrainSpec.of(**first.train)
    except Exception as exc:  # a bad config: every job fails the same way
        return {"rows": [error_row(j, exc) for j in jobs], "graphs": {}}
    device = None if first.device == "auto" else first.device
    # one symbolic capture per config; per size only for dims the model keeps static
    captures: dict[tuple, tuple[Any, str | None, str | None]] = {}
    # sim labels: the first size of a config is captured concretely; where the symbolic
    # graph gives the same labels there, the other sizes simulate the symbolic graph
    agrees: dict[tuple, bool] = {}
    rows = []
    # check at sizes away from 1 first (a size-1 dim can specialise a trace)
    for job in sorted(jobs, key=lambda j: -min(j.sizes.values())):
        key = tuple(job.sizes[d] for d in bundle.static_dims)
        if key not in captures:
            captures[key] = _capture(bundle, train, job, device, cache_dir)
        graph, graph_id, graph_error = captures[key]
        if graph_error and _fails_at_every_size(graph_error):
            rows.append(error_row(job, graph_error, 0.0, None, graph_error))
            continue
        t0 = time.perf_counter()
        config = ProfileConfig(backend=job.backend, device=device)
        try:
            record = profile(
                bundle, train, job.sizes, config, graph=graph if agrees.get(key) else None
            )
        except Exception as exc:  # one failing job never stops the rest
            log.warning("profile of %s %s failed: %s", job.model, job.sizes, _error_text(exc))
            rows.append(error_row(job, exc, time.perf_counter() - t0, graph_id, graph_error))
            continue
        if job.backend == "sim" and graph is not None and key not in agrees:
            agrees[key], why = _check_symbolic(graph, record, config)
            record.stats["symbolic_check"] = why
        if graph_error:
            record.stats["graph_error"] = graph_error
        rows.append(record_row(job.job_id, record, graph_id))
    graphs = {gid: g for g, gid, _ in captures.values() if g is not None}
    return {"rows": rows, "graphs": graphs}


def _check_symbolic(graph, record, config) -> tuple[bool, str]:
    from memgnn.dataset.profile import symbolic_agrees

    try:
        ok, why = symbolic_agrees(graph, record, config)
    except Exception as exc:  # a graph that cannot be simulated: keep capturing concretely
        ok, why = False, f"symbolic sim failed: {_error_text(exc)}"
    if not ok:
        log.warning("%s: %s; every size is captured concretely", record.model, why)
    return ok, why


def _fails_at_every_size(error: str) -> bool:
    """A capture error that profiling would repeat at any size (and slowly): too many
    control-flow paths is a property of the model's branch structure, not of its sizes."""
    return error.startswith("CaptureError") and "control-flow paths" in error


def _capture(bundle, train, job, device: str | None, cache_dir: str | None):
    """(symbolic StepGraph, its id, None) or (None, None, why the capture failed)."""
    from memgnn.predictor.capture.cache import capture_cached
    from memgnn.predictor.spec.devices import get_profile

    try:
        if job.backend == "cuda" and device is None:
            from memgnn.dataset.cuda_backend import detect_profile

            prof = detect_profile()
        else:
            prof = get_profile(device or "cpu")
        target, sm = ("cuda", prof.sm or 80) if prof.is_gpu else ("cpu", 80)
        folder = Path(cache_dir) if cache_dir else None
        graph = capture_cached(
            bundle, train, target=target, sm=sm, sizes=job.sizes, directory=folder
        )
        return graph, graph.graph_id, None
    except Exception as exc:  # features missing; the labels can still be measured
        log.warning("symbolic capture of %s failed: %s", job.model, _error_text(exc))
        return None, None, _error_text(exc)


def _error_text(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}".strip()


def error_row(
    job: Any,
    error: BaseException | str,
    seconds: float = 0.0,
    graph_id: str | None = None,
    graph_error: str | None = None,
) -> dict[str, Any]:
    """A corpus row for a job that failed or was skipped (`error` set, no labels)."""
    import torch
    from memgnn.dataset.corpus import record_row
    from memgnn.dataset.record import ProfileRecord

    text = error if isinstance(error, str) else _error_text(error)
    record = ProfileRecord(
        backend=job.backend,
        device=job.device,
        torch_version=torch.__version__,
        model=job.model,
        family=job.family,
        hparams=job.hparams,
        sizes=job.sizes,
        train=job.train,
        stats={"graph_error": graph_error} if graph_error else {},
        seconds=round(seconds, 3),
        error=text,
    )
    return record_row(job.job_id, record, graph_id)


# ---- executors -----------------------------------------------------------------------------


def _watch_parent() -> None:
    """Pool initializer: exit when the parent dies (a kill -9 must not leave orphans)."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def run_local(
    tasks: list[Task], workers: int, fn: Callable[[Task], Result] = run_group
) -> Iterator[tuple[Task, Result]]:
    """Process pool (spawn); workers=1 runs in-process."""
    if workers <= 1:
        for task in tasks:
            try:
                result = fn(task)
            except Exception as exc:  # a bug, not a config failure: recorded, build goes on
                result = failed_task(task, exc)
            yield task, result
        return
    retry: list[Task] = []
    todo = deque(tasks)
    while todo:
        pool = _pool(workers)
        broken = finished = False
        in_flight: dict[Future, Task] = {}
        try:
            while (todo or in_flight) and not broken:
                while todo and len(in_flight) < 2 * workers:
                    task = todo.popleft()
                    in_flight[pool.submit(fn, task)] = task
                done, _ = wait(in_flight, return_when=FIRST_COMPLETED)
                for fut in done:
                    task = in_flight.pop(fut)
                    try:
                        result = fut.result()
                    except BrokenProcessPool:
                        broken = True
                        retry.append(task)
                        continue
                    except Exception as exc:  # e.g. a result that does not pickle
                        result = failed_task(task, exc)
                    yield task, result
            if broken:  # every task in flight is suspect: retry each one alone
                log.error("a worker process died; retrying %d task(s) alone", len(in_flight))
                retry.extend(in_flight.values())
                in_flight.clear()
            finished = True
        finally:
            if not finished:  # interrupted: stop the running tasks, do not wait for them
                _terminate(pool)
            pool.shutdown(wait=finished and not broken, cancel_futures=True)
    for task in retry:
        yield task, _run_alone(task, fn)


def failed_task(task: Task, error: BaseException | str) -> Result:
    """Error rows for every job of a task that failed outside `run_group`'s own handling."""
    from memgnn.dataset.sampler import Job

    text = error if isinstance(error, str) else f"worker failed: {_error_text(error)}"
    log.error("task %s failed: %s", task["group"], text)
    return {"rows": [error_row(Job.from_dict(d), text) for d in task["jobs"]], "graphs": {}}


def _terminate(pool: ProcessPoolExecutor) -> None:
    if hasattr(pool, "terminate_workers"):  # Python >= 3.14
        pool.terminate_workers()
        return
    for proc in list((getattr(pool, "_processes", None) or {}).values()):
        proc.terminate()


def _pool(workers: int) -> ProcessPoolExecutor:
    return ProcessPoolExecutor(
        workers,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_watch_parent,
        max_tasks_per_child=200,
    )


def _run_alone(task: Task, fn: Callable[[Task], Result]) -> Result:

    pool = _pool(1)
    try:
        return pool.submit(fn, task).result()
    except BrokenProcessPool as exc:
        return failed_task(task, f"worker process died ({exc})")
    except Exception as exc:
        return failed_task(task, exc)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def run_ray(
    tasks: list[Task],
    workers: int,
    *,
    address: str | None = None,
    gpus_per_task: float = 0,
    fn: Callable[[Task], Result] = run_group,
) -> Iterator[tuple[Task, Result]]:
    """Ray remote tasks; connects to `address` (an existing cluster) or starts a local one."""
    try:
        import ray
    except ImportError:
        raise ValueError("the ray executor needs ray: pip install 'memgnn[ray]'") from None

    started = not ray.is_initialized()
    if started:
        kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
        if address is None:
            kwargs["num_cpus"] = workers
        ray.init(address=address, **kwargs)
    remote = ray.remote(num_cpus=1, num_gpus=gpus_per_task, max_retries=1)(fn)
    todo = deque(tasks)
    in_flight: dict[Any, Task] = {}
    try:
        while todo or in_flight:
            while todo and len(in_flight) < 2 * workers:
                task = todo.popleft()
                in_flight[remote.remote(task)] = task
            done, _ = ray.wait(list(in_flight), num_returns=1)
            for ref in done:
                task = in_flight.pop(ref)
                try:
                    result = ray.get(ref)
                except Exception as exc:  # task or worker failure after retries
                    result = failed_task(task, f"ray task failed ({_error_text(exc)})")
                yield task, result
    finally:
        if started:
            ray.shutdown()
