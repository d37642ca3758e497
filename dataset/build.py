"""`memgnn dataset build`: a resumable, crash-safe corpus build on one machine or a Ray cluster.

    jobs = sample_jobs(seed, size, ...)          deterministic ids (dataset.sampler)
    todo = jobs - ids already in DIR             resume: completed jobs are never redone
    skipped configs -> error rows                (their reason is the error)
    group todo by config -> tasks                one symbolic capture per config
    executor (local pool | ray) runs tasks       dataset.executors.run_group
    parent: graph -> DIR/graphs, rows -> buffer  every `chunk_size` rows: one atomic part

A kill -9 loses at most the rows still in the buffer (their jobs run again on restart) and
never leaves a half-written part. Graphs are written before the rows that name them, and
each row records its graph file's sha256. A build repairs the corpus first
(`CorpusWriter.done_job_ids`): a part that no longer reads is moved aside as `*.corrupt`
and a graph file that fails its checksum and does not parse (or is missing) is moved aside
too; their jobs count as not done, so this build profiles them again and re-captures the
graphs. The summary says what was repaired (`corrupt_parts`, `graphs_repaired`); a bad
graph no job of this build re-captures is listed in `graphs_unrepaired` (exit status 1).
"""

from __future__ import annotations

import logging
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memgnn.dataset.executors import EXECUTORS, Task, error_row, run_local, run_ray
from memgnn.dataset.sampler import BACKENDS, Job, SamplerConfig, sample_jobs
from memgnn.dataset.sampler_finetune import FINETUNE_KINDS, LORA_SHARE

log = logging.getLogger(__name__)

# Symbolic captures by config key, inside the corpus folder: a resumed build reuses those of
# half-done configs. Removed when a build completes.
CACHE_DIR = "capture-cache"
CAP_NAMES = ("max_tokens", "max_batch", "max_image", "max_params", "max_static_seq", "max_layers")


@dataclass(kw_only=True, slots=True)
class BuildConfig:
    out: Path
    size: int
    backend: str = "sim"
    executor: str = "local"
    workers: int = 1
    families: list[str] | None = None
    seed: int = 0
    ray_address: str | None = None
    chunk_size: int = 16  # rows per Parquet part: a crash loses at most this many
    devices: list[str] | None = None
    sizes_per_config: int | None = None  # default: 4 (sim, cuda), 3 (cpu)
    caps: dict[str, int] = field(default_factory=dict)  # max_tokens/max_batch/max_image/...
    hparams: dict[str, dict[str, Any]] = field(default_factory=dict)  # pinned per zoo name
    threads_per_worker: int = 1
    progress: bool = True
    finetune: bool = True  # the sampler draws LoRA / QLoRA / attention-kernel configs
    finetune_kinds: tuple[str, ...] = FINETUNE_KINDS  # which of them (presets pin it)
    lora_share: float = LORA_SHARE  # of a transformers family's configs (presets pin it)

    def __post_init__(self) -> None:
        self.out = Path(self.out)
        if self.backend not in BACKENDS:
            raise ValueError(f"unknown backend {self.backend!r}; expected one of {BACKENDS}")
        if self.executor not in EXECUTORS:
            raise ValueError(f"unknown executor {self.executor!r}; expected one of {EXECUTORS}")
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers}")
        if self.chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {self.chunk_size}")
        if self.threads_per_worker < 1:
            raise ValueError("threads_per_worker must be >= 1")
        if self.ray_address is not None and self.executor != "ray":
            raise ValueError("--address needs --executor ray")
        unknown = set(self.caps) - set(CAP_NAMES)
        if unknown:
            raise ValueError(f"unknown caps {sorted(unknown)}")
        self.sampler()  # validates size, seed, families, devices, caps and hparams

    def sampler(self) -> SamplerConfig:
        per_config = self.sizes_per_config or (3 if self.backend == "cpu" else 4)
        return SamplerConfig(
            size=self.size,
            seed=self.seed,
            families=self.families,
            backend=self.backend,
            devices=self.devices,
            sizes_per_config=per_config,
            hparams=self.hparams,
            finetune=self.finetune,
            finetune_kinds=tuple(self.finetune_kinds),
            lora_share=self.lora_share,
            **self.caps,
        )


@dataclass(kw_only=True, slots=True)
class BuildSummary:
    out: str
    jobs: int  # sampled
    already_done: int  # found in the corpus before this run
    profiled: int  # rows written by this run (ok + errors + skipped)
    ok: int
    errors: int
    skipped: int
    graphs_added: int
    parts_written: int
    seconds: float
    workers: int
    corrupt_parts: list[str] = field(default_factory=list)  # moved aside, their jobs redone
    graphs_repaired: list[str] = field(default_factory=list)  # corrupt/missing, re-captured
    graphs_unrepaired: dict[str, str] = field(default_factory=dict)  # still bad: id -> why

    @property
    def records_per_min(self) -> float:
        return 60.0 * self.profiled / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        data = {name: getattr(self, name) for name in self.__slots__}
        rate = self.records_per_min
        return data | {"records_per_min": rate, "records_per_min_per_worker": rate / self.workers}


