"""Repeated-block capture: the replicated graph is the full capture, or it is not used."""

import dataclasses

import pytest
import torch
from memgnn.predictor.capture.capture import CaptureConfig, capture
from memgnn.predictor.capture.replicate import _expand, replicate
from memgnn.predictor.ir.blocks import NotRepeated
from memgnn.predictor.ir.graph import PathGraph
from memgnn.predictor.spec.bundle import ModelBundle
from memgnn.predictor.spec.train import TrainSpec
from torch import nn

from tests.tiny_models import Block, TinyGPT, tiny_gpt_bundle


class OddBlock(Block):
    """A block that does more work when its index is odd (alike in structure)."""

    def __init__(self, d: int, odd: bool):
        super().__init__(d)
        self.odd = odd

    def forward(self, x):
        x = super().forward(x)
        return x * torch.sigmoid(x) if self.odd else x


class Alternating(TinyGPT):
    def __init__(self, layers: int):
        super().__init__(layers=layers)
        self.blocks = nn.ModuleList(OddBlock(32, i % 2 == 1) for i in range(layers))


def _bundle(layers: int, model=TinyGPT) -> ModelBundle:
    return tiny_gpt_bundle(layers, model, depth_knob=True)


TRAINS = [
    TrainSpec(),
    TrainSpec.of(optimizer_impl="for-loop", steps="steady"),
    TrainSpec.of(precision="bf16", optimizer_impl="fused", checkpointing="full"),
    TrainSpec.of(precision="amp-bf16", optimizer="sgd", grad_accum=2, checkpointing="blocks:9"),
]


@pytest.mark.parametrize("train", TRAINS, ids=lambda t: f"{t.numerics.precision}-{t.optim.impl}")
def test_replicated_graph_is_the_full_capture(train):
    bundle = _bundle(7)
    fast = capture(bundle, train, CaptureConfig(mode="blocks", blocks_depth=4))
    full = capture(bundle, train, CaptureConfig(mode="full"))
    assert fast.meta["capture"] == {"mode": "blocks", "captured_blocks": 4, "blocks": 7}
    assert full.meta["capture"]["mode"] == "full"
    assert fast.paths[0].nodes == full.paths[0].nodes
    assert fast.paths[0].storages == full.paths[0].storages
    assert fast.graph_id == full.graph_id
    assert fast.meta["model_info"]["parameters"] == full.meta["model_info"]["parameters"]


def test_blocks_that_differ_fall_back_to_the_full_capture():
    bundle = _bundle(6, Alternating)
    got = capture(bundle, TrainSpec(), CaptureConfig(mode="blocks", blocks_depth=4))
    assert got.meta["capture"]["mode"] == "full"
    assert "does not replicate" in got.meta["capture"]["why"]
    assert got.graph_id == capture(bundle, TrainSpec(), CaptureConfig(mode="full")).graph_id


@pytest.mark.parametrize(
    ("train", "why"),
    [
        (TrainSpec.of(checkpointing="blocks:2"), "checkpointing 2 of 6"),
        (TrainSpec.of(gpus=2, sharding="ddp"), "one rank of a process group"),
    ],
)
def test_ineligible_steps_are_captured_in_full(train, why):
    got = capture(_bundle(6), train, CaptureConfig(mode="blocks", target="cpu"))
    assert got.meta["capture"]["mode"] == "full" and why in got.meta["capture"]["why"]


def test_a_model_without_depth_knob_or_too_shallow_is_captured_in_full():
    plain = dataclasses.replace(_bundle(6), layers=None, with_layers=None)
    assert "depth knob" in capture(plain, TrainSpec()).meta["capture"]["why"]
    assert "no more than" in capture(_bundle(4), TrainSpec()).meta["capture"]["why"]


def test_expand_repeats_a_middle_block_in_both_directions():
    tags = [None, 0, 1, 1, 2, 2, 3, None, 3, 2, 1, 0, 0]
    got = _expand(tags, 4, 5)
    assert got == [
        (0, None), (1, 0), (2, 1), (3, 1), (2, 2), (3, 2), (2, 3), (3, 3), (6, 4),
        (7, None), (8, 4), (10, 3), (10, 2), (10, 1), (11, 0), (12, 0),
    ]  # fmt: skip
    with pytest.raises(NotRepeated, match="order"):
        _expand([0, 2, 1, 3], 4, 5)
    with pytest.raises(NotRepeated, match="length"):
        _expand([0, 1, 1, 2, 3], 4, 5)


