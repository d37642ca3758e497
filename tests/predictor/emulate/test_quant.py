"""--quantize-base: bitsandbytes storage, quant state and kernel temporaries, by hand."""

from __future__ import annotations

import pytest
import torch
from memgnn.predictor.capture.model_info import describe
from memgnn.predictor.capture.step import TrainingStep
from memgnn.predictor.emulate.quant import Linear4bitSim, Linear8bitSim, quantize_model
from memgnn.predictor.ir.recorder import StepRecorder
from memgnn.predictor.spec.train import TrainSpec
from tiny_models import (
    LLAMA_HIDDEN,
    LLAMA_KV,
    LLAMA_LAYERS,
    LLAMA_MLP,
    LLAMA_VOCAB,
)
from torch import nn

pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

CPU = torch.device("cpu")
HIDDEN, KV, LAYERS, VOCAB, MLP = LLAMA_HIDDEN, LLAMA_KV, LLAMA_LAYERS, LLAMA_VOCAB, LLAMA_MLP
# the Linear shapes (out, in) of one decoder layer
LAYER_LINEARS = {
    "q_proj": (HIDDEN, HIDDEN),
    "k_proj": (KV, HIDDEN),
    "v_proj": (KV, HIDDEN),
    "o_proj": (HIDDEN, HIDDEN),
    "gate_proj": (MLP, HIDDEN),
    "up_proj": (MLP, HIDDEN),
    "down_proj": (HIDDEN, MLP),
}


