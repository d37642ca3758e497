"""A graph answers only at sizes where the guards recorded at its capture hold."""

from __future__ import annotations

from functools import partial

import pytest
from memgnn.predictor.capture.capture import CaptureConfig, capture
from memgnn.predictor.capture.query import graph_for_query
from memgnn.predictor.memory.analytic import AnalyticModel
from memgnn.predictor.memory.base import GuardViolation, Query
from memgnn.predictor.spec.bundle import ModelBundle
from memgnn.predictor.spec.train import TrainSpec

transformers = pytest.importorskip("transformers")

WINDOW = 16


def _sliding_window_bundle() -> ModelBundle:
    """A one-layer Mistral whose attention mask changes once S reaches its window."""
    from memgnn.predictor.zoo.hf import build_hf, causal_inputs, hf_step

    config = transformers.MistralConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, sliding_window=WINDOW,
        max_position_embeddings=256,
    )  # fmt: skip
    return ModelBundle(
        name="tiny-mistral-window",
        family="mistral",
        build=partial(build_hf, config, "causal-lm"),
        make_inputs=partial(causal_inputs, vocab=64),
        loss=hf_step,
        dims={"B": 2, "S": 8},
    )


@pytest.fixture(scope="module")
def window():
    bundle = _sliding_window_bundle()
    cfg = CaptureConfig(target="cpu")
    return bundle, capture(bundle, TrainSpec(), cfg)


def test_capture_records_the_window_guard(window):
    _, graph = window
    resolved = graph.resolve_sizes({"B": 2, "S": 12})
    assert graph.violated_guards(resolved) == []
    assert graph.violated_guards(graph.resolve_sizes({"B": 2, "S": 4 * WINDOW}))


def test_query_past_a_guard_is_refused(window):
    _, graph = window
    with pytest.raises(GuardViolation, match=r"S < 16|S >= 16|guard"):
        AnalyticModel().predict(graph, [Query(sizes={"B": 2, "S": 4 * WINDOW}, device="cpu")])


def test_graph_for_query_recaptures_where_the_guards_hold(window, tmp_path):
    bundle, _ = window
    sizes = {"B": 2, "S": 4 * WINDOW}
    graph = graph_for_query(bundle, TrainSpec(), sizes, target="cpu", directory=tmp_path)
    assert graph.violated_guards(graph.resolve_sizes(sizes)) == []
    direct = capture(bundle, TrainSpec(), CaptureConfig(target="cpu", sizes=sizes))
    q = [Query(sizes=sizes, device="cpu")]
    got = AnalyticModel().predict(graph, q)[0].predicted_peak_bytes
    assert got == AnalyticModel().predict(direct, q)[0].predicted_peak_bytes


def test_a_recapture_at_the_query_sizes_is_cached(window, tmp_path, monkeypatch):
    """Past the window the first query captures twice (the example sizes, then its own);
    the next query at those sizes reads both graphs from the cache and captures nothing."""
    from memgnn.predictor.capture import capture as capture_module

    bundle, _ = window
    sizes = {"B": 2, "S": 4 * WINDOW}
    calls = []
    real = capture_module.capture
    monkeypatch.setattr(capture_module, "capture", lambda *a, **k: calls.append(a) or real(*a, **k))
    first = graph_for_query(bundle, TrainSpec(), sizes, target="cpu", directory=tmp_path)
    assert len(calls) == 2
    again = graph_for_query(bundle, TrainSpec(), sizes, target="cpu", directory=tmp_path)
    assert len(calls) == 2
    assert again.graph_id == first.graph_id
    assert len(list((tmp_path / "graphs").glob("*.json.gz"))) == 2
    # another size past the window is its own capture, not the first one's graph
    other = {"B": 2, "S": 5 * WINDOW}
    graph_for_query(bundle, TrainSpec(), other, target="cpu", directory=tmp_path)
    assert len(calls) == 3
