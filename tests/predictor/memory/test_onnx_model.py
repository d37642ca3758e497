"""ONNX export vs PyTorch, the model card's schema check, and OnnxMemoryModel predictions."""

from __future__ import annotations

import json
import logging
import shutil

import numpy as np
import pytest
import torch
from memgnn.predictor.capture.capture import CaptureConfig, capture
from memgnn.predictor.memory.analytic import AnalyticModel
from memgnn.predictor.memory.base import Prediction, Query
from memgnn.predictor.memory.features import FEATURE_SCHEMA_VERSION, graph_inputs
from memgnn.predictor.memory.gnn import GNNConfig, MemoryGNN
from memgnn.predictor.memory.onnx_model import OnnxMemoryModel, load_default_model, read_card
from memgnn.predictor.memory.query_features import PathContext
from memgnn.predictor.spec.train import TrainSpec
from memgnn.training.export import export_onnx, write_card


@pytest.fixture(scope="module")
def graphs():
    from tests.conftest import CondModel, _seq_bundle, tiny_gpt_bundle, tiny_mlp_bundle

    cfg = CaptureConfig(target="cuda")
    return {
        "mlp": capture(tiny_mlp_bundle(), TrainSpec(), cfg),
        "gpt": capture(tiny_gpt_bundle(), TrainSpec(), cfg),
        "cond": capture(_seq_bundle("cond", CondModel), TrainSpec(), cfg),
    }


@pytest.fixture(scope="module")
def model_dir(graphs, tmp_path_factory):
    torch.manual_seed(0)
    model = MemoryGNN(GNNConfig(hidden=16, layers=2, head_hidden=32)).eval()
    from memgnn.predictor.spec.devices import get_profile

    q = np.stack([PathContext(graphs["gpt"]).query({"B": b, "S": 32}, get_profile(d)).features
                  for b in (1, 4, 16) for d in ("a100-80gb", "cpu")])  # fmt: skip
    model.head.set_normalization(torch.from_numpy(q))
    with torch.no_grad():  # a non-trivial correction and spread
        model.head.out.weight.normal_(std=0.05)
    out = tmp_path_factory.mktemp("model")
    info = export_onnx(model, graph_inputs(graphs["mlp"]), out)
    write_card(out, {"model_version": "gnn-test", "onnx": info, "metrics": {}})
    return out, model


def test_onnx_matches_torch_on_other_graphs(model_dir, graphs):
    out, model = model_dir
    onnx_model = OnnxMemoryModel.load(out)
    for name in ("gpt", "cond"):  # not the export sample: other node and edge counts
        emb = onnx_model.encode(graphs[name])
        for k in range(len(graphs[name].paths)):
            gi = graph_inputs(graphs[name], k)
            with torch.no_grad():
                ref = model.encoder.forward_csr(
                    torch.from_numpy(gi.x), *(torch.from_numpy(a) for a in gi.csr())
                )
            np.testing.assert_allclose(emb[k], ref[0].numpy(), rtol=1e-4, atol=1e-5)
    q = np.random.default_rng(1).normal(size=(7, model.head.num_query)).astype(np.float32)
    e = np.repeat(emb[:1], 7, axis=0)
    with torch.no_grad():
        ref = model.head(torch.from_numpy(e), torch.from_numpy(q)).numpy()
    np.testing.assert_allclose(onnx_model.head(e, q), ref, rtol=1e-4, atol=1e-5)


def test_no_external_weights_and_card_fields(model_dir):
    out, _ = model_dir
    assert not list(out.glob("*.data"))
    card = read_card(out)
    assert card["feature_schema_version"] == FEATURE_SCHEMA_VERSION
    assert card["onnx"]["ort_max_rel_error"] < 1e-4


@pytest.mark.parametrize("offset", [1, -1])  # -1: a card from before the fine-tuning columns
def test_schema_mismatch_fails_clearly(model_dir, tmp_path, offset):
    out, _ = model_dir
    bad = tmp_path / "bad"
    shutil.copytree(out, bad)
    card = json.loads((bad / "model_card.json").read_text())
    card["feature_schema_version"] = FEATURE_SCHEMA_VERSION + offset
    (bad / "model_card.json").write_text(json.dumps(card))
    with pytest.raises(ValueError, match="feature schema version"):
        OnnxMemoryModel.load(bad)
    with pytest.raises(ValueError, match="not a memgnn model directory"):
        OnnxMemoryModel.load(tmp_path / "missing")


def test_predict_returns_bounded_predictions(model_dir, graphs):
    model = OnnxMemoryModel.load(model_dir[0])
    queries = [
        Query(sizes={"B": 8, "S": 64}, device="a100-80gb"),
        Query(sizes={"B": 2, "S": 16}, device="cpu"),
        Query(sizes={"B": 8, "S": 64}, device="h100-80gb", metric="device_total"),
    ]
    preds = model.predict(graphs["gpt"], queries)
    assert [p.metric for p in preds] == ["reserved", "allocated", "device_total"]
    for p in preds:
        assert isinstance(p, Prediction) and p.model_version == "gnn-test"
        assert 0 < p.predicted_peak_bytes <= p.upper_bound_bytes
        assert p.breakdown["analytic_bytes"] > 0
    emb = model.encode(graphs["gpt"])
    assert model.encode(graphs["gpt"]) is emb  # cached by graph id
    again = model.predict_encoded(emb, graphs["gpt"], queries)
    assert [p.to_dict() for p in again] == [p.to_dict() for p in preds]


