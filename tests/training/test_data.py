"""Corpus -> training samples and splits."""

from __future__ import annotations

import shutil

import numpy as np
import pyarrow.parquet as pq
import pytest
from memgnn.training.data import error_summary, load_dataset, split


def test_dataset_targets_and_hash(tiny_corpus):
    data = load_dataset(tiny_corpus)
    assert len(data) >= 8 and set(data.family) == {"mlp", "rnn"}
    assert {"sim-gpu", "cpu"} <= set(data.source)
    labelled = ~np.isnan(data.y)
    assert labelled[:, 0].all() and np.isfinite(data.y[labelled]).all()
    cpu = np.array(data.source) == "cpu"
    assert np.isnan(data.y[cpu, 1:]).all()  # no allocator metrics on the CPU
    # the analytic estimate is close to the measured tensor peak of a real CPU run
    rel = np.abs(data.analytic[cpu, 0] / data.measured[cpu, 0] - 1)
    assert np.median(rel) < 0.02 and rel.max() < 0.5
    assert set(data.graphs) == set(data.keys)
    assert load_dataset(tiny_corpus).data_hash == data.data_hash


def test_splits_hold_out_families_and_are_seeded(tiny_corpus):
    data = load_dataset(tiny_corpus)
    sp = split(data, holdout_families=["rnn"], seed=3)
    fam = np.array(data.family)
    assert (fam[sp.test] == "rnn").all() and (fam[sp.train] == "mlp").all()
    assert not set(sp.train) & set(sp.val) and len(sp.val) > 0
    again = split(data, holdout_families=["rnn"], seed=3)
    assert np.array_equal(sp.val, again.val)
    rnd = split(data, holdout_families=[], val_by="random", seed=0)
    assert len(rnd.test) == 0 and len(rnd.train) + len(rnd.val) == len(data)
    with pytest.raises(ValueError, match="not in the corpus"):
        split(data, holdout_families=["nope"])


def test_error_summary():
    s = error_summary(np.array([100.0, 110.0]), np.array([120.0, 105.0]), np.array([100.0, 100.0]))
    assert s["median"] == pytest.approx(0.05) and s["max"] == pytest.approx(0.1)
    assert s["bound_miss_rate"] == 0.0


def test_a_corrupt_corpus_is_an_error_unless_allowed(tiny_corpus, tmp_path):
    corpus = tmp_path / "corpus"
    shutil.copytree(tiny_corpus, corpus)
    full = load_dataset(corpus)
    parts = sorted((corpus / "parts").glob("*.parquet"), key=lambda p: pq.read_metadata(p).num_rows)
    part, other = parts[0], parts[-1]  # the cpu build's part (4 rows), the sim build's
    victim = pq.read_table(other, columns=["graph_id"]).column("graph_id").to_pylist()[0]
    path = corpus / "graphs" / f"{victim}.json.gz"
    path.write_bytes(path.read_bytes()[:-64])
    part.write_bytes(part.read_bytes()[:100])
    with pytest.raises(ValueError, match="corrupt corpus") as err:
        load_dataset(corpus)
    assert victim in str(err.value) and part.name in str(err.value)
    assert "--allow-corrupt" in str(err.value) and "dataset build" in str(err.value)
    data = load_dataset(corpus, allow_corrupt=True)
    assert victim not in {gid for gid, _ in data.keys} and 0 < len(data) < len(full)
    assert list(data.dropped["corrupt_parts"]) == [part.name]
    assert list(data.dropped["corrupt_graphs"]) == [victim] and data.dropped["records"] > 0
    assert part.is_file() and not part.with_name(part.name + ".corrupt").exists()
    assert full.dropped == {}
