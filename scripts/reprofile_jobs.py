"""Re-profile some jobs of a corpus with today's code, keeping every other row and graph.

    python scripts/reprofile_jobs.py SRC DST JOB_ID[,JOB_ID...]
    memgnn dataset pack DST PACKED

Each job is rebuilt from its row (its id must come out the same, `dataset.sampler.
canonical_id`) and run by the build's own worker (`dataset.executors.run_group`: one
capture per config, then `dataset.profile.profile` per size), so its new row and graph
are what `memgnn dataset build` writes today. DST (a new corpus folder) gets SRC's other
rows unchanged (`CorpusWriter.write_rows` adds the checksum of their graph files, copied
byte for byte) and the new rows and graphs; `dataset.pack` then writes one sorted part with
only the graphs the rows name. Use it where a corpus cannot be rebuilt by its own command
(the sampler of the day draws other jobs) and some rows are known stale.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from memgnn.dataset.corpus import Corpus, CorpusWriter
from memgnn.dataset.executors import run_group
from memgnn.dataset.sampler import Job, canonical_id


def job_of(row: dict) -> Job:
    """The job a corpus row was made by; ValueError if its id does not come out the same."""
    train, hp, sizes = (json.loads(row[k]) for k in ("train", "hparams", "sizes"))
    base = {"model": row["model"], "hparams": hp, "train": train, "backend": row["backend"],
            "device": row["device"]}  # fmt: skip
    if canonical_id(base | {"sizes": sizes}) != row["job_id"]:
        raise ValueError(f"job {row['job_id']}: its fields no longer give its id")
    return Job(job_id=row["job_id"], group=canonical_id(base), family=row["family"],
               model=row["model"], hparams=hp, sizes=sizes, train=train,
               backend=row["backend"], device=row["device"])  # fmt: skip


def reprofile(src: Path, dst: Path, job_ids: set[str]) -> list[tuple[dict, dict]]:
    """Write SRC with `job_ids` re-profiled into the new folder DST; (old, new) rows."""
    if dst.exists():
        raise ValueError(f"{dst} exists; write into a new folder")
    table = Corpus(src).table().to_pylist()
    old = {r["job_id"]: r for r in table if r["job_id"] in job_ids}
    if missing := job_ids - set(old):
        raise ValueError(f"not in {src}: {sorted(missing)}")
    groups: dict[str, list[Job]] = {}
    for row in old.values():
        job = job_of(row)
        groups.setdefault(job.group, []).append(job)
    writer = CorpusWriter(dst)
    kept = [r for r in table if r["job_id"] not in job_ids]
    for gid in {r["graph_id"] for r in kept if r["graph_id"]}:
        shutil.copyfile(src / "graphs" / f"{gid}.json.gz", dst / "graphs" / f"{gid}.json.gz")
    new = []
    for jobs in groups.values():  # one task per config, as the build groups them
        result = run_group({"jobs": [j.to_dict() for j in jobs], "cache_dir": None})
        for graph in result["graphs"].values():
            writer.add_graph(graph)
        new += result["rows"]
    writer.write_rows(kept)
    writer.write_rows(new)
    return [(old[r["job_id"]], r) for r in new]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", type=Path)
    ap.add_argument("dst", type=Path)
    ap.add_argument("job_ids", help="comma-separated job ids")
    args = ap.parse_args(argv)
    pairs = reprofile(args.src, args.dst, set(args.job_ids.split(",")))
    for o, n in pairs:
        labels = ("peak_allocated_bytes", "peak_reserved_bytes", "device_total_bytes")
        print(f"{n['job_id'][:12]} {n['sizes']} graph {o['graph_id']} -> {n['graph_id']}; "
              + ", ".join(f"{k} {o[k]} -> {n[k]}" for k in labels)
              + (f"; error {n['error']}" if n["error"] else ""))  # fmt: skip
    return 1 if any(n["error"] for _, n in pairs) else 0


if __name__ == "__main__":
    sys.exit(main())
