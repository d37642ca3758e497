"""--peft lora through peft: frozen base, adapter weights/grads/states, dropout; sim == cpu."""

from __future__ import annotations

import pytest
import torch
from memgnn.dataset.profile import ProfileConfig, profile
from memgnn.predictor.capture.model_info import describe
from memgnn.predictor.capture.step import TrainingStep
from memgnn.predictor.spec.train import TrainSpec
from tiny_models import (
    LLAMA_HIDDEN,
    LLAMA_KV,
    LLAMA_LAYERS,
    LLAMA_MLP,
    LLAMA_VOCAB,
)

pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

CPU = torch.device("cpu")
HIDDEN, KV, LAYERS, VOCAB, MLP = LLAMA_HIDDEN, LLAMA_KV, LLAMA_LAYERS, LLAMA_VOCAB, LLAMA_MLP


def _adapter_params(r: int, targets: list[str]) -> int:
    """By hand: lora_A (r x in) + lora_B (out x r) per target per layer."""
    shape = {"q_proj": (HIDDEN, HIDDEN), "k_proj": (HIDDEN, KV), "v_proj": (HIDDEN, KV)}
    shape["o_proj"] = (HIDDEN, HIDDEN)
    return LAYERS * sum(r * shape[t][0] + shape[t][1] * r for t in targets)


BASE_PARAMS = (
    2 * VOCAB * HIDDEN
    + LAYERS * (2 * HIDDEN * HIDDEN + 2 * HIDDEN * KV + 3 * HIDDEN * MLP + 2 * HIDDEN)
    + HIDDEN
)


@pytest.mark.parametrize(
    "train",
    [
        TrainSpec.of(peft="lora", lora_r=4, lora_targets="q_proj,v_proj"),
        TrainSpec.of(
            peft="lora",
            lora_r=4,
            lora_dropout=0.1,
            lora_targets="q_proj,k_proj,v_proj,o_proj",
            precision="bf16",
        ),
        TrainSpec.of(
            peft="lora",
            lora_r=4,
            lora_dropout=0.1,
            lora_targets="q_proj,k_proj,v_proj,o_proj",
            precision="bf16",
            lora_dtype="model",
        ),
    ],
)
def test_lora_sim_equals_a_real_peft_step_on_cpu(tiny_llama, train):
    sizes = {"B": 2, "S": 16}
    real = profile(tiny_llama, train, sizes, ProfileConfig(backend="cpu"))
    sim = profile(tiny_llama, train, sizes, ProfileConfig(backend="sim", device="cpu"))
    assert sim.peak_allocated_bytes == real.peak_allocated_bytes
    targets = train.adapter.targets.split(",")
    adapters = _adapter_params(train.adapter.r, targets)
    base_bytes = BASE_PARAMS * train.numerics.param_dtype.itemsize
    rotary = 2 * (HIDDEN // 4 // 2) * 4  # inv_freq and original_inv_freq buffers, fp32
    # peft keeps adapters in fp32 on a bf16 base (autocast_adapter_dtype); lora_dtype=model
    # keeps them in the base's dtype
    adapter_size = 4 if train.adapter.dtype == "fp32" else train.numerics.param_dtype.itemsize
    assert sim.breakdown["categories"]["parameter"] == base_bytes + adapter_size * adapters + rotary


def test_lora_in_the_model_dtype_saves_no_fp32_copy_of_each_adapted_input(tiny_llama):
    """bf16 base, dropout 0: peft's default casts each adapted module's input to fp32 and
    lora_A saves that copy (4 bytes per element); in the model's dtype lora_A saves the
    input the base layer saves already, and the adapters take half the bytes."""
    sizes = {"B": 2, "S": 16}
    common = {"peft": "lora", "lora_r": 4, "lora_targets": "q_proj,v_proj", "precision": "bf16"}
    cfg = ProfileConfig(backend="cpu")
    fp32 = profile(tiny_llama, TrainSpec.of(**common, steps="first"), sizes, cfg)
    model = profile(
        tiny_llama, TrainSpec.of(**common, lora_dtype="model", steps="first"), sizes, cfg
    )
    adapters = _adapter_params(4, ["q_proj", "v_proj"])
    cats = fp32.breakdown["categories"], model.breakdown["categories"]
    assert cats[0]["parameter"] - cats[1]["parameter"] == 2 * adapters
    assert cats[1]["activation"] < cats[0]["activation"]
    assert model.peak_allocated_bytes < fp32.peak_allocated_bytes
    train = TrainSpec.of(**common, lora_dtype="model")
    step = TrainingStep(tiny_llama, train, device=CPU, target="cpu")
    dtypes = {p.dtype for n, p in step.model.named_parameters() if "lora_" in n}
    assert dtypes == {torch.bfloat16}


def test_lora_freezes_the_base_and_trains_only_adapters(tiny_llama):
    train = TrainSpec.of(peft="lora", lora_r=2, lora_targets="q_proj,v_proj", steps="first")
    step = TrainingStep(tiny_llama, train, device=CPU, target="cpu")
    names = [n for n, p in step.model.named_parameters() if p.requires_grad]
    assert names and all("lora_" in n for n in names)
    assert sum(p.numel() for p in step.params) == _adapter_params(2, ["q_proj", "v_proj"])
    step.run({"B": 2, "S": 8})
    state = step.state_tensors()
    frozen = [p for p in step.model.parameters() if not p.requires_grad]
    assert all(p.grad is None for p in frozen)
    assert set(step.optimizer.state) == set(step.params)
    exp_avg = sum(s["exp_avg"].numel() for s in step.optimizer.state.values())
    assert exp_avg == _adapter_params(2, ["q_proj", "v_proj"])
    info = describe(step.model, tiny_llama, train)
    assert info.module_class == "LlamaForCausalLM + LoRA r=2"
    assert info.trainable_parameters == _adapter_params(2, ["q_proj", "v_proj"])
    assert len(state["gradient"]) in (0, len(step.params))


def test_a_lora_target_the_model_lacks_names_the_option(tiny_llama):
    train = TrainSpec.of(peft="lora", lora_targets="q_proj,c_attn")
    with pytest.raises(ValueError, match=r"--lora-targets: .* no module named c_attn.*q_proj"):
        TrainingStep(tiny_llama, train, device=CPU, target="cpu")


def test_subclasses_of_linear_are_lora_targets():
    """Falcon's FalconLinear (an nn.Linear subclass, query_key_value) is a target peft takes:
    the name check must accept it, not only modules whose class is called Linear."""
    from memgnn.predictor.emulate.lora import module_names
    from memgnn.predictor.emulate.peft import apply_peft

    class FusedLinear(torch.nn.Linear):
        pass

    model = torch.nn.Sequential()
    model.add_module("query_key_value", FusedLinear(8, 24))
    model.add_module("dense", torch.nn.Linear(8, 8))
    assert module_names(model) == ["dense", "query_key_value"]
    wrapped = apply_peft(model, TrainSpec.of(peft="lora", lora_r=2, lora_targets="query_key_value"))
    trainable = {n for n, p in wrapped.named_parameters() if p.requires_grad}
    assert trainable and all("query_key_value.lora_" in n for n in trainable)


def test_a_model_peft_has_no_default_targets_for_asks_for_lora_targets(tiny_gpt):
    with pytest.raises(ValueError, match="--lora-targets"):
        TrainingStep(tiny_gpt, TrainSpec.of(peft="lora"), device=CPU, target="cpu")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"peft": "qlora"}, "unknown --peft"),
        ({"lora_r": 0}, "--lora-r"),
        ({"lora_alpha": 0.0}, "--lora-alpha"),
        ({"lora_dropout": 1.0}, "--lora-dropout"),
        ({"peft": "lora", "lora_dtype": "bf16"}, "unknown --lora-dtype"),
        ({"lora_dtype": "model"}, "--lora-dtype model applies to --peft lora"),
    ],
)
def test_bad_lora_options_are_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TrainSpec.of(**kwargs)


