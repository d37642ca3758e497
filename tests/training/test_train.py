"""`memgnn train` end to end on a tiny corpus: mlflow store, registry alias, resume."""

from __future__ import annotations

import argparse
import json

import pytest
from memgnn.predictor.memory.base import Query
from memgnn.predictor.memory.features import NUM_QUERY_FEATURES
from memgnn.predictor.memory.onnx_model import OnnxMemoryModel

from memgnn.cli.train import add_train_arguments, train_cmd


def _args(corpus, out, *extra):
    p = argparse.ArgumentParser()
    add_train_arguments(p)
    fixed = ["--holdout-families", "rnn", "--hidden", "16", "--layers", "1", "--head-epochs", "2",
             "--threads", "1"]  # fmt: skip
    return p.parse_args(
        ["--corpus", str(corpus), "--out", str(out), *fixed, "--no-progress", *extra]
    )


def test_train_end_to_end_with_crash_and_resume(tiny_corpus, tmp_path, monkeypatch, capsys):
    import memgnn.training.tracking as tracking

    out = tmp_path / "run"
    real = tracking.Tracker.log_epoch

    def crash_at_2(self, epoch, row):
        real(self, epoch, row)
        if epoch == 2:
            raise KeyboardInterrupt("simulated crash")

    monkeypatch.setattr(tracking.Tracker, "log_epoch", crash_at_2)
    with pytest.raises(KeyboardInterrupt):
        train_cmd(_args(tiny_corpus, out, "--max-epochs", "3"))
    first = json.loads((out / "train_state.json").read_text())
    assert first["phase"] == "training" and (out / "checkpoint.pt").is_file()
    monkeypatch.setattr(tracking.Tracker, "log_epoch", real)
    capsys.readouterr()

    assert train_cmd(_args(tiny_corpus, out, "--max-epochs", "3")) == 0
    card = json.loads(capsys.readouterr().out)
    state = json.loads((out / "train_state.json").read_text())
    assert state["phase"] == "done" and state["run_id"] == first["run_id"]
    assert card["epochs"] == 5 and card["holdout_families"] == ["rnn"]  # 3 joint + 2 head
    assert card["metrics"]["test_family"]["primary"]["n"] > 0
    rng = card["training_range"]  # the range predictions check for extrapolation
    assert rng["B"][0] >= 1 and rng["B"][1] >= rng["B"][0]
    assert len(rng["query_features"]["max"]) == NUM_QUERY_FEATURES
    for name in ("encoder.onnx", "head.onnx", "model_card.json"):
        assert (out / "model" / name).is_file()

    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{out / 'mlflow.db'}")
    version = client.get_model_version_by_alias("memgnn", "champion")
    assert version.run_id == first["run_id"] == card["mlflow"]["run_id"]
    steps = [m.step for m in client.get_metric_history(first["run_id"], "train_loss")]
    assert sorted(set(steps)) == [1, 2, 3, 4, 5]  # epochs 1-2 before the crash, 3-5 after
    artifacts = {a.path for a in client.list_artifacts(first["run_id"])}
    assert {"model_card.json", "parity.png"} <= artifacts

    model = OnnxMemoryModel.load(out / "model")
    from memgnn.dataset.corpus import Corpus

    corpus = Corpus(tiny_corpus)
    graph = corpus.graph(corpus.records()[0]["graph_id"])
    (pred,) = model.predict(graph, [Query(sizes=dict(graph.symbols), device="a100-80gb")])
    assert 0 < pred.predicted_peak_bytes <= pred.upper_bound_bytes


def test_resume_after_a_crash_in_the_head_phase(tiny_corpus, tmp_path, monkeypatch):
    import memgnn.training.tracking as tracking

    out = tmp_path / "run"
    real = tracking.Tracker.log_epoch

    def crash_at_3(self, epoch, row):  # epochs 1-2 joint, 3-4 head
        real(self, epoch, row)
        if epoch == 3:
            raise KeyboardInterrupt("simulated crash")

    monkeypatch.setattr(tracking.Tracker, "log_epoch", crash_at_3)
    with pytest.raises(KeyboardInterrupt):
        train_cmd(_args(tiny_corpus, out, "--max-epochs", "2", "--no-mlflow"))
    monkeypatch.setattr(tracking.Tracker, "log_epoch", real)
    assert train_cmd(_args(tiny_corpus, out, "--max-epochs", "2", "--no-mlflow")) == 0
    import torch

    state = torch.load(out / "checkpoint.pt", weights_only=False)["state"]
    assert state["phase"] == "head" and [r["epoch"] for r in state["history"]] == [1, 2, 3, 4]


def test_a_changed_config_does_not_resume(tiny_corpus, tmp_path):
    out = tmp_path / "run"
    train_cmd(_args(tiny_corpus, out, "--max-epochs", "1", "--no-mlflow"))
    with pytest.raises(ValueError, match="another config"):
        train_cmd(_args(tiny_corpus, out, "--max-epochs", "1", "--no-mlflow", "--lr", "0.01"))
    assert train_cmd(_args(tiny_corpus, out, "--max-epochs", "1", "--no-mlflow", "--lr", "0.01",
                           "--restart")) == 0  # fmt: skip


def test_a_corrupt_graph_stops_training_unless_allowed_and_the_card_says_so(
    tiny_corpus, tmp_path, capsys
):
    import shutil

    from memgnn.dataset.corpus import Corpus

    corpus = tmp_path / "corpus"
    shutil.copytree(tiny_corpus, corpus)
    mlp = sorted({r["graph_id"] for r in Corpus(corpus).records() if r["family"] == "mlp"})
    assert len(mlp) >= 2
    path = corpus / "graphs" / f"{mlp[0]}.json.gz"
    path.write_bytes(path.read_bytes()[:-64])
    with pytest.raises(ValueError, match="corrupt corpus.*--allow-corrupt"):
        train_cmd(_args(corpus, tmp_path / "a", "--max-epochs", "1", "--no-mlflow"))
    out = tmp_path / "b"
    args = _args(corpus, out, "--max-epochs", "1", "--no-mlflow", "--allow-corrupt")
    assert train_cmd(args) == 0
    card = json.loads(capsys.readouterr().out)
    assert list(card["dropped"]["corrupt_graphs"]) == [mlp[0]] and card["dropped"]["records"] > 0