def test_concurrent_predictions_equal_sequential_ones(model_dir, graphs):
    """The model says it is thread-safe (the server then calls it without a lock): threads
    sharing one fresh model (cold caches) get what one thread gets."""
    from concurrent.futures import ThreadPoolExecutor

    queries = [Query(sizes={"B": b, "S": 8 * b}, device="a100-80gb") for b in (1, 3, 9)]
    names = ["gpt", "mlp", "cond"] * 8
    sizes = {"mlp": lambda q: Query(sizes={"B": q.sizes["B"]}, device=q.device)}
    want = {
        n: [p.to_dict() for p in OnnxMemoryModel.load(model_dir[0]).predict(
            graphs[n], [sizes.get(n, lambda q: q)(q) for q in queries])]
        for n in set(names)
    }  # fmt: skip
    model = OnnxMemoryModel.load(model_dir[0])
    assert model.thread_safe

    def one(n: str) -> list[dict]:
        return [p.to_dict() for p in model.predict(graphs[n], [sizes.get(n, lambda q: q)(q)
                                                                for q in queries])]  # fmt: skip

    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(one, names))
    assert got == [want[n] for n in names]


def test_multi_path_graph_reports_every_path(model_dir, graphs):
    model = OnnxMemoryModel.load(model_dir[0])
    graph = graphs["cond"]
    assert len(graph.paths) == 2
    (p,) = model.predict(graph, [Query(sizes={"B": 4, "S": 8}, device="a100-80gb")])
    assert len(p.paths) == 2
    assert p.predicted_peak_bytes == max(x["predicted_peak_bytes"] for x in p.paths)
    assert p.upper_bound_bytes == max(x["upper_bound_bytes"] for x in p.paths)


def test_load_default_model_falls_back_to_analytic(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        model = load_default_model(tmp_path / "nothing-here")
    assert isinstance(model, AnalyticModel)
    assert "analytic baseline" in caplog.text
    shipped = load_default_model()  # the packaged model, or the baseline if none ships
    assert shipped.version


def test_one_query_path_answers_as_the_batch_path(model_dir, graphs, monkeypatch):
    """A request takes `PathContext.query` per query (the compiled one-query path) up to
    FEW_QUERIES queries, `query_many` above: the same request gets the same predictions,
    field for field, either way (the head sees the same rows)."""
    import memgnn.predictor.memory.onnx_model as om
    from memgnn.predictor.memory.curve_bounds import CurveBlocks

    model = OnnxMemoryModel.load(model_dir[0])
    for name in ("gpt", "cond"):
        graph = graphs[name]
        other = {k: v for k, v in graph.symbols.items() if k != "B"}
        queries = [
            Query(sizes={**other, "B": b}, device=d, metric=m)
            for b in (1, 8, 300)
            for d, m in (("a100-80gb", None), ("cpu", None), ("v100-16gb", "device_total"))
        ]
        for ctx in model._path_contexts(graph):  # many blocks, so the fast path answers
            ctx.blocks = CurveBlocks(ctx.blocks.counts, ctx.blocks.groups, block=2)
            ctx._fast = None
        monkeypatch.setattr(om, "FEW_QUERIES", len(queries))
        alone = model.predict(graph, queries)
        assert all(c._fast.usable for c in model._path_contexts(graph))
        monkeypatch.setattr(om, "FEW_QUERIES", 0)
        model._answers.clear()  # else the remembered answers come back: nothing computed
        batch = model.predict(graph, queries)
        assert [p.to_dict() for p in alone] == [p.to_dict() for p in batch]


def test_a_query_asked_again_is_answered_as_before_without_the_head(model_dir, graphs, monkeypatch):
    """Answers are remembered per (graph, sizes, device, scenario, metric): asked again,
    the same fields without features or head; a new query in the same batch is computed
    (alone), and a caller changing its answer does not change what the next one gets."""
    model = OnnxMemoryModel.load(model_dir[0])
    graph = graphs["gpt"]
    asked = [Query(sizes={"B": 4, "S": 32}, device="a100-80gb"),
             Query(sizes={"B": 4, "S": 32}, device="a100-80gb", metric="allocated")]  # fmt: skip
    first = model.predict(graph, asked)
    want = [p.to_dict() for p in first]
    first[0].breakdown["categories"]["changed by a caller"] = 1
    batches = []
    real = model._predict_batch
    monkeypatch.setattr(
        model, "_predict_batch", lambda e, g, qs: batches.append(qs) or real(e, g, qs)
    )
    new = Query(sizes={"B": 5, "S": 32}, device="a100-80gb")
    again = model.predict(graph, [*asked, new])
    assert [p.to_dict() for p in again[:2]] == want
    assert batches == [[new]]
    assert again[2].predicted_peak_bytes != again[0].predicted_peak_bytes
