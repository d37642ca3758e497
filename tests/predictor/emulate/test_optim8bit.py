"""--optimizer adamw8bit: bitsandbytes' AdamW8bit state bytes, by hand."""

from __future__ import annotations

import pytest
import torch
from memgnn.predictor.capture.capture import CaptureConfig, capture
from memgnn.predictor.emulate.optim8bit import AdamW8bit, adamw8bit_state_bytes
from memgnn.predictor.memory.analytic import sweep
from memgnn.predictor.spec.train import TrainSpec
from tiny_models import LLAMA_HIDDEN, LLAMA_KV, LLAMA_LAYERS, tiny_hf_llama_bundle
from torch import nn


def _state_bytes(opt: torch.optim.Optimizer) -> int:
    seen: dict[int, int] = {}
    for state in opt.state.values():
        for v in state.values():
            if isinstance(v, torch.Tensor):
                seen[v.untyped_storage().data_ptr()] = v.untyped_storage().nbytes()
    return sum(seen.values())


def test_state_per_parameter_by_hand():
    small = nn.Parameter(torch.zeros(4095, dtype=torch.bfloat16))  # < min_8bit_size: fp32
    edge = nn.Parameter(torch.zeros(64, 64, dtype=torch.bfloat16))  # 4096: 8-bit
    big = nn.Parameter(torch.zeros(10_000, dtype=torch.bfloat16))  # 8-bit, 40 blocks (last part)
    frozen = nn.Parameter(torch.zeros(8192))  # no grad: no state
    opt = AdamW8bit([small, edge, big, frozen], lr=1e-3)
    for p in (small, edge, big):
        p.grad = torch.zeros_like(p)
    opt.step()
    assert opt.state[small]["state1"].dtype == torch.float32
    assert opt.state[big]["state1"].dtype == torch.uint8
    assert opt.state[big]["absmax1"].shape == (40,)
    assert frozen not in opt.state
    by_hand = (
        2 * 4 * 4095  # two fp32 states
        + 2 * 4096
        + 2 * 4 * 16  # two uint8 states, two fp32 absmax of 16 blocks
        + 2 * 10_000
        + 2 * 4 * 40
        + 2 * 256 * 4  # the signed and unsigned dynamic maps, once
    )
    assert _state_bytes(opt) == by_hand
    assert adamw8bit_state_bytes([4095, 4096, 10_000]) == by_hand
    assert opt.state[edge]["step"] == 1
    opt.step()
    assert opt.state[edge]["step"] == 2 and _state_bytes(opt) == by_hand  # nothing new


def test_bad_arguments_are_rejected():
    with pytest.raises(ValueError, match="lr"):
        AdamW8bit([nn.Parameter(torch.zeros(1))], lr=0.0)
    with pytest.raises(ValueError, match="min_8bit_size"):
        AdamW8bit([nn.Parameter(torch.zeros(1))], min_8bit_size=0)


def test_a_lora_capture_holds_exactly_the_8bit_state(tmp_path):
    pytest.importorskip("peft")
    pytest.importorskip("transformers")
    hidden, kv, layers = LLAMA_HIDDEN, LLAMA_KV, LLAMA_LAYERS
    bundle = tiny_hf_llama_bundle(tmp_path)
    train = TrainSpec.of(
        peft="lora", lora_r=64, lora_targets="q_proj,v_proj", optimizer="adamw8bit", steps="steady"
    )
    graph = capture(bundle, train, CaptureConfig(target="cuda", sizes={"B": 2, "S": 16}))
    swept = sweep(graph, {"B": 2, "S": 16})
    # q: A 64x64, B 64x64 (8-bit); v: A 64x64 (8-bit), B 32x64 = 2048 < 4096 (32-bit)
    numels = layers * [64 * hidden, hidden * 64, 64 * hidden, kv * 64]
    assert swept.best.breakdown["optimizer_state"] == adamw8bit_state_bytes(numels)
