"""torchtitan's activation checkpointing: op-level selective (`--checkpointing selective-op`,
PyTorch's selective checkpointing with torchtitan's policy) and per-layer (`every:N`), each
against a real CPU step and the saved bytes by hand."""

from __future__ import annotations

import functools

import pytest
from memgnn.dataset.profile import ProfileConfig, profile
from memgnn.predictor.capture.capture import CaptureConfig, capture
from memgnn.predictor.emulate.selective import SAVE_LIST
from memgnn.predictor.ir.vocab import PHASES
from memgnn.predictor.spec.train import TrainSpec

SIZES = {"B": 3, "S": 40}


@functools.cache
def _llama():
    from memgnn.predictor.zoo.resolve import resolve

    return resolve("llama")


@pytest.mark.parametrize(
    ("value", "blocks"),
    [
        ("none", []),
        ("full", [0, 1, 2, 3, 4]),
        ("selective-op", [0, 1, 2, 3, 4]),
        ("blocks:2", [0, 1]),
        ("every:2", [1, 3]),  # torchtitan's counter from 1: the 2nd and 4th block
        ("every:3", [2]),
        ("every:1", [0, 1, 2, 3, 4]),
    ],
)
def test_which_blocks_are_checkpointed(value, blocks):
    assert TrainSpec.of(checkpointing=value).activations.checkpointed(5) == blocks


@pytest.mark.parametrize("value", ["every:0", "selective", "op", "every:x"])
def test_bad_checkpointing_values_are_refused(value):
    with pytest.raises(ValueError, match="bad checkpointing"):
        TrainSpec.of(checkpointing=value)


def test_compile_with_op_level_selective_checkpointing_is_modelled():
    """Checked against real compiled CPU steps, on one process (tests/predictor/emulate/
    test_compile.py) and over 2 gloo ranks with FSDP2 (test_compile_sharded.py)."""
    TrainSpec.of(compile="blocks", checkpointing="selective-op")
    TrainSpec.of(compile="blocks", checkpointing="selective-op", sharding="fsdp", gpus=2)


def test_the_save_list_is_torchtitans():
    import torch

    aten = torch.ops.aten
    assert {aten.mm.default, aten._scaled_dot_product_flash_attention.default} <= SAVE_LIST
    assert {aten.max.default, aten._scaled_dot_product_efficient_attention.default} <= SAVE_LIST
    assert aten.addmm.default not in SAVE_LIST  # every other op is recomputed


def _saved_by_module(ck: str, target: str = "cpu", **options) -> dict[str, int]:
    """Bytes of the first step's forward storages still alive when backward starts (what
    the forward keeps for backward), by the module whose op allocated them."""
    train = TrainSpec.of(checkpointing=ck, **options)
    graph = capture(_llama(), train, CaptureConfig(target=target, symbolic=False, sizes=SIZES))
    p = graph.paths[0]
    nbytes = graph.storage_bytes(0, graph.resolve_sizes(SIZES))
    forward, backward = PHASES.index("forward"), PHASES.index("backward")
    out: dict[str, int] = {}
    for u in range(p.num_storages):
        alloc, free = int(p.storages["alloc"][u]), int(p.storages["free"][u])
        if alloc < 0 or p.nodes["phase"][alloc] != forward or p.nodes["step"][alloc] != 0:
            continue
        if free >= 0 and p.nodes["phase"][free] != backward:
            continue
        key = f"{p.nodes['module'][alloc]}:{p.nodes['op'][alloc]}"
        out[key] = out.get(key, 0) + int(nbytes[u])
    return out


@pytest.mark.slow  # three captures, ~10 s
def test_selective_op_saves_every_other_mm_of_each_block_by_hand():
    """Per block, SAC's cache keeps the outputs of the 1st, 3rd, 5th and 7th matmul
    (q_proj, v_proj, gate_proj, down_proj; k, o and up are recomputed) on top of what
    full checkpointing keeps (the block's input): B x S x (hidden + kv_heads x head_dim +
    ffn + hidden) x 4 bytes = 120 x (64 + 32 + 172 + 64) x 4 = 159,360 B a block (fp32).
    On the CPU, attention runs `_scaled_dot_product_flash_attention_for_cpu`, not in
    torchtitan's list: recomputed. On a CUDA target (bf16) the flash kernel's outputs are
    saved too (torchtitan's list names `_scaled_dot_product_flash_attention`)."""
    h = _llama().hparams
    tokens, head = SIZES["B"] * SIZES["S"], h["hidden"] // h["heads"]
    per_block = tokens * (h["hidden"] + h["kv_heads"] * head + h["ffn"] + h["hidden"]) * 4
    assert per_block == 159_360
    full, sac = _saved_by_module("full"), _saved_by_module("selective-op")
    assert sum(sac.values()) - sum(full.values()) == h["layers"] * per_block
    for i in range(h["layers"]):
        mms = {k: v for k, v in sac.items() if k.startswith(f"model.layers.{i}.")}
        assert mms == {
            f"model.layers.{i}.self_attn.q_proj:mm.default": tokens * h["hidden"] * 4,
            f"model.layers.{i}.self_attn.v_proj:mm.default": tokens * h["kv_heads"] * head * 4,
            f"model.layers.{i}.mlp.gate_proj:mm.default": tokens * h["ffn"] * 4,
            f"model.layers.{i}.mlp.down_proj:mm.default": tokens * h["hidden"] * 4,
        }
    cuda = _saved_by_module("selective-op", "cuda", precision="bf16")
    flash = [k for k in cuda if k.endswith("_scaled_dot_product_flash_attention.default")]
    assert len(flash) == h["layers"]


def _same_as_a_real_cpu_step(train: TrainSpec) -> int:
    """memgnn's CPU recorder on a real step against the capture + replay of the same step."""
    real = profile(_llama(), train, SIZES, ProfileConfig(backend="cpu"))
    sim = profile(_llama(), train, SIZES, ProfileConfig(backend="sim", device="cpu"))
    assert sim.peak_allocated_bytes == real.peak_allocated_bytes
    assert sim.breakdown["tensor_phase_peaks"] == real.breakdown["tensor_phase_peaks"]
    return sim.peak_allocated_bytes


@pytest.mark.slow  # five real steps and five captures, ~40 s
def test_torchtitans_checkpointing_equals_a_real_cpu_step():
    """Each mode's peak is a real CPU step's, to the byte. Measured (B=3, S=40, fp32, the
    2-block llama): none 3,934,076, full 3,047,836, selective-op 3,095,356, every:2
    3,475,676, blocks:1 3,355,516. Position matters: every:2 checkpoints the LAST block
    (torchtitan's layer counter), whose recomputation runs first in backward with every
    other block's activations still alive; blocks:1 (the first) peaks 120,160 B lower."""
    peaks = {
        ck: _same_as_a_real_cpu_step(TrainSpec.of(checkpointing=ck))
        for ck in ("none", "full", "selective-op", "every:2", "blocks:1")
    }
    assert peaks["full"] < peaks["selective-op"] < peaks["none"]
    assert peaks["blocks:1"] < peaks["every:2"] < peaks["none"]
