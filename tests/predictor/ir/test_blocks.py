"""Block tags of a recorded step: every op and storage knows the layer it belongs to."""

import dataclasses
import itertools

import pytest
from memgnn.predictor.capture.capture import CaptureConfig, _Run
from memgnn.predictor.ir.blocks import LayerState, NotRepeated
from memgnn.predictor.spec.train import TrainSpec

from tests.predictor.capture.test_replicate import _bundle


def _runs(rec, phase):
    tags = [n.layer for n in rec.nodes if n.phase == phase and n.step == 1]
    return [t for t, _ in itertools.groupby(tags) if t is not None]


@pytest.mark.parametrize("impl", ["foreach", "for-loop"])
def test_ops_are_tagged_with_their_block_in_every_phase(impl):
    bundle = _bundle(4)
    train = TrainSpec.of(optimizer_impl=impl)
    run = _Run(bundle, train, CaptureConfig(), bundle.sizes(), tag_layers=True)
    rec = run.run([])[0]
    assert run.block_prefix == "blocks."
    assert _runs(rec, "forward") == [0, 1, 2, 3]
    assert _runs(rec, "backward") == [3, 2, 1, 0]
    if impl == "for-loop":  # per-parameter ops, in parameter order
        assert _runs(rec, "optimizer") == [0, 1, 2, 3]
    for n in rec.nodes:
        if n.layer is not None and n.phase == "forward":
            assert n.module.startswith(f"blocks.{n.layer}")
    # weights and optimizer state: the block of their parameter, the same count per block
    state = [s.layer for s in rec.storages if s.category in ("parameter", "optimizer_state")]
    assert {t: state.count(t) for t in range(4)} == {t: state.count(0) for t in range(4)}
    assert state.count(None) > 0  # embedding and head


def test_blocks_must_be_named_prefix_index():
    bundle = dataclasses.replace(_bundle(4), blocks=lambda m: list(m.blocks)[::-1])
    run = _Run(bundle, TrainSpec(), CaptureConfig(), bundle.sizes(), tag_layers=True)
    with pytest.raises(NotRepeated, match="prefix"):
        run.run([])


def test_layer_state_reset_clears_the_running_block():
    state = LayerState()
    state.current = 3
    state.reset()
    assert state.current is None and state.problems == []
