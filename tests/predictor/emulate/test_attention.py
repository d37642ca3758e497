"""--attention eager|sdpa|flash: sim == a real CPU step, the eager probabilities by hand,
and errors that name the option."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from memgnn.dataset.profile import ProfileConfig, profile
from memgnn.predictor import zoo
from memgnn.predictor.capture.cache import capture_key
from memgnn.predictor.capture.capture import CaptureConfig, capture
from memgnn.predictor.capture.model_info import fake_step
from memgnn.predictor.capture.step import TrainingStep
from memgnn.predictor.ir.vocab import PHASES
from memgnn.predictor.spec.bundle import ModelBundle
from memgnn.predictor.spec.train import TrainSpec
from tiny_models import LLAMA_HEADS, LLAMA_LAYERS, tiny_gpt_bundle

transformers = pytest.importorskip("transformers")

LAYERS, HEADS = LLAMA_LAYERS, LLAMA_HEADS
SIZES = {"B": 2, "S": 64}


def saved_for_backward(bundle: ModelBundle, train: TrainSpec, target: str) -> Counter:
    """(bytes expression, dtype) of every storage made in the forward and alive when the
    backward starts, counted."""
    graph = capture(bundle, train, CaptureConfig(target=target))
    path = graph.paths[0]
    first_bwd = int(np.argmax(path.array("nodes", "phase") == PHASES.index("backward")))
    alloc, free = path.array("storages", "alloc"), path.array("storages", "free")
    alive = (alloc >= 0) & (alloc < first_bwd) & ((free == -1) | (free >= first_bwd))
    exprs, dtypes = path.storages["nbytes"], path.storages["dtype"]
    return Counter((graph.exprs[exprs[i]], dtypes[i]) for i in np.flatnonzero(alive))


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_sim_equals_a_real_cpu_step(tiny_llama, attention):
    train = TrainSpec.of(attention=attention, steps="first")
    real = profile(tiny_llama, train, SIZES, ProfileConfig(backend="cpu"))
    sim = profile(tiny_llama, train, SIZES, ProfileConfig(backend="sim", device="cpu"))
    assert sim.peak_allocated_bytes == real.peak_allocated_bytes
    assert sim.breakdown["tensor_phase_peaks"] == real.breakdown["tensor_phase_peaks"]


def test_no_cache_sim_equals_a_real_cpu_step(tiny_llama):
    # without a KV cache transformers checks position ids for packed sequences; on fake
    # tensors it assumed packing and built a 4-D mask the real step never builds
    # (sim over-predicted by B x S x vocab x 4 bytes here before unpacked_positions)
    bundle = zoo.resolve(f"hf:{tiny_llama.hparams['config']}", {"use_cache": "false"})
    train = TrainSpec.of(steps="first")
    real = profile(bundle, train, SIZES, ProfileConfig(backend="cpu"))
    sim = profile(bundle, train, SIZES, ProfileConfig(backend="sim", device="cpu"))
    assert sim.peak_allocated_bytes == real.peak_allocated_bytes


def test_eager_keeps_the_attention_probabilities_by_hand(tiny_llama):
    # eager_attention_forward: softmax(scores, dtype=fp32) is kept for its backward,
    # B x H x S x S x 4 bytes per layer; sdpa keeps none of that size
    probs = (f"{HEADS * 4}*B*(S)**2", "float32")
    eager = saved_for_backward(tiny_llama, TrainSpec.of(attention="eager", steps="first"), "cpu")
    sdpa = saved_for_backward(tiny_llama, TrainSpec.of(attention="sdpa", steps="first"), "cpu")
    assert eager[probs] == LAYERS
    assert not [k for k in sdpa if "S)**2" in k[0]]
    # in bf16 the fp32 softmax and its bf16 cast (what the P @ V matmul keeps) both live
    bf16 = saved_for_backward(
        tiny_llama, TrainSpec.of(attention="eager", precision="bf16", steps="first"), "cuda"
    )
    assert bf16[probs] == LAYERS and bf16[(f"{HEADS * 2}*B*(S)**2", "bfloat16")] == LAYERS
    eager_fwd = profile(
        tiny_llama,
        TrainSpec.of(attention="eager", steps="first"),
        SIZES,
        ProfileConfig(backend="sim", device="cpu"),
    ).breakdown["tensor_phase_peaks"]["forward"]
    sdpa_fwd = profile(
        tiny_llama,
        TrainSpec.of(attention="sdpa", steps="first"),
        SIZES,
        ProfileConfig(backend="sim", device="cpu"),
    ).breakdown["tensor_phase_peaks"]["forward"]
    b, s = SIZES["B"], SIZES["S"]
    # forward peak: L kept probability tensors + the last layer's scores still alive,
    # less sdpa's fp32 logsumexp (B x H x S) per layer
    per_layer = b * HEADS * s * s * 4
    assert eager_fwd - sdpa_fwd == LAYERS * per_layer + per_layer - LAYERS * b * HEADS * s * 4


def test_the_model_runs_the_chosen_implementation(tiny_llama):
    for choice, hf_name in [("eager", "eager"), ("sdpa", "sdpa"), ("flash", "flash_attention_2")]:
        step = fake_step(tiny_llama, TrainSpec.of(attention=choice, precision="bf16"), "cuda")
        assert step.model.config._attn_implementation == hf_name
        assert step.attention == hf_name
    auto = fake_step(tiny_llama, TrainSpec(), "cuda")
    assert auto.model.config._attn_implementation == "sdpa"  # LlamaForCausalLM's default


def test_flash_fails_on_a_cpu_target_naming_the_option(tiny_llama):
    train = TrainSpec.of(attention="flash", precision="bf16")
    with pytest.raises(ValueError, match="--attention flash.*CUDA"):
        capture(tiny_llama, train, CaptureConfig(target="cpu"))
    with pytest.raises(ValueError, match="--attention flash.*CUDA"):
        TrainingStep(tiny_llama, train, device=torch.device("cpu"), target="cpu")


def test_flash_needs_sm80_and_half_precision(tiny_llama):
    with pytest.raises(ValueError, match="--attention flash.*sm_75"):
        capture(tiny_llama, TrainSpec.of(attention="flash", precision="fp16"), CaptureConfig(sm=75))
    with pytest.raises(ValueError, match="--attention flash.*--precision"):
        capture(tiny_llama, TrainSpec.of(attention="flash"), CaptureConfig(target="cuda"))


def test_unsupported_kernels_name_the_option_and_the_class(tiny_llama, monkeypatch):
    cls = transformers.LlamaForCausalLM
    monkeypatch.setattr(cls, "_supports_flash_attn", False)
    with pytest.raises(ValueError, match="--attention flash: LlamaForCausalLM"):
        fake_step(tiny_llama, TrainSpec.of(attention="flash", precision="bf16"), "cuda")
    monkeypatch.setattr(cls, "_supports_sdpa", False)
    with pytest.raises(ValueError, match="--attention sdpa: LlamaForCausalLM"):
        fake_step(tiny_llama, TrainSpec.of(attention="sdpa"), "cuda")


def test_a_model_without_attn_implementation_refuses_a_choice():
    with pytest.raises(ValueError, match="--attention eager: TinyGPT is not a Hugging Face"):
        fake_step(tiny_gpt_bundle(), TrainSpec.of(attention="eager"), "cpu")
    fake_step(tiny_gpt_bundle(), TrainSpec.of(attention="auto"), "cpu")  # auto: left alone


def test_bad_attention_names_the_option():
    with pytest.raises(ValueError, match="--attention 'flash2'"):
        TrainSpec.of(attention="flash2")


def test_the_capture_cache_keys_on_attention(tiny_llama):
    keys = {
        capture_key(tiny_llama, TrainSpec.of(attention=a, precision="bf16"), "cuda", 80, {})
        for a in ("auto", "eager", "sdpa", "flash")
    }
    assert len(keys) == 4


def test_the_cli_and_the_service_take_attention():
    from memgnn.serving.schemas import TrainIn

    from memgnn.cli import build_parser
    from memgnn.cli.options import train_spec

    args = build_parser().parse_args(
        ["predict", "--model", "gpt2", "--attention", "flash", "--checkpointing", "hf"]
    )
    spec = train_spec(args)
    assert (spec.kernels.attention, spec.activations.checkpointing) == ("flash", "hf")
    assert TrainIn(attention="eager", checkpointing="hf").to_spec().kernels.attention == "eager"
    with pytest.raises(ValueError, match="attention"):
        TrainIn(attention="flash2")
