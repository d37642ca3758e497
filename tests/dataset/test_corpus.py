import hashlib
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from memgnn.dataset.corpus import SCHEMA, Corpus, CorpusWriter, record_row
from memgnn.dataset.record import ProfileRecord


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
    assert rec["graph_sha256"] is None  # g1 is not stored
    w.write_rows([record_row("c", _record(3), None)])
    assert w.done_job_ids() == {"c"}  # a and b name a graph not stored: redone to capture it
    assert w.bad_graphs == {"g1": "is missing"}


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
    w.write_rows([died, record_row("b", _record(2), None)])
    assert w.done_job_ids() == {"b"}  # a resumed build profiles job a again
    config_error = record_row("c", _record(3), None) | {"error": "ValueError: batch 0"}
    w.write_rows([config_error])
    assert w.done_job_ids() == {"b", "c"}  # a config's own error is final
    part = w.write_rows([record_row("a", _record(1), None)])
    # parts are read in name order: the retry may come first or last
    part.rename(part.with_name("part-0000.parquet" if ok_first else "part-ffff.parquet"))
    recs = Corpus(tmp_path).records(ok_only=False)
    a = [r for r in recs if r["job_id"] == "a"]
    assert len(a) == 1 and a[0]["error"] is None and a[0]["peak_allocated_bytes"] == 1001


def test_reading_a_corrupt_part_changes_nothing(tmp_path):
    w = CorpusWriter(tmp_path)
    w.write_rows([record_row("a", _record(1), None)])
    bad = w.write_rows([record_row("b", _record(2), None)])
    bad.write_bytes(bad.read_bytes()[:40])
    before = sorted(p.name for p in (tmp_path / "parts").iterdir())
    corpus = Corpus(tmp_path)
    assert [r["job_id"] for r in corpus.records()] == ["a"]
    assert list(corpus.corrupt_parts) == [bad.name]  # noted, not moved
    assert sorted(p.name for p in (tmp_path / "parts").iterdir()) == before


@pytest.fixture(scope="module")
def mlp_graph():
    from memgnn.predictor.capture.capture import capture
    from memgnn.predictor.spec.train import TrainSpec

    from tests.conftest import tiny_mlp_bundle

    return capture(tiny_mlp_bundle(), TrainSpec())


def test_rows_record_their_graph_checksum_and_truncation_is_found(tmp_path, mlp_graph):
    w = CorpusWriter(tmp_path)
    assert w.add_graph(mlp_graph) and not w.add_graph(mlp_graph)  # stored once
    gid = mlp_graph.graph_id
    w.write_rows([record_row("a", _record(1), gid)])
    path = tmp_path / "graphs" / f"{gid}.json.gz"
    corpus = Corpus(tmp_path)
    (row,) = corpus.records()
    assert row["graph_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert corpus.graph_problems() == {}
    path.write_bytes(path.read_bytes()[:-100])
    assert "checksum" in Corpus(tmp_path).graph_problems()[gid]


def test_old_rows_without_a_checksum_are_verified_by_parsing(tmp_path, mlp_graph):
    w = CorpusWriter(tmp_path)
    w.add_graph(mlp_graph)
    gid = mlp_graph.graph_id
    row = record_row("a", _record(1), gid)  # a part written before the checksum column
    old = SCHEMA.remove(SCHEMA.get_field_index("graph_sha256"))
    pq.write_table(pa.Table.from_pylist([row], schema=old), tmp_path / "parts" / "part-old.parquet")
    corpus = Corpus(tmp_path)
    assert corpus.records()[0]["graph_sha256"] is None and corpus.graph_problems() == {}
    path = tmp_path / "graphs" / f"{gid}.json.gz"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    assert "does not load" in corpus.graph_problems()[gid]
    assert corpus.graph_problems() == Corpus(tmp_path).graph_problems(missing=True)
    path.unlink()
    assert corpus.graph_problems() == {} and corpus.graph_problems(missing=True) == {
        gid: "is missing"
    }


def test_the_writer_sets_bad_graphs_aside_and_redoes_their_jobs(tmp_path, mlp_graph):
    w = CorpusWriter(tmp_path)
    w.add_graph(mlp_graph)
    gid = mlp_graph.graph_id
    w.write_rows([record_row("a", _record(1), gid), record_row("b", _record(2), None)])
    path = tmp_path / "graphs" / f"{gid}.json.gz"
    path.write_bytes(path.read_bytes()[:-10])
    w = CorpusWriter(tmp_path)
    assert w.done_job_ids() == {"b"} and list(w.bad_graphs) == [gid]
    assert not path.exists() and path.with_name(path.name + ".corrupt").is_file()
    assert w.add_graph(mlp_graph) and path.is_file()  # the re-capture is stored again
