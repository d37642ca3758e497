"""Pack a corpus for the repository: one zstd Parquet part, only the graphs its rows name.

    memgnn dataset pack SRC DST [--preset v1]

`pack_corpus` reads SRC's deduplicated rows (`Corpus.table`), keeps those of `--preset`'s
jobs if given (a build stopped after the preset's jobs is packed to exactly them; a
preset job missing from SRC is an error), sorts them by job id and writes them as one
Parquet part (zstd) into the new folder DST, with the graph files those rows name, byte
for byte (their recorded sha256 still holds). DST is a corpus like any other (`Corpus`,
`memgnn train`, `benchmarks/accuracy.py` read it; `dataset build --preset` resumes it);
its manifest also records the preset, the feature schema version of the features the
rows are meant for, the torch version and the row and byte counts.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from memgnn.dataset.corpus import FORMAT, SCHEMA, SCHEMA_VERSION, Corpus
from memgnn.predictor.ir.graph import durable_write

__all__ = ["pack_corpus", "preset_job_ids"]

log = logging.getLogger(__name__)


def preset_job_ids(name: str) -> set[str]:
    """The job ids of every stage of preset `name` (sampled, nothing run)."""
    from memgnn.dataset.build import BuildConfig
    from memgnn.dataset.presets import preset_kwargs
    from memgnn.dataset.sampler import sample_jobs

    ids: set[str] = set()
    for kw in preset_kwargs(name, out=Path("."), progress=False):
        ids |= {j.job_id for j in sample_jobs(BuildConfig(**kw).sampler())}
    return ids


def pack_corpus(src: str | Path, dst: str | Path, *, preset: str | None = None) -> dict[str, Any]:
    """Write the packed copy of corpus `src` to the new folder `dst` (see the module
    docstring); returns its manifest."""
    import torch
    from memgnn.predictor.memory.features import FEATURE_SCHEMA_VERSION

    src, dst = Path(src), Path(dst)
    if dst.exists():
        raise ValueError(f"{dst} exists; pack into a new folder")
    corpus = Corpus(src)
    table = corpus.table()
    if corpus.corrupt_parts:
        raise ValueError(f"{src} has corrupt parts {sorted(corpus.corrupt_parts)}; rebuild first")
    if preset is not None:
        wanted = preset_job_ids(preset)
        have = set(table.column("job_id").to_pylist())
        missing = wanted - have
        if missing:
            raise ValueError(f"{src} lacks {len(missing)} of preset {preset}'s jobs; "
                             f"finish it with dataset build --preset {preset} first")  # fmt: skip
        table = table.filter(pc.is_in(table.column("job_id"), pa.array(sorted(wanted))))
    table = table.cast(SCHEMA).sort_by("job_id")
    gids = sorted({g for g in table.column("graph_id").to_pylist() if g is not None})
    bad = corpus.graph_problems(table, missing=True)
    if bad:
        raise ValueError(f"{src}: graphs {sorted(bad)[:3]} are corrupt or missing")
    (dst / "parts").mkdir(parents=True)
    (dst / "graphs").mkdir()
    for gid in gids:
        shutil.copyfile(src / "graphs" / f"{gid}.json.gz", dst / "graphs" / f"{gid}.json.gz")
    pq.write_table(table, dst / "parts" / "part-packed.parquet", compression="zstd",
                   compression_level=19)  # fmt: skip
    files = [p for p in dst.rglob("*") if p.is_file()]
    manifest = {
        "format": FORMAT,
        "version": SCHEMA_VERSION,
        "preset": preset,
        "feature_schema_version": FEATURE_SCHEMA_VERSION,
        "torch_version": torch.__version__,
        "rows": table.num_rows,
        "ok_rows": int(pc.sum(pc.is_null(table.column("error"))).as_py() or 0),
        "graphs": len(gids),
        "bytes": sum(p.stat().st_size for p in files),
    }
    durable_write(dst / "manifest.json", (json.dumps(manifest, indent=2) + "\n").encode())
    log.info("packed %s -> %s: %s", src, dst, manifest)
    return manifest
