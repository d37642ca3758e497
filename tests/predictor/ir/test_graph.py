import gzip
import hashlib
import json

import pytest
from memgnn.predictor.capture.capture import capture
from memgnn.predictor.ir.graph import StepGraph, file_sha256
from memgnn.predictor.spec.train import TrainSpec
from tiny_models import tiny_gpt_bundle


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


@pytest.fixture(scope="module")
def placed_graph():
    """A captured step whose saved activations live in pinned host memory."""
    return capture(tiny_gpt_bundle(), TrainSpec.of(offload_activations="save_on_cpu"))


def test_a_graph_with_host_storages_is_version_2_and_round_trips(placed_graph, tmp_path):
    from memgnn.predictor.ir.vocab import PLACES

    p = placed_graph.paths[0]
    assert placed_graph.version == 2 and p.has_places
    pinned = [u for u, c in enumerate(p.storages["place"]) if PLACES[c] == "pinned"]
    assert pinned
    # their bytes left the allocator's column for the place column
    assert all(placed_graph.exprs[p.storages["nbytes"][u]] == "0" for u in pinned)
    assert all(placed_graph.exprs[p.storages["place_nbytes"][u]] != "0" for u in pinned)
    gid = placed_graph.save(tmp_path / "g.json.gz")
    loaded = StepGraph.load(tmp_path / "g.json.gz")
    assert loaded.graph_id == gid and loaded.content() == placed_graph.content()


def test_a_version_1_graph_still_loads_and_keeps_its_id(graph, tmp_path):
    # graphs written before storage places: every storage on the device
    data = graph.content() | {"version": 1}
    old = StepGraph.from_dict(data)
    assert old.version == 1 and not old.has_places
    stored = data | {"graph_id": old.graph_id}
    _write(tmp_path / "old.json.gz", stored)
    assert StepGraph.load(tmp_path / "old.json.gz").graph_id == old.graph_id
    codes, nbytes = old.place_bytes(0, {"B": 4})
    assert not codes.any() and not nbytes.any()


def test_place_columns_are_checked(placed_graph):
    data = placed_graph.content() | {"version": 1}
    with pytest.raises(ValueError, match="storage places need step graph version 2"):
        StepGraph.from_dict(data)
    data = json.loads(json.dumps(placed_graph.content()))
    data["paths"][0]["storages"]["place"][0] = 9
    with pytest.raises(ValueError, match="bad place code"):
        StepGraph.from_dict(data)
    del data["paths"][0]["storages"]["place_nbytes"]
    with pytest.raises(ValueError, match="place columns are incomplete"):
        StepGraph.from_dict(data)
