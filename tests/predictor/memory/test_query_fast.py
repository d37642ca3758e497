"""The one-query path (`predictor.memory.query_fast`) against the batch reference
`PathContext.query_many`: the same features, analytic numbers and breakdown to the bit."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from memgnn.predictor.capture.capture import CaptureConfig, capture
from memgnn.predictor.memory.curve_bounds import CurveBlocks
from memgnn.predictor.memory.query_fast import FastQuery
from memgnn.predictor.memory.query_features import PathContext
from memgnn.predictor.spec.devices import PROFILES, get_profile
from memgnn.predictor.spec.train import TrainSpec

SIZES = [(1, 1), (1, 8), (2, 32), (3, 40), (7, 130), (16, 256), (64, 2048), (400, 4000)]


def _small_blocks(ctx: PathContext, block: int) -> FastQuery:
    """A fast path over blocks of `block` curve nodes, so a tiny graph has many blocks."""
    ctx.blocks = CurveBlocks(ctx.blocks.counts, ctx.blocks.groups, block=block)
    return FastQuery(ctx)


def _same(ref, got) -> None:
    assert got is not None, "the fast path fell back where it should answer"
    assert got.features.dtype == ref.features.dtype == np.float32
    diff = np.flatnonzero(ref.features != got.features)
    assert not len(diff), (diff, ref.features[diff], got.features[diff])
    assert np.array_equal(ref.analytic, got.analytic)
    assert np.array_equal(ref.baseline, got.baseline)
    assert ref.breakdown == got.breakdown


@pytest.mark.parametrize("block", [1, 2, 5, 64])
def test_fast_query_equals_the_batch_reference(gpt_graph, block):
    ctx = PathContext(gpt_graph)
    fast = _small_blocks(ctx, block)
    if len(ctx.blocks.starts) <= 2:
        assert fast.query({"B": 2, "S": 32}, get_profile("cpu"), "worst") is None
        return
    for (b, s), device, scenario in itertools.product(SIZES, PROFILES, ("worst", "min")):
        ask = ({"B": b, "S": s}, get_profile(device), scenario)
        _same(ctx.query_many([ask])[0], fast.query(*ask))


def test_fast_query_on_every_path_of_a_branching_graph(cond_model):
    graph = capture(cond_model, TrainSpec.of(optimizer="adamw"), CaptureConfig(target="cuda"))
    assert len(graph.paths) > 1
    for k in range(len(graph.paths)):
        ctx = PathContext(graph, k)
        fast = _small_blocks(ctx, 2)
        for b, device in itertools.product((1, 3, 32, 1000), ("a100-80gb", "cpu", "t4-16gb")):
            ask = ({**graph.symbols, "B": b}, get_profile(device), "worst")
            _same(ctx.query_many([ask])[0], fast.query(*ask))


def test_query_uses_the_fast_path_and_falls_back_past_its_range(gpt_graph, monkeypatch):
    """`PathContext.query` answers from the fast path; sizes it cannot promise the bits
    for (2**16 and above) take `query_many`, with the same answer as asking it directly."""
    ctx = PathContext(gpt_graph)
    fast = _small_blocks(ctx, 2)
    ctx._fast = fast
    calls = []
    reference = ctx.query_many
    monkeypatch.setattr(ctx, "query_many", lambda asks: calls.append(asks) or reference(asks))
    device = get_profile("a100-80gb")
    small = {"B": 4, "S": 64}
    _same(reference([(small, device, "worst")])[0], ctx.query(small, device))
    assert calls == []
    big = {"B": 1 << 16, "S": 8}
    assert fast.query(big, device, "worst") is None
    got = ctx.query(big, device)
    assert len(calls) == 1
    _same(reference([(big, device, "worst")])[0], got)


def test_fast_query_refuses_what_the_reference_refuses(gpt_graph):
    ctx = PathContext(gpt_graph)
    fast = _small_blocks(ctx, 2)
    with pytest.raises(ValueError, match="positive integer"):
        fast.query({"B": 0, "S": 8}, get_profile("cpu"), "worst")
    with pytest.raises(ValueError, match="missing"):
        fast.query({"B": 2}, get_profile("cpu"), "worst")
