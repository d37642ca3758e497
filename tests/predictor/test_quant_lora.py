"""peft LoRA over the quantised stand-ins vs peft over real bitsandbytes layers (CPU)."""

from __future__ import annotations

import pytest
import torch
from memgnn.predictor.quant import Linear4bitSim, Linear8bitSim
from memgnn.predictor.quant_lora import QuantLoraLinear, register_quant_layers
from memgnn.predictor.recorder import StepRecorder
from torch import nn

peft = pytest.importorskip("peft")

K, N, M = 128, 256, 16
BF16 = torch.bfloat16


class _Net(nn.Module):
    def __init__(self, a: nn.Module, b: nn.Module):
        super().__init__()
        self.a, self.b = a, b

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


def _record(model: nn.Module, x: torch.Tensor) -> StepRecorder:
    rec = StepRecorder()
    with rec:
        rec.set_phase("forward", 0)
        loss = model(x).float().sum()
        rec.set_phase("backward", 0)
        loss.backward()
    rec.close()
    return rec


def _sim_net(nested: bool) -> nn.Module:
    def q(n_in: int, n_out: int) -> Linear4bitSim:
        return Linear4bitSim(
            nn.Linear(n_in, n_out, bias=False, dtype=BF16), nested=nested, compute=BF16
        )

    return _Net(q(K, N), q(N, K))


def _lora(model: nn.Module, *, custom: bool) -> nn.Module:
    config = peft.LoraConfig(r=4, target_modules=["a", "b"])
    if custom:
        register_quant_layers(config)
    return peft.get_peft_model(model, config)


def test_the_quantised_linears_get_quant_lora_layers_with_fp32_adapters():
    model = _lora(_sim_net(False), custom=True)
    inner = model.get_base_model()
    assert isinstance(inner.a, QuantLoraLinear) and isinstance(
        inner.a.get_base_layer(), Linear4bitSim
    )
    adapters = [p for p in model.parameters() if p.requires_grad]
    assert sum(p.numel() for p in adapters) == 4 * (K + N) * 2
    assert {p.dtype for p in adapters} == {torch.float32}


def test_int8_base_gets_a_lora_layer_too():
    net = _Net(
        Linear8bitSim(nn.Linear(K, N, dtype=BF16)), Linear8bitSim(nn.Linear(N, K, dtype=BF16))
    )
    model = _lora(net, custom=True)
    assert isinstance(model.get_base_model().b, QuantLoraLinear)
    x = torch.randn(2, M, K, dtype=BF16)
    loss = model(x).float().sum()
    loss.backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


@pytest.mark.parametrize("nested", [False, True])
def test_a_real_bitsandbytes_nf4_lora_step_on_cpu_allocates_the_same(nested):
    """The same step over real `bnb.nn.Linear4bit` (its CPU backend) and peft's own bnb
    LoRA layer: every storage the dispatcher sees matches in size, dtype and order. What
    the stand-in shows in addition is the dequantised weight in forward, which the real
    `bitsandbytes::gemm_4bit` op allocates inside itself (its default kernel dequantises,
    then `F.linear`), where a dispatch mode cannot see it; with double quantisation that
    op also hides the dequantised absmax (two fp32 block vectors on CUDA)."""
    bnb = pytest.importorskip("bitsandbytes")
    torch.manual_seed(0)

    def real(n_in: int, n_out: int) -> nn.Module:
        layer = bnb.nn.Linear4bit(
            n_in,
            n_out,
            bias=False,
            compute_dtype=BF16,
            quant_type="nf4",
            compress_statistics=nested,
        )
        layer.weight = bnb.nn.Params4bit(
            torch.randn(n_out, n_in, dtype=BF16),
            requires_grad=False,
            quant_type="nf4",
            compress_statistics=nested,
            module=layer,
        )
        return layer

    real_net = _Net(real(K, N), real(N, K)).to("cpu")  # .to quantises
    real_net.is_loaded_in_4bit = True  # as transformers marks a 4-bit model; peft reads it
    # the quantised state: the same storages, dtypes and bytes
    for layer, sim in zip((real_net.a, real_net.b), _sim_net(nested).children(), strict=True):
        qs = layer.weight.quant_state
        tensors = [layer.weight, qs.absmax, qs.code]
        if nested:
            tensors += [qs.offset, qs.state2.absmax, qs.state2.code]
        have = sorted((t.untyped_storage().nbytes(), t.dtype) for t in tensors)
        want = [sim.weight, *(b for n, b in sim.named_buffers() if n != "dynamic_code")]
        assert have == sorted((t.untyped_storage().nbytes(), t.dtype) for t in want)

    x = torch.randn(2, M, K, dtype=BF16)
    got = _record(_lora(real_net, custom=False), x)
    sim = _record(_lora(_sim_net(nested), custom=True), x)

    def seq(rec: StepRecorder, drop: set) -> list:
        return [
            (s.phase, s.nbytes, s.dtype)
            for s in rec.storages
            if s.alloc_node >= 0 and (s.phase, s.nbytes, s.dtype) not in drop
        ]

    hidden = {("forward", N * K * 2, "bfloat16")}
    if nested:
        hidden.add(("forward", 4 * (N * K // 64), "float32"))
    assert seq(sim, hidden) == seq(got, set())
    assert len(seq(sim, set())) - len(seq(got, set())) == (6 if nested else 2)
