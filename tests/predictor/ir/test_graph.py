import gzip
import hashlib
import json

import pytest
from memgnn.predictor.capture.capture import capture
from memgnn.predictor.ir.graph import StepGraph, file_sha256
from memgnn.predictor.spec.train import TrainSpec


@pytest.fixture
def graph(tiny_mlp):
    return capture(tiny_mlp, TrainSpec())


def test_roundtrip_keeps_content_and_id(graph, tmp_path):
    path = tmp_path / "g.json.gz"
    gid = graph.save(path)
    loaded = StepGraph.load(path)
    assert loaded.graph_id == gid == graph.graph_id
    assert loaded.content() == graph.content()


def test_graph_id_changes_with_content(tiny_mlp, graph):
    other = capture(tiny_mlp, TrainSpec.of(optimizer="sgd"))
    assert other.graph_id != graph.graph_id


def _write(path, data):
    with gzip.open(path, "wb") as f:
        f.write(json.dumps(data).encode())


def test_unknown_version_is_refused(graph, tmp_path):
    data = graph.content() | {"version": 99}
    _write(tmp_path / "g.json.gz", data)
    with pytest.raises(ValueError, match="version 99 is not supported"):
        StepGraph.load(tmp_path / "g.json.gz")


def test_corrupt_and_missing_files_are_named(graph, tmp_path):
    path = tmp_path / "g.json.gz"
    graph.save(path)
    blob = path.read_bytes()
    path.write_bytes(blob[: len(blob) // 2])
    with pytest.raises(ValueError, match="corrupt step graph"):
        StepGraph.load(path)
    (tmp_path / "plain.json.gz").write_text("not gzip")
    with pytest.raises(ValueError, match="corrupt"):
        StepGraph.load(tmp_path / "plain.json.gz")
    with pytest.raises(ValueError, match="not found"):
        StepGraph.load(tmp_path / "missing.json.gz")


def test_edited_content_fails_hash_check(graph, tmp_path):
    data = graph.content() | {"meta": {}, "graph_id": graph.graph_id}
    data["exprs"][0] = "123456"
    _write(tmp_path / "g.json.gz", data)
    with pytest.raises(ValueError, match="content hash mismatch"):
        StepGraph.load(tmp_path / "g.json.gz")


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d["paths"][0]["storages"]["nbytes"].__setitem__(0, 10_000), "missing expr"),
        (lambda d: d["paths"][0]["nodes"]["inputs"].__setitem__(0, [99_999]), "missing storage"),
        (lambda d: d["paths"][0]["nodes"].pop("op"), "lack field 'op'"),
        (lambda d: d["exprs"].__setitem__(0, "__import__('os')"), "disallowed"),
        (lambda d: d.pop("paths"), "missing field"),
    ],
)
def test_malformed_graphs_are_named(graph, mutate, message):
    data = json.loads(json.dumps(graph.content()))
    mutate(data)
    with pytest.raises(ValueError, match=message):
        StepGraph.from_dict(data)


def test_resolve_sizes_validates(graph):
    with pytest.raises(ValueError, match="missing"):
        graph.resolve_sizes({})
    with pytest.raises(ValueError, match="positive"):
        graph.resolve_sizes({"B": 0})
    with pytest.raises(ValueError, match="unknown size symbols"):
        graph.resolve_sizes({"B": 2, "Q": 3})


def test_a_used_graph_pickles_without_its_caches(graph):
    import pickle

    sizes = graph.resolve_sizes({"B": 3})
    before = graph.storage_bytes(0, sizes).tolist()  # builds the expression table and caches
    assert graph._table is not None and graph.paths[0]._cache
    again = pickle.loads(pickle.dumps(graph))  # e.g. a corpus worker's result
    assert again._table is None and again.paths[0]._cache is None
    assert again.graph_id == graph.graph_id
    assert again.storage_bytes(0, sizes).tolist() == before


def test_save_is_durable_and_gives_the_same_bytes(graph, tmp_path, monkeypatch):
    import os
    import stat

    synced = []
    real = os.fsync

    def record(fd):
        synced.append("dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        real(fd)

    monkeypatch.setattr(os, "fsync", record)
    a, b = tmp_path / "a" / "g.json.gz", tmp_path / "b" / "g.json.gz"
    a.parent.mkdir(), b.parent.mkdir()
    graph.save(a)
    assert synced == ["file", "dir"]  # the file before its rename, then the folder
    graph.save(b)
    assert a.read_bytes() == b.read_bytes()  # no time or name in the gzip header
    assert file_sha256(a) == hashlib.sha256(a.read_bytes()).hexdigest()
    assert not list(tmp_path.rglob("*.tmp"))
