import json

import pytest

from dataset.corpus import Corpus, CorpusWriter, record_row
from dataset.record import ProfileRecord


def _record(i: int) -> ProfileRecord:
    return ProfileRecord(
        backend="sim",
        device="a100-80gb",
        torch_version="x",
        model="mlp",
        family="mlp",
        sizes={"B": i},
        train={"precision": "fp32", "optimizer": "adamw", "checkpointing": "none", "grad_accum": 1},
        peak_allocated_bytes=1000 + i,
        peak_reserved_bytes=2048,
        device_total_bytes=4096,
        breakdown={"categories": {"parameter": 10}},
    )


def test_rows_roundtrip_and_deduplicate(tmp_path):
    w = CorpusWriter(tmp_path)
    w.write_rows([record_row("a", _record(1), "g1"), record_row("b", _record(2), "g1")])
    w.write_rows([record_row("a", _record(1), "g1")])  # a re-run of job a
    recs = Corpus(tmp_path).records()
    assert sorted(r["job_id"] for r in recs) == ["a", "b"]
    rec = next(r for r in recs if r["job_id"] == "b")
    assert rec["sizes"] == {"B": 2} and rec["breakdown"]["categories"]["parameter"] == 10
    assert rec["peak_allocated_bytes"] == 1002 and rec["graph_id"] == "g1"
    assert w.done_job_ids() == {"a", "b"}


def test_corrupt_part_is_set_aside_and_its_jobs_redone(tmp_path):
    w = CorpusWriter(tmp_path)
    good = w.write_rows([record_row("a", _record(1), None)])
    bad = w.write_rows([record_row("b", _record(2), None)])
    bad.write_bytes(bad.read_bytes()[:40])
    assert w.done_job_ids() == {"a"}
    assert good.exists() and not bad.exists()
    assert bad.with_name(bad.name + ".corrupt").exists()


def test_leftover_tmp_files_are_removed(tmp_path):
    CorpusWriter(tmp_path)
    tmp = tmp_path / "parts" / "part-x.parquet.tmp"
    tmp.write_bytes(b"half written")
    CorpusWriter(tmp_path)
    assert not tmp.exists()


def test_wrong_manifest_is_refused(tmp_path):
    with pytest.raises(ValueError, match="not a memgnn corpus"):
        Corpus(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps({"format": "memgnn.corpus", "version": 99}))
    with pytest.raises(ValueError, match="version 99"):
        Corpus(tmp_path)


@pytest.mark.parametrize("ok_first", [True, False])
def test_a_transient_failure_is_redone_and_its_retry_wins(tmp_path, ok_first):
    w = CorpusWriter(tmp_path)
    died = record_row("a", _record(1), None) | {"error": "worker process died (killed)"}
    w.write_rows([died, record_row("b", _record(2), "g1")])
    assert w.done_job_ids() == {"b"}  # a resumed build profiles job a again
    config_error = record_row("c", _record(3), None) | {"error": "ValueError: batch 0"}
    w.write_rows([config_error])
    assert w.done_job_ids() == {"b", "c"}  # a config's own error is final
    part = w.write_rows([record_row("a", _record(1), "g1")])
    # parts are read in name order: the retry may come first or last
    part.rename(part.with_name("part-0000.parquet" if ok_first else "part-ffff.parquet"))
    recs = Corpus(tmp_path).records(ok_only=False)
    a = [r for r in recs if r["job_id"] == "a"]
    assert len(a) == 1 and a[0]["error"] is None and a[0]["peak_allocated_bytes"] == 1001
