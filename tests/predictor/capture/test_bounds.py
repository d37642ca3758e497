"""Sizes a model cannot run: a position table smaller than the sequence (item 4)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from memgnn.predictor.capture.branches import CaptureError
from memgnn.predictor.capture.capture import CaptureConfig, capture
from memgnn.predictor.capture.query import graph_for_query
from memgnn.predictor.memory.analytic import AnalyticModel
from memgnn.predictor.memory.base import GuardViolation, Query
from memgnn.predictor.spec.bundle import ModelBundle
from memgnn.predictor.spec.train import TrainSpec
from torch import nn

POSITIONS = 32


class LearnedPositions(nn.Module):
    """Token + learned position embeddings, as GPT-2 (positions from arange(S))."""

    def __init__(self, vocab: int = 40, d: int = 16):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(POSITIONS, d)
        self.head = nn.Linear(d, vocab)

    def forward(self, ids):
        positions = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0)
        return self.head(self.tok(ids) + self.pos(positions))


def _bundle() -> ModelBundle:
    def inputs(sizes, device, dtype):
        return {"ids": torch.randint(0, 40, (sizes["B"], sizes["S"]), device=device)}

    def loss(model, i):
        return F.cross_entropy(model(i["ids"]).flatten(0, 1), i["ids"].flatten())

    return ModelBundle(
        name="learned-positions",
        family="gpt",
        build=LearnedPositions,
        make_inputs=inputs,
        loss=loss,
        dims={"B": 2, "S": 8},
    )


def test_real_step_fails_past_the_table():  # what the guard stands for
    model, ids = LearnedPositions(), torch.zeros(1, POSITIONS + 1, dtype=torch.long)
    with pytest.raises(IndexError):
        model(ids)


def test_capture_records_the_position_limit_as_a_guard():
    graph = capture(_bundle(), TrainSpec(), CaptureConfig(target="cpu"))
    ok = graph.resolve_sizes({"B": 2, "S": POSITIONS})
    past = graph.resolve_sizes({"B": 2, "S": POSITIONS + 1})
    assert graph.violated_guards(ok) == [] and graph.violated_guards(past)
    with pytest.raises(GuardViolation):
        AnalyticModel().predict(graph, [Query(sizes={"B": 2, "S": 4096}, device="cpu")])


def test_concrete_capture_past_the_table_fails_naming_the_module():
    cfg = CaptureConfig(symbolic=False, target="cpu", sizes={"B": 1, "S": POSITIONS + 1})
    with pytest.raises(CaptureError, match=r"'pos'.*32 rows"):
        capture(_bundle(), TrainSpec(), cfg)


def test_graph_for_query_refuses_a_size_the_model_cannot_run(tmp_path):
    with pytest.raises(ValueError, match=r"learned-positions.*32 rows|cannot run"):
        graph_for_query(_bundle(), TrainSpec(), {"B": 2, "S": 4096}, target="cpu",
                        directory=tmp_path)  # fmt: skip


def test_hf_gpt2_positions_become_a_guard():
    """transformers' GPT-2 takes positions as arange(S) + past_seen_tokens into wpe."""
    transformers = pytest.importorskip("transformers")
    from functools import partial

    from memgnn.predictor.zoo.hf import build_hf, causal_inputs, hf_step

    config = transformers.GPT2Config(
        n_layer=1, n_embd=16, n_head=2, vocab_size=40, n_positions=POSITIONS
    )
    bundle = ModelBundle(
        name="tiny-hf-gpt2",
        family="gpt2",
        build=partial(build_hf, config, "causal-lm"),
        make_inputs=partial(causal_inputs, vocab=40),
        loss=hf_step,
        dims={"B": 2, "S": 8},
    )
    graph = capture(bundle, TrainSpec(), CaptureConfig(target="cuda"))
    assert graph.violated_guards(graph.resolve_sizes({"B": 2, "S": POSITIONS})) == []
    assert graph.violated_guards(graph.resolve_sizes({"B": 2, "S": POSITIONS + 1}))
