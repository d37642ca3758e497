"""peft LoRA over the quantised stand-ins vs peft over real bitsandbytes layers (CPU)."""

from __future__ import annotations

import pytest
import torch
from memgnn.predictor.emulate.quant import Linear4bitSim, Linear8bitSim
from memgnn.predictor.emulate.quant_lora import QuantLoraLinear, register_quant_layers
from memgnn.predictor.ir.recorder import StepRecorder
from tiny_models import tiny_llama_config
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


def _lora(model: nn.Module, *, custom: bool, autocast: bool = True) -> nn.Module:
    config = peft.LoraConfig(r=4, target_modules=["a", "b"])
    if custom:
        register_quant_layers(config)
    return peft.get_peft_model(model, config, autocast_adapter_dtype=autocast)


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


@pytest.mark.parametrize(("nested", "autocast"), [(False, True), (True, True), (False, False)])
def test_a_real_bitsandbytes_nf4_lora_step_on_cpu_allocates_the_same(nested, autocast):
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
    # autocast=False: adapters in the base's bf16 (--lora-dtype model), as LitGPT's QLoRA
    real_lora = _lora(real_net, custom=False, autocast=autocast)
    sim_lora = _lora(_sim_net(nested), custom=True, autocast=autocast)
    want = torch.float32 if autocast else BF16
    for m in (real_lora, sim_lora):
        assert {p.dtype for p in m.parameters() if p.requires_grad} == {want}
    got = _record(real_lora, x)
    sim = _record(sim_lora, x)

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


def _live_peak(rec: StepRecorder, skip: set[int]) -> int:
    """Peak of live storage bytes over the recorded nodes (storages in `skip` count 0)."""
    nbytes = {s.uid: 0 if s.uid in skip else s.nbytes for s in rec.storages}
    live = peak = sum(nbytes[s.uid] for s in rec.storages if s.alloc_node < 0)
    for node in rec.nodes:
        live += sum(nbytes[u] for u in node.new)
        peak = max(peak, live)
        live -= sum(nbytes[u] for u in node.frees)
    return peak


@pytest.mark.parametrize(("method", "dropout"), [("lora", 0.0), ("dora", 0.0), ("dora", 0.1)])
def test_a_real_bitsandbytes_qlora_llama_step_on_cpu_matches(method, dropout):
    """A tiny Llama quantised by transformers' own `replace_with_bnb_linear` (real
    `bnb.nn.Linear4bit`, nf4, quantised on the CPU) with peft's bnb LoRA (and DoRA: QDoRA,
    whose weight norm dequantises each adapted base weight), one training step, against
    `quantize_model` + `apply_peft`: the same Linears are quantised, and the step allocates
    the same storages in the same order with the same peak of live tensor bytes, once the
    dequantised weights the real `gemm_4bit` op hides are left out."""
    bnb = pytest.importorskip("bitsandbytes")
    transformers = pytest.importorskip("transformers")
    from memgnn.predictor.emulate.peft import apply_peft
    from memgnn.predictor.emulate.quant import quantize_model
    from memgnn.predictor.spec.train import TrainSpec
    from transformers.integrations.bitsandbytes import replace_with_bnb_linear
    from transformers.quantizers.base import get_keys_to_not_convert

    config = tiny_llama_config()

    def base() -> nn.Module:
        torch.manual_seed(0)
        return transformers.LlamaForCausalLM(config).to(BF16).train()

    real = base()
    weights = {n: m.weight.data.clone() for n, m in real.named_modules() if type(m) is nn.Linear}
    quant = transformers.BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=BF16
    )
    real = replace_with_bnb_linear(
        real, modules_to_not_convert=get_keys_to_not_convert(real), quantization_config=quant
    )
    replaced = []
    for name, module in real.named_modules():
        if isinstance(module, bnb.nn.Linear4bit):
            replaced.append(name)
            module.weight = bnb.nn.Params4bit(  # as transformers' quantizer builds it
                weights[name],
                requires_grad=False,
                quant_type="nf4",
                compress_statistics=module.weight.compress_statistics,
                module=module,
            )
            module.to("cpu")
    real.is_loaded_in_4bit = True
    dora = method == "dora"
    lora = peft.LoraConfig(
        r=4, target_modules=["q_proj", "v_proj"], use_dora=dora, lora_dropout=dropout
    )
    real = peft.get_peft_model(real, lora)

    train = TrainSpec.of(
        peft=method, lora_r=4, lora_targets="q_proj,v_proj", precision="bf16",
        quantize_base="nf4", lora_dropout=dropout,
    )  # fmt: skip
    sim = base()
    assert quantize_model(sim, train) == replaced
    sim = apply_peft(sim, train)

    ids = torch.randint(0, 256, (2, 16))

    def step(model: nn.Module) -> StepRecorder:
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], foreach=False)
        rec = StepRecorder()
        state = [*model.parameters(), *model.buffers()]
        for m in model.modules():  # bitsandbytes keeps its quant state outside the buffers
            if isinstance(m, bnb.nn.Linear4bit):
                state += [m.weight.quant_state.absmax, m.weight.quant_state.code]
        rec.register(state, "parameter")
        with rec:
            rec.set_phase("forward", 0)
            loss = model(input_ids=ids, labels=ids).loss
            rec.set_phase("backward", 0)
            loss.backward()
            rec.set_phase("optimizer", 0)
            opt.step()
            opt.zero_grad()
        rec.close()
        return rec

    got, want = step(real), step(sim)
    # the weight DoRA dequantises is cast to its input's fp32 (gemm_4bit's goes to F.linear)
    dora_reads = {u for n in want.nodes if n.op == "_to_copy.default" for u in n.inputs}
    hidden = {
        s.uid
        for s in want.storages
        if s.phase == "forward"
        and s.alloc_node >= 0
        and want.nodes[s.alloc_node].op == "new_empty.default"
        and s.uid not in dora_reads  # DoRA's dequantize_4bit: a visible op's output
    }
    assert len(hidden) == 2 * 7  # one dequantised weight per quantised Linear per forward

    def seq(rec: StepRecorder, skip: set[int]) -> list:
        return [
            (s.phase, s.nbytes, s.dtype)
            for s in rec.storages
            if s.alloc_node >= 0 and s.uid not in skip
        ]

    assert seq(want, hidden) == seq(got, set())
    assert _live_peak(want, hidden) == _live_peak(got, set())
    assert _live_peak(want, set()) >= _live_peak(got, set())  # the hidden ones count here