class _ChunkWriter:
    """Buffers rows and writes each full chunk as one atomic part."""

    def __init__(self, writer: Any, chunk_size: int):
        self.writer, self.chunk_size = writer, chunk_size
        self.buffer: list[dict[str, Any]] = []
        self.parts = 0

    def add(self, rows: list[dict[str, Any]]) -> None:
        self.buffer.extend(rows)
        while len(self.buffer) >= self.chunk_size:
            self._write(self.buffer[: self.chunk_size])
            del self.buffer[: self.chunk_size]

    def flush(self) -> None:
        if self.buffer:
            self._write(self.buffer)
            self.buffer = []

    def _write(self, rows: list[dict[str, Any]]) -> None:
        path = self.writer.write_rows(rows)
        self.parts += 1
        log.debug("wrote %d rows to %s", len(rows), path)


def make_tasks(jobs: list[Job], cache_dir: str | None, threads: int | None) -> list[Task]:
    """One task per config group, in first-seen order; plain data only."""
    groups: dict[str, list[Job]] = {}
    for job in jobs:
        groups.setdefault(job.group, []).append(job)
    return [
        {
            "group": group,
            "jobs": [j.to_dict() for j in members],
            "cache_dir": cache_dir,
            "threads": threads,
        }
        for group, members in groups.items()
    ]


def build_corpus(cfg: BuildConfig) -> BuildSummary:
    """Build or resume the corpus in `cfg.out` (see the module docstring)."""
    from memgnn.dataset.corpus import Corpus, CorpusWriter
    from tqdm import tqdm

    t0 = time.perf_counter()
    if cfg.backend == "cuda" and cfg.executor == "local" and cfg.workers > 1:
        log.warning(
            "cuda backend with %d local workers: they share the visible GPU(s), so device-level "
            "readings overlap; use --executor ray (one GPU per task) or --workers 1",
            cfg.workers,
        )
    writer = CorpusWriter(cfg.out)
    done = writer.done_job_ids()  # sets corrupt parts and graph files aside (repair)
    bad_graphs = dict(writer.bad_graphs)
    jobs = sample_jobs(cfg.sampler())
    todo = [j for j in jobs if j.job_id not in done]
    skipped = [j for j in todo if j.skip is not None]
    runnable = [j for j in todo if j.skip is None]
    log.info(
        "%d jobs: %d done before, %d to profile, %d skipped",
        len(jobs),
        len(jobs) - len(todo),
        len(runnable),
        len(skipped),
    )
    chunks = _ChunkWriter(writer, cfg.chunk_size)
    counts = {"ok": 0, "errors": 0, "graphs": 0}
    chunks.add([error_row(j, f"skipped: {j.skip}") for j in skipped])
    remote = cfg.executor == "ray" and cfg.ray_address is not None
    cache = None if remote else str(cfg.out / CACHE_DIR)  # remote nodes: their own cache
    tasks = make_tasks(runnable, cache, cfg.threads_per_worker)
    bar = tqdm(
        total=len(todo),
        initial=len(skipped),
        unit="rec",
        file=sys.stderr,
        disable=not cfg.progress,
        dynamic_ncols=True,
        smoothing=0.05,
    )
    try:
        for _task, result in _execute(cfg, tasks):
            for graph in result["graphs"].values():  # before the rows that name them
                counts["graphs"] += writer.add_graph(graph)
            rows = result["rows"]
            failed = sum(r["error"] is not None for r in rows)
            counts["errors"] += failed
            counts["ok"] += len(rows) - failed
            chunks.add(rows)
            bar.update(len(rows))
            bar.set_postfix(errors=counts["errors"], refresh=False)
    finally:
        chunks.flush()  # on an exception too: what finished is kept
        bar.close()
    if cache is not None:  # every job is done: the captures are in graphs/ now
        shutil.rmtree(cache, ignore_errors=True)
    left = Corpus(cfg.out).graph_problems(missing=True) if bad_graphs else {}
    for gid in sorted(set(bad_graphs) - set(left)):
        log.warning("graph %s (%s) re-captured", gid, bad_graphs[gid])
    for gid, why in left.items():
        log.warning("graph %s %s and no job of this build re-captures it (rebuild with "
                    "the corpus's --size/--seed/--families)", gid, why)  # fmt: skip
    summary = BuildSummary(
        out=str(cfg.out),
        jobs=len(jobs),
        already_done=len(jobs) - len(todo),
        profiled=len(todo),
        ok=counts["ok"],
        errors=counts["errors"],
        skipped=len(skipped),
        graphs_added=counts["graphs"],
        parts_written=chunks.parts,
        seconds=round(time.perf_counter() - t0, 2),
        workers=cfg.workers,
        corrupt_parts=list(writer.set_aside),
        graphs_repaired=sorted(set(bad_graphs) - set(left)),
        graphs_unrepaired=left,
    )
    log.info("build done: %s", summary.to_dict())
    return summary


def _execute(cfg: BuildConfig, tasks: list[Task]):
    if cfg.executor == "ray":
        gpus = 1 if cfg.backend == "cuda" else 0
        return run_ray(tasks, cfg.workers, address=cfg.ray_address, gpus_per_task=gpus)
    return run_local(tasks, cfg.workers)