def test_all_linear_adapts_what_peft_s_own_all_linear_adapts(tiny_llama):
    """--lora-targets all-linear (axolotl's lora_target_linear, TRL's
    lora_target_modules: all-linear): every Linear but the lm_head, as peft's shorthand."""
    import peft

    build = tiny_llama.build
    config = peft.LoraConfig(r=2, target_modules="all-linear")
    theirs = peft.get_peft_model(build(), config)
    ours = TrainingStep(
        tiny_llama, TrainSpec.of(peft="lora", lora_r=2, lora_targets="all-linear"), device=CPU,
        target="cpu",
    )  # fmt: skip
    names = lambda m: sorted(n for n, p in m.named_parameters() if p.requires_grad)  # noqa: E731
    assert names(ours.model) == names(theirs)
    per_layer = 2 * (HIDDEN + HIDDEN) * 2 + 2 * (HIDDEN + KV) * 2 + 3 * 2 * (HIDDEN + MLP)
    assert sum(p.numel() for p in ours.params) == LAYERS * per_layer
    assert not any("lm_head" in n for n in names(ours.model))


def test_all_linear_takes_the_quantised_base_layers():
    """peft's all-linear matches bitsandbytes' Linear4bit as an nn.Linear; memgnn's
    stand-ins are no nn.Linear: all_linear must still list them (lm_head excluded)."""
    from memgnn.predictor.emulate.lora import all_linear
    from memgnn.predictor.emulate.quant import Linear4bitSim

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.q = Linear4bitSim(torch.nn.Linear(16, 16), nested=False, compute=torch.float32)
            self.up = torch.nn.Linear(16, 32)
            self.lm_head = torch.nn.Linear(32, 8)

        def get_output_embeddings(self):
            return self.lm_head

    assert all_linear(Model()) == ["q", "up"]