def _chain(d: int) -> tuple[PathGraph, list, list]:
    """x0 -> block 0 -> ... -> block d-1 -> loss: node i makes storage i from storage i-1."""
    n = d + 1
    nodes = {
        "op": ["embed"] + ["mm"] * d,
        "phase": [1] * n, "step": [0] * n, "micro": [0] * n,
        "module": ["emb"] + [f"blocks.{i}" for i in range(d)],
        "inputs": [[]] + [[i] for i in range(d)],
        "outputs": [[i] for i in range(n)],
        "scratch": [0] * n,
    }  # fmt: skip
    storages = {
        "nbytes": [1] * n, "dtype": ["float32"] * n, "category": [0] * n,
        "alloc": list(range(n)), "free": [min(i + 1, d) for i in range(n)],
    }  # fmt: skip
    tags = [None, *range(d)]
    return PathGraph(conditions=[], nodes=nodes, storages=storages), tags, list(tags)


def test_replicate_links_each_copy_to_the_previous_one():
    path, nl, sl = _chain(4)
    out, table = replicate(path, nl, sl, ["0", "4"], depth=4, layers=6, prefix="blocks.")
    want, _, _ = _chain(6)
    assert out.nodes == want.nodes | {"scratch": [0] * 7}
    assert out.storages == want.storages
    assert table == ["0", "4"]


def test_replicate_refuses_a_block_that_reads_one_two_away():
    path, nl, sl = _chain(4)
    path.nodes["inputs"][4] = [1, 3]  # block 3 also reads block 0's output
    with pytest.raises(NotRepeated):
        replicate(path, nl, sl, ["0", "4"], depth=4, layers=6, prefix="blocks.")


def test_depth_knob_is_both_or_neither():
    with pytest.raises(ValueError, match="both"):
        dataclasses.replace(_bundle(6), with_layers=None)
    with pytest.raises(ValueError, match="blocks_depth"):
        CaptureConfig(blocks_depth=3)
    with pytest.raises(ValueError, match="mode"):
        CaptureConfig(mode="some")


class Stacked(TinyGPT):
    """Sums every block's output through one stack: a storage whose size grows with depth."""

    def forward(self, ids):
        x, outs = self.emb(ids), []
        for blk in self.blocks:
            x = blk(x)
            outs.append(x)
        return self.head(torch.stack(outs).sum(0))


def test_an_op_over_every_block_making_a_storage_falls_back():
    bundle = _bundle(6, Stacked)
    got = capture(bundle, TrainSpec(), CaptureConfig(mode="blocks"))
    assert got.meta["capture"]["mode"] == "full"  # (its backward reads the middle blocks)
    assert got.graph_id == capture(bundle, TrainSpec(), CaptureConfig(mode="full")).graph_id


def test_old_bnb_inputs_freed_at_one_node_replicate(tmp_path):
    """bitsandbytes < 0.43.2 keeps every 4-bit matmul's input until the graph goes: all
    blocks' inputs die at one node of the first block's backward, and replicate."""
    pytest.importorskip("peft")
    transformers = pytest.importorskip("transformers")
    from memgnn.predictor import zoo

    from tests.tiny_models import tiny_llama_config

    config = tiny_llama_config()
    config.num_hidden_layers = 6
    config.to_json_file(str(tmp_path / "config.json"))
    bundle = zoo.resolve(f"hf:{tmp_path / 'config.json'}")
    assert transformers and bundle.layers == 6
    train = TrainSpec.of(
        peft="lora", lora_targets="q_proj,v_proj", precision="bf16", quantize_base="nf4",
        bnb_version="0.42.0",
    )  # fmt: skip
    sizes = {"B": 2, "S": 16}
    fast = capture(bundle, train, CaptureConfig(target="cuda", sizes=sizes, blocks_depth=4))
    full = capture(bundle, train, CaptureConfig(target="cuda", sizes=sizes, mode="full"))
    assert fast.meta["capture"] == {"mode": "blocks", "captured_blocks": 4, "blocks": 6}
    assert fast.graph_id == full.graph_id


@pytest.mark.parametrize(
    "options",
    [
        {"offload_activations": "save_on_cpu"},
        {"offload_activations": "torchtune", "checkpointing": "full"},
        {"offload_activations": "torchtune"},
        {"optimizer_in_bwd": True},
    ],
    ids=lambda o: "-".join(str(v) for v in o.values()),
)
def test_offloaded_steps_replicate_to_the_full_capture_or_fall_back(options):
    # host storages carry their place and bytes through replication (graph format 2)
    bundle, train = _bundle(7), TrainSpec.of(**options)
    fast = capture(bundle, train, CaptureConfig(mode="blocks", blocks_depth=4))
    full = capture(bundle, train, CaptureConfig(mode="full"))
    # torchtune's forward stash frees a tensor 5 saves later, blocks away: in full
    mode = "full" if options.get("offload_activations") == "torchtune" else "blocks"
    assert fast.meta["capture"]["mode"] == mode
    assert fast.paths[0].storages == full.paths[0].storages
    assert fast.graph_id == full.graph_id
    if "offload_activations" in options:
        assert "place" in fast.paths[0].storages
