"""TrainingStep: transformers' own gradient checkpointing (`--checkpointing hf`), checked
storage for storage against memgnn's `full` wrapper and against a real CPU step."""

from __future__ import annotations

import pytest
import torch
from memgnn.dataset.profile import ProfileConfig, profile
from memgnn.predictor import zoo
from memgnn.predictor.capture.capture import CaptureConfig, capture
from memgnn.predictor.capture.model_info import fake_step
from memgnn.predictor.capture.step import TrainingStep
from memgnn.predictor.memory.analytic import sweep
from memgnn.predictor.spec.train import TrainSpec
from tiny_models import LLAMA_LAYERS, LLAMA_VOCAB, tiny_gpt_bundle

transformers = pytest.importorskip("transformers")

LAYERS = LLAMA_LAYERS
SIZES = {"B": 2, "S": 64}


@pytest.fixture(scope="module")
def llama_config(tiny_llama) -> str:
    """The tiny Llama's config.json: each test resolves its own bundle from it."""
    return tiny_llama.hparams["config"]


def _schedule(bundle, checkpointing: str) -> dict:
    graph = capture(bundle, TrainSpec.of(checkpointing=checkpointing), CaptureConfig(target="cpu"))
    p = graph.paths[0]
    storages = {k: list(v) for k, v in p.storages.items()}
    storages["nbytes"] = [graph.exprs[e] for e in storages["nbytes"]]
    return {"ops": list(p.nodes["op"]), "inputs": p.nodes["inputs"], "storages": storages}


def test_hf_checkpointing_is_full_storage_for_storage_without_a_cache(llama_config):
    # with use_cache off the two paths checkpoint the same layers the same way
    # (non-reentrant torch.utils.checkpoint around each decoder layer's forward)
    bundle = zoo.resolve(f"hf:{llama_config}", {"use_cache": "false"})
    assert _schedule(bundle, "hf") == _schedule(bundle, "full")


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_hf_checkpointing_sim_equals_a_real_cpu_step(llama_config, precision):
    bundle = zoo.resolve(f"hf:{llama_config}")
    train = TrainSpec.of(checkpointing="hf", precision=precision)
    real = profile(bundle, train, SIZES, ProfileConfig(backend="cpu"))
    sim = profile(bundle, train, SIZES, ProfileConfig(backend="sim", device="cpu"))
    assert sim.peak_allocated_bytes == real.peak_allocated_bytes
    assert sim.breakdown["tensor_phase_peaks"] == real.breakdown["tensor_phase_peaks"]


def test_checkpointing_turns_the_kv_cache_off_as_hf_does(llama_config):
    # a plain loop over an HF causal LM keeps a DynamicCache of every layer's keys and
    # values (config.use_cache); HF's checkpointing layers set use_cache=False, and so does
    # memgnn's `full` wrapper: the two checkpoint the same layers the same way
    bundle = zoo.resolve(f"hf:{llama_config}")
    assert _schedule(bundle, "hf") == _schedule(bundle, "full")
    peaks = {
        c: profile(
            bundle,
            TrainSpec.of(checkpointing=c, steps="first"),
            SIZES,
            ProfileConfig(backend="sim"),
        ).breakdown["tensor_phase_peaks"]["forward"]
        for c in ("hf", "full", "none")
    }
    assert peaks["hf"] == peaks["full"] < peaks["none"]


@pytest.mark.parametrize("checkpointing", ["full", "blocks:1", "hf"])
def test_recomputed_layers_attend_over_s_keys(llama_config, monkeypatch, checkpointing):
    # with the cache on, a recomputed layer appended its keys a second time and SDPA
    # silently attended over 2 x S keys (eager attention failed on the mask)
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    keys: list[int] = []
    sdpa = ALL_ATTENTION_FUNCTIONS["sdpa"]

    def spy(module, q, k, v, *args, **kwargs):
        keys.append(k.shape[-2])
        return sdpa(module, q, k, v, *args, **kwargs)

    monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS, "sdpa", spy)
    bundle = zoo.resolve(f"hf:{llama_config}")
    train = TrainSpec.of(checkpointing=checkpointing, attention="sdpa")
    step = TrainingStep(bundle, train, device=torch.device("cpu"), target="cpu")
    batch = bundle.make_inputs(SIZES, torch.device("cpu"), torch.float32)
    bundle.loss(step.model, batch).backward()
    recomputed = LAYERS if checkpointing != "blocks:1" else 1
    assert keys == [SIZES["S"]] * (LAYERS + recomputed)


def test_hf_checkpointing_wraps_every_decoder_layer(llama_config):
    step = fake_step(zoo.resolve(f"hf:{llama_config}"), TrainSpec.of(checkpointing="hf"))
    assert step.checkpointed == LAYERS
    layers = step.model.model.layers
    assert all(layer.gradient_checkpointing for layer in layers)
    assert (
        TrainSpec.of(checkpointing="hf").activations.checkpoint_blocks == -1
    )  # every block, as full


def test_hf_checkpointing_needs_a_transformers_model():
    with pytest.raises(ValueError, match="--checkpointing hf: TinyGPT"):
        TrainingStep(
            tiny_gpt_bundle(),
            TrainSpec.of(checkpointing="hf"),
            device=torch.device("cpu"),
            target="cpu",
        )
    with pytest.raises(ValueError, match="none, full, hf, selective-op, blocks:N or every:N"):
        TrainSpec.of(checkpointing="hf:2")


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_t5_decoder_recomputes_without_its_own_cache(attention):
    # T5's decoder stack keeps its own deep copy of the config (use_cache=True) and fills
    # use_cache from it: turning the top config's off left the decoder caching, and its
    # recomputed layers then failed (eager: 2 x T keys; sdpa: a CheckpointError)
    bundle = zoo.resolve("t5", {"layers": "2"})
    train = TrainSpec.of(checkpointing="full", attention=attention)
    step = TrainingStep(bundle, train, device=torch.device("cpu"), target="cpu")
    assert not any(
        getattr(getattr(m, "config", None), "use_cache", False) for m in step.model.modules()
    )
    sizes = {"B": 2, "S": 16, "T": 8}
    batch = bundle.make_inputs(sizes, torch.device("cpu"), torch.float32)
    bundle.loss(step.model, batch).backward()
    assert all(p.grad is not None for p in step.params)


def test_held_outputs_keep_the_last_logits_through_backward(llama_config):
    # `outputs = model(**batch); outputs.loss.backward()` in a loop: the logits live until
    # the next forward returns, so every peak after the first forward holds them too
    bundle = zoo.resolve(f"hf:{llama_config}")
    peaks = {}
    for hold in (False, True):
        graph = capture(bundle, TrainSpec.of(hold_outputs=hold), CaptureConfig(target="cpu"))
        peaks[hold] = sweep(graph, SIZES).peak_bytes
    logits = SIZES["B"] * SIZES["S"] * LLAMA_VOCAB * 4  # fp32, B x S x V
    assert peaks[True] - peaks[False] == logits