def _hand_bytes(n_out: int, n_in: int, kind: str) -> int:
    """One quantised weight by hand: 4-bit values packed two per byte, fp32 absmax per 64
    values, the 16-entry fp32 NF4 code; double quant: uint8 absmax + fp32 offset + fp32
    absmax per 256 blocks + a 256-entry fp32 code copy; int8: a byte a value + fp32 SCB."""
    n = n_out * n_in
    blocks = -(n // -64)
    if kind == "int8":
        return n + 4 * n_out
    if kind == "nf4":
        return n // 2 + 4 * blocks + 64
    return n // 2 + blocks + 4 + 4 * -(blocks // -256) + 1024 + 64


def _unique_bytes(tensors) -> int:
    seen, total = set(), 0
    for t in tensors:
        key = t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
    return total


@pytest.mark.parametrize("kind", ["nf4", "nf4-dq", "int8"])
def test_quantised_parameter_bytes_by_hand(tiny_llama, kind):
    train = TrainSpec.of(
        peft="lora", lora_r=4, lora_targets="q_proj,v_proj", precision="bf16", quantize_base=kind
    )
    step = TrainingStep(tiny_llama, train, device=CPU, target="cuda")
    quantised = LAYERS * sum(_hand_bytes(o, i, kind) for o, i in LAYER_LINEARS.values())
    shared = 1024 if kind == "nf4-dq" else 0  # bitsandbytes' module-level dynamic map
    bf16 = 2 * (2 * VOCAB * HIDDEN + (2 * LAYERS + 1) * HIDDEN)  # embed, lm_head, norms
    adapters = 4 * LAYERS * (4 * (HIDDEN + HIDDEN) + 4 * (HIDDEN + KV))  # fp32 lora_A/B
    rotary = 2 * (HIDDEN // 4 // 2) * 4
    state = step.state_tensors()["parameter"]
    assert _unique_bytes(state) == quantised + shared + bf16 + adapters + rotary
    # 7 Linears per layer quantised; lm_head (the output embedding) kept in bf16
    assert len(step.quantized) == 7 * LAYERS
    assert not any("lm_head" in name for name in step.quantized)
    base = step.model.get_base_model()
    assert base.lm_head.weight.dtype == torch.bfloat16
    want = Linear8bitSim if kind == "int8" else Linear4bitSim
    assert isinstance(base.model.layers[0].mlp.down_proj, want)
    # the model's identity counts logical parameters (two nf4 values a byte)
    info = describe(step.model, tiny_llama, train)
    linears = LAYERS * sum(o * i for o, i in LAYER_LINEARS.values())
    others = 2 * VOCAB * HIDDEN + (2 * LAYERS + 1) * HIDDEN
    assert info.parameters == linears + others + adapters // 4
    assert info.param_dtypes[kind.removesuffix("-dq")] == linears
    assert info.module_class == f"LlamaForCausalLM + LoRA r=4 on {kind}"
    assert info.compute_dtype == "bfloat16"


def test_peft_wraps_quantised_targets_and_trains_only_adapters(tiny_llama):
    from memgnn.predictor.emulate.quant_lora import QuantLoraLinear

    train = TrainSpec.of(peft="lora", lora_r=2, lora_targets="q_proj,v_proj", quantize_base="nf4")
    step = TrainingStep(tiny_llama, train, device=CPU, target="cuda")
    attn = step.model.get_base_model().model.layers[1].self_attn
    assert isinstance(attn.q_proj, QuantLoraLinear)
    assert isinstance(attn.q_proj.get_base_layer(), Linear4bitSim)
    assert isinstance(attn.k_proj, Linear4bitSim)  # not a target: quantised, no adapter
    names = [n for n, p in step.model.named_parameters() if p.requires_grad]
    assert names and all("lora_" in n for n in names)


def _run(layer: nn.Module, x: torch.Tensor) -> StepRecorder:
    rec = StepRecorder()
    with rec:
        rec.set_phase("forward", 0)
        out = layer(x)
        loss = out.float().sum()
        rec.set_phase("backward", 0)
        loss.backward()
    rec.close()
    return rec


def _new(rec: StepRecorder, phase: str) -> list[tuple[int, str]]:
    return [(s.nbytes, s.dtype) for s in rec.storages if s.alloc_node >= 0 and s.phase == phase]


M, K, N = 8, 128, 256


@pytest.mark.parametrize("nested", [False, True])
def test_nf4_dequantises_the_whole_weight_in_forward_and_backward(nested):
    layer = Linear4bitSim(
        nn.Linear(K, N, bias=False, dtype=torch.bfloat16), nested=nested, compute=torch.bfloat16
    )
    x = torch.randn(M, K, dtype=torch.bfloat16, requires_grad=True)
    rec = _run(layer, x)
    absmax = [(4 * (N * K // 64), "float32")] * 2 if nested else []  # dequantised, + offset
    weight = (N * K * 2, "bfloat16")
    # forward: [absmax], the weight in the compute dtype, the output; then the fp32 loss
    assert _new(rec, "forward") == [
        *absmax,
        weight,
        (M * N * 2, "bfloat16"),
        (M * N * 4, "float32"),
        (4, "float32"),
    ]
    back = _new(rec, "backward")
    assert weight in back and (M * K * 2, "bfloat16") in back  # W again, grad of x
    if nested:
        assert back.count((4 * (N * K // 64), "float32")) == 1
    dequant = [s for s in rec.storages if (s.nbytes, s.dtype) == weight]
    assert len(dequant) == 2 and all(s.free_node is not None for s in dequant)  # transient


def test_nf4_fp16_base_with_fp32_compute_dequantises_twice_as_bitsandbytes_does():
    """bitsandbytes 0.50.2 on CUDA: the forward's fallback dequantises straight into the
    compute dtype (`_dequant_linear_fallback`: `torch.empty(shapeB, dtype=A.dtype)`); the
    backward dequantises in the dtype the weight was loaded in (`quant_state.dtype`, fp16)
    and casts to the gradient's dtype (`.to(grad_output.dtype)`): both alive at the cast."""
    layer = Linear4bitSim(
        nn.Linear(K, N, bias=False, dtype=torch.float16), nested=False, compute=torch.float32
    )
    x = torch.randn(M, K, dtype=torch.float16, requires_grad=True)
    rec = _run(layer, x)
    fwd, back = _new(rec, "forward"), _new(rec, "backward")
    assert (N * K * 4, "float32") in fwd and (N * K * 2, "float16") not in fwd
    assert (N * K * 2, "float16") in back and (N * K * 4, "float32") in back
    half = next(s for s in rec.storages if (s.nbytes, s.dtype) == (N * K * 2, "float16"))
    cast = next(
        s for s in rec.storages
        if (s.nbytes, s.dtype) == (N * K * 4, "float32") and s.phase == "backward"
    )  # fmt: skip
    assert half.alloc_node < cast.alloc_node <= half.free_node  # the cast reads the fp16 copy


def _input_lifetime(keeps_input: bool) -> tuple[str, str]:
    """(phase, op) at which a 4-bit layer's input storage dies, the graph freed at the end."""
    layer = Linear4bitSim(
        nn.Linear(K, N, bias=False, dtype=torch.bfloat16),
        nested=False,
        compute=torch.bfloat16,
        keeps_input=keeps_input,
    )
    x = torch.randn(M, K, dtype=torch.bfloat16, requires_grad=True)
    rec = StepRecorder()
    with rec:
        rec.set_phase("forward", 0)
        h = x * 2  # the layer's input, made in the step; mul by a constant saves nothing
        out = layer(h)
        del h
        loss = out.float().sum()
        rec.set_phase("backward", 0)
        loss.backward()
        rec.set_phase("zero_grad", 0)
        del loss, out  # the graph goes with its root
        torch.empty(1)
    rec.close()
    (inp,) = [s for s in rec.storages if s.alloc_node == 0]
    assert (inp.nbytes, inp.dtype) == (M * K * 2, "bfloat16")
    node = rec.nodes[inp.free_node + 1] if inp.free_node + 1 < len(rec.nodes) else None
    return rec.nodes[inp.free_node].phase, node.phase if node else "-"


def test_nf4_before_0_43_2_keeps_each_input_until_its_graph_is_freed():
    # bitsandbytes >= 0.43.2: the input dies with its last use, inside the forward
    assert _input_lifetime(keeps_input=False)[0] == "forward"
    # < 0.43.2: MatMul4Bit's ctx.tensors = (A, B) outlives backward until the graph goes
    assert _input_lifetime(keeps_input=True) == ("backward", "zero_grad")


def test_bnb_version_picks_the_4bit_input_behaviour():
    def keeps(version: str, kind: str = "nf4") -> bool:
        return TrainSpec.of(peft="lora", quantize_base=kind, bnb_version=version).quant.keeps_input

    assert keeps("0.42.0") and keeps("0.43.1") and keeps("0.39") and keeps("0.42.0", "nf4-dq")
    assert not keeps("0.43.2") and not keeps("0.50.2") and not keeps("1.0.0")
    assert not TrainSpec.of(
        peft="lora", quantize_base="int8", bnb_version="0.45.0"
    ).quant.keeps_input


def _peak(bundle, **kw) -> int:
    from memgnn.predictor.capture.capture import CaptureConfig, capture
    from memgnn.predictor.memory.analytic import sweep

    sizes = {"B": 2, "S": 16}
    train = TrainSpec.of(
        peft="lora", lora_r=4, lora_targets="q_proj,v_proj", precision="bf16", **kw
    )
    graph = capture(bundle, train, CaptureConfig(target="cuda", sizes=sizes))
    return sweep(graph, sizes).peak_bytes


def test_old_bnb_inputs_outlive_backward_and_held_outputs_keep_them(tiny_llama):
    """Each decoder layer's quantised-matmul inputs: o_proj's and gate/up's (T x h) and
    down_proj's (T x I), bf16; q/v's shared input is saved by their adapters anyway."""
    held_by_layer = 2 * 2 * 16 * (2 * HIDDEN + MLP)  # B x S x (2h + I) x 2 bytes
    new = _peak(tiny_llama, quantize_base="nf4")
    new_held = _peak(tiny_llama, quantize_base="nf4", hold_outputs=True)
    old = _peak(tiny_llama, quantize_base="nf4", bnb_version="0.42.0")
    old_held = _peak(tiny_llama, quantize_base="nf4", bnb_version="0.42.0", hold_outputs=True)
    logits = 2 * 16 * VOCAB * 2  # the loop's held outputs: bf16 logits, B x S x V
    assert new_held == new + logits  # today's kernels: the outputs alone
    assert new < old <= new + LAYERS * held_by_layer
    bound = old + logits + LAYERS * (held_by_layer + 2 * 16 * HIDDEN * 2) + 512
    assert old + logits < old_held <= bound  # the last step's inputs too


def test_int8_forward_and_backward_temporaries_by_hand():
    layer = Linear8bitSim(nn.Linear(K, N, bias=False, dtype=torch.bfloat16))
    x = torch.randn(M, K, dtype=torch.bfloat16, requires_grad=True)
    rec = _run(layer, x)
    assert _new(rec, "forward") == [
        (M * K * 2, "float16"),  # A in fp16
        (M * 4, "float32"),  # row stats
        (M * K, "int8"),  # quantised rows
        (M * K * 2, "float16"),  # |A|
        (M * K, "bool"),  # |A| >= 6
        (1, "bool"),  # any outlier
        (M * N * 4, "int32"),  # the int8 product
        (M * N * 2, "float16"),  # dequantised
        (M * N * 2, "bfloat16"),  # cast to A's dtype
        (M * N * 4, "float32"),  # the test's fp32 loss input
        (4, "float32"),
    ]
    back = _new(rec, "backward")
    assert (N * K * 2, "bfloat16") in back and (N * 4, "float32") in back  # CB, its scale
    assert (M * K * 2, "bfloat16") in back


def test_a_model_without_linears_cannot_be_quantised():
    model = nn.Sequential(nn.Embedding(4, 4))
    with pytest.raises(ValueError, match="--quantize-base nf4: .* no Linear"):
        quantize_model(model, TrainSpec.of(peft="lora", quantize_base="nf4"))


class _SubLinear(nn.Linear):  # as Falcon's FalconLinear: a subclass of nn.Linear
    pass


def test_subclasses_of_linear_are_quantised_as_transformers_does():
    model = nn.Sequential(nn.Linear(8, 8), _SubLinear(8, 8), nn.Linear(8, 8))
    names = quantize_model(model, TrainSpec.of(peft="lora", quantize_base="nf4"))
    assert names == ["0", "1"]  # the last Linear is the output head transformers keeps
    assert isinstance(model[1], Linear4bitSim)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"quantize_base": "nf4"}, "--quantize-base nf4 needs --peft lora"),
        ({"quantize_base": "fp4", "peft": "lora"}, "unknown --quantize-base"),
        ({"optimizer": "adamw8bit", "optimizer_impl": "fused"}, "--optimizer-impl must be auto"),
        ({"bnb_version": "0.42.0"}, "--bnb-version 0.42.0 applies to --quantize-base"),
        ({"quantize_base": "nf4", "peft": "lora", "bnb_version": "v0.42"}, "look like 0.42.0"),
        ({"quantize_base": "nf4", "peft": "lora", "bnb_version": "0.38.1"}, "came in 0.39.0"),
        ({"quantize_base": "int8", "peft": "lora", "bnb_version": "0.44.1"}, "int8 is not"),
        ({"hold_outputs": "yes"}, "--hold-outputs must be true or false"),
    ],
)
def test_bad_quantisation_options_are_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TrainSpec.of(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"peft": "lora", "quantize_base": "int8"}, "--quantize-base int8 .* GPU --device"),
        ({"optimizer": "adamw8bit"}, "--optimizer adamw8bit .* GPU --device"),
    ],
)
def test_bitsandbytes_options_on_a_cpu_target_name_the_option(tiny_llama, kwargs, message):
    with pytest.raises(ValueError, match=message):
        TrainingStep(tiny_llama, TrainSpec.of(**kwargs), device=CPU, target="cpu")


@pytest.mark.parametrize("kind", ["nf4-dq", "int8"])
def test_a_symbolic_capture_agrees_with_a_concrete_one(tiny_llama, kind):
    from memgnn.predictor.capture.capture import CaptureConfig, capture
    from memgnn.predictor.memory.analytic import sweep

    train = TrainSpec.of(peft="lora", lora_r=4, lora_targets="q_proj", quantize_base=kind)
    sizes = {"B": 3, "S": 24}
    sym = capture(tiny_llama, train, CaptureConfig(target="cuda", sizes={"B": 2, "S": 16}))
    conc = capture(tiny_llama, train, CaptureConfig(target="cuda", symbolic=False, sizes=sizes))
    assert sweep(sym, sizes).peak_bytes == sweep(conc, sizes).peak_bytes
    assert sweep(sym, sizes, round_to=512).peak_bytes == sweep(conc, sizes, round_to=512).peak_bytes


def test_amp_over_nf4_keeps_fp32_adapters_on_fake_tensors(tiny_llama):
    """peft casts adapters to a 4-bit base's compute dtype (bf16 here), then back to fp32
    (`autocast_adapter_dtype`); on fake tensors that cast must not fail."""
    from memgnn.predictor.capture.model_info import fake_step

    train = TrainSpec.of(
        peft="lora", lora_targets="q_proj", precision="amp-bf16", quantize_base="nf4"
    )
    step = fake_step(tiny_llama, train, "cuda")
    assert {p.dtype for p in step.params} == {torch.float32}
    q = step.model.get_base_model().model.layers[0].self_attn.q_proj.get_base_layer()
    assert (q.orig_dtype, q.compute_dtype) == (torch.float32, torch.bfloat16)
