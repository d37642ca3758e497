"""Packing a corpus: same rows and graph bytes, one zstd part, a manifest with its counts."""

from __future__ import annotations

import json
from pathlib import Path

from memgnn.dataset.corpus import Corpus
from memgnn.dataset.pack import pack_corpus
from memgnn.predictor.memory.features import FEATURE_SCHEMA_VERSION

DEMO = Path(__file__).resolve().parents[2] / "dataset" / "data" / "demo-corpus"


def test_pack_keeps_every_row_and_graph_byte(tmp_path):
    manifest = pack_corpus(DEMO, tmp_path / "packed")
    src, dst = Corpus(DEMO), Corpus(tmp_path / "packed")
    rows = sorted(src.table().to_pylist(), key=lambda r: r["job_id"])
    assert dst.table().to_pylist() == rows
    assert [p.name for p in dst.parts()] == ["part-packed.parquet"]
    named = {r["graph_id"] for r in rows if r["graph_id"]}
    assert set(dst.graph_ids()) == named
    for gid in named:
        a = (DEMO / "graphs" / f"{gid}.json.gz").read_bytes()
        assert (tmp_path / "packed" / "graphs" / f"{gid}.json.gz").read_bytes() == a
    assert dst.graph_problems(missing=True) == {}
    on_disk = json.loads((tmp_path / "packed" / "manifest.json").read_text())
    assert on_disk == manifest and manifest["rows"] == len(rows) == 84
    assert manifest["ok_rows"] == sum(r["error"] is None for r in rows)
    assert manifest["feature_schema_version"] == FEATURE_SCHEMA_VERSION
    files = [p for p in (tmp_path / "packed").rglob("*") if p.is_file()]
    assert manifest["bytes"] == sum(p.stat().st_size for p in files if p.name != "manifest.json")
