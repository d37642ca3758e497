"""--peft METHOD through peft's own modules: sim == a real CPU step, trainable weights by hand,
prompt learning, fake-tensor-safe branches, blocks capture where exact."""

from __future__ import annotations

import pytest
import torch
from memgnn.dataset.profile import ProfileConfig, profile
from memgnn.predictor.capture.capture import CaptureConfig, capture
from memgnn.predictor.capture.model_info import describe
from memgnn.predictor.capture.step import TrainingStep
from memgnn.predictor.spec.train import TrainSpec
from tiny_models import LLAMA_HIDDEN, LLAMA_KV, LLAMA_LAYERS, LLAMA_MLP, tiny_llama_config

peft = pytest.importorskip("peft")
pytest.importorskip("transformers")

CPU = torch.device("cpu")
H, KV, L, MLP = LLAMA_HIDDEN, LLAMA_KV, LLAMA_LAYERS, LLAMA_MLP

# the methods and the popular ones; the others (tests below and the commit message)
# were checked the same way
METHODS = [
    ("dora", []),
    ("ia3", []),
    ("prefix_tuning", ["num_virtual_tokens=4"]),
    ("prompt_tuning", ["num_virtual_tokens=4"]),
    ("p_tuning", ["num_virtual_tokens=4"]),
    ("loha", []),
    ("lokr", []),
    ("vera", []),
    ("oft", []),
    ("boft", []),
    ("adalora", ["total_step=10"]),
    ("ln_tuning", []),
    ("fourierft", []),
    ("hra", []),
    ("miss", []),
]


@pytest.mark.parametrize(("method", "args"), METHODS, ids=[m for m, _ in METHODS])
def test_each_method_sim_equals_a_real_peft_step_on_cpu(tiny_llama, method, args):
    train = TrainSpec.of(peft=method, peft_args=args, precision="bf16")
    sizes = {"B": 2, "S": 16}
    real = profile(tiny_llama, train, sizes, ProfileConfig(backend="cpu"))
    sim = profile(tiny_llama, train, sizes, ProfileConfig(backend="sim", device="cpu"))
    assert sim.peak_allocated_bytes == real.peak_allocated_bytes


@pytest.mark.parametrize(
    ("method", "args"),
    [("dora", ["lora_dropout=0.1"]), ("ia3", []), ("prefix_tuning", ["num_virtual_tokens=4"])],
)
def test_a_symbolic_capture_is_exact_at_other_sizes(tiny_llama, method, args):
    """What `memgnn predict` runs: one symbolic capture, simulated at sizes it was not
    traced at, against real CPU steps at those sizes."""
    train = TrainSpec.of(peft=method, peft_args=args, precision="bf16")
    graph = capture(tiny_llama, train, CaptureConfig(target="cpu"))
    for sizes in ({"B": 3, "S": 24}, {"B": 1, "S": 40}):
        real = profile(tiny_llama, train, sizes, ProfileConfig(backend="cpu"))
        sim = profile(tiny_llama, train, sizes, ProfileConfig(backend="sim", device="cpu"),
                      graph=graph)  # fmt: skip
        assert sim.graph_id == graph.graph_id  # the symbolic graph answered
        assert sim.peak_allocated_bytes == real.peak_allocated_bytes


def _trainable(tiny_llama, train: TrainSpec) -> tuple[TrainingStep, dict[str, tuple]]:
    step = TrainingStep(tiny_llama, train, device=CPU, target="cpu")
    return step, {n: (tuple(p.shape), p.dtype) for n, p in step.model.named_parameters()
                  if p.requires_grad}  # fmt: skip


def test_trainable_weights_and_optimizer_states_by_hand(tiny_llama):
    """DoRA = LoRA + a magnitude per output of each adapted layer; IA3 = one vector per
    target (input-sized on the feed-forward down_proj, output-sized on k/v); prefix tuning
    = tokens x layers x 2 (key, value) x the key/value width (grouped-query: KV, not H);
    all fp32 on a bf16 base (peft's default), AdamW keeping two states of each."""
    lora_qv = L * ((4 * H + H * 4) + (4 * H + KV * 4))
    cases = {
        "dora": (["r=4"], lora_qv + L * (H + KV)),
        "ia3": ([], L * (KV + KV + MLP)),
        "prefix_tuning": (["num_virtual_tokens=5"], 5 * L * 2 * KV),
    }
    for method, (args, count) in cases.items():
        train = TrainSpec.of(peft=method, peft_args=args, precision="bf16", steps="first")
        step, params = _trainable(tiny_llama, train)
        assert sum(torch.Size(s).numel() for s, _ in params.values()) == count, method
        assert {d for _, d in params.values()} == {torch.float32}
        step.run({"B": 2, "S": 8}, steps=(0,))
        states = [v for s in step.optimizer.state.values() for k, v in s.items() if k != "step"]
        assert sum(v.numel() * v.element_size() for v in states) == 2 * 4 * count, method
        assert describe(step.model, tiny_llama, train).trainable_parameters == count


def test_prompt_encoders_follow_the_adapter_dtype(tiny_llama):
    """peft builds a prompt encoder in torch's default dtype (fp32 in a user's script that
    loads a bf16 model) and never casts it; --lora-dtype model builds it in the model's."""
    fp32 = TrainSpec.of(peft="prompt_tuning", peft_args=["num_virtual_tokens=3"], precision="bf16")
    _, params = _trainable(tiny_llama, fp32)
    assert set(params.values()) == {((3, H), torch.float32)}
    _, params = _trainable(tiny_llama, fp32.with_options(lora_dtype="model"))
    assert set(params.values()) == {((3, H), torch.bfloat16)}


def test_the_answer_names_the_method_and_what_peft_resolved(tiny_llama):
    for options, label in [
        ({"peft": "lora", "lora_r": 2}, "LlamaForCausalLM + LoRA r=2"),
        ({"peft": "dora", "lora_r": 2}, "LlamaForCausalLM + DoRA r=2"),
        ({"peft": "vera"}, "LlamaForCausalLM + VeRA r=256"),  # VeraConfig's own default
        ({"peft": "prefix_tuning", "peft_args": ["num_virtual_tokens=7"]},
         "LlamaForCausalLM + prefix tuning tokens=7"),
        ({"peft": "ia3"}, "LlamaForCausalLM + IA3"),
    ]:  # fmt: skip
        train = TrainSpec.of(**options)
        step = TrainingStep(tiny_llama, train, device=CPU, target="cpu")
        assert describe(step.model, tiny_llama, train).module_class == label


def test_loha_module_dropout_is_one_path_with_every_module(tiny_llama):
    """LoHa runs an adapted module only if `torch.rand(1) > module_dropout`: on fake tensors
    a branch per module (and at 0, a path where the loss has no gradient). Taken: one path,
    the step where every module runs; at 0 that is the real step's exactly."""
    train = TrainSpec.of(peft="loha", peft_args=["module_dropout=0.5"])
    graph = capture(tiny_llama, train, CaptureConfig(target="cpu"))
    assert len(graph.paths) == 1


def test_a_causal_lm_gets_its_task_and_virtual_tokens_lengthen_the_labels(tiny_llama):
    from memgnn.predictor.emulate.peft import task_type

    train = TrainSpec.of(peft="prompt_tuning", peft_args=["num_virtual_tokens=3"])
    step = TrainingStep(tiny_llama, train, device=CPU, target="cpu")
    assert type(step.model).__name__ == "PeftModelForCausalLM"
    assert task_type(step.model.get_base_model()) == "CAUSAL_LM"
    step.run({"B": 2, "S": 8}, steps=(0,))  # shift_labels of 8 vs 3 + 8 logits would fail


def test_prefix_tuning_is_captured_in_full_and_blocks_elsewhere(tmp_path):
    """Prefix tuning's prompt encoder holds tokens x layers x 2 x width: a capture at 4
    blocks would size it for 4. IA3 replicates to the full capture's graph."""
    from memgnn.predictor import zoo

    config = tiny_llama_config()
    config.num_hidden_layers = 6
    config.to_json_file(str(tmp_path / "config.json"))
    bundle = zoo.resolve(f"hf:{tmp_path / 'config.json'}")
    cfg = CaptureConfig(target="cuda", sizes={"B": 2, "S": 16}, blocks_depth=4)
    prefix = capture(bundle, TrainSpec.of(peft="prefix_tuning", peft_args=["num_virtual_tokens=4"]),
                     cfg)  # fmt: skip
    assert prefix.meta["capture"]["mode"] == "full"
    assert "sized by the number of layers" in prefix.meta["capture"]["why"]
    layers = TrainSpec.of(peft="dora", peft_args=["layers_to_transform=[0, 1]"])
    assert "picks layers" in capture(bundle, layers, cfg).meta["capture"]["why"]
    ia3 = TrainSpec.of(peft="ia3", precision="bf16")
    fast = capture(bundle, ia3, cfg)
    assert fast.meta["capture"] == {"mode": "blocks", "captured_blocks": 4, "blocks": 6}
    assert fast.graph_id == capture(bundle, ia3, CaptureConfig(
        target="cuda", sizes={"B": 2, "S": 16}, mode="full")).graph_id  # fmt: skip


def test_methods_without_default_targets_ask_for_them(tiny_gpt):
    with pytest.raises(ValueError, match="--peft ia3 on .*--lora-targets"):
        TrainingStep(tiny_gpt, TrainSpec.of(peft="ia3"), device=CPU, target="cpu")


def test_ln_tuning_targets_norm_layers_by_name(tiny_llama):
    """--lora-targets names modules of any kind where the method adapts them (LN tuning:
    the norms), not only Linear ones."""
    train = TrainSpec.of(peft="ln_tuning", lora_targets="input_layernorm")
    _, params = _trainable(tiny_llama, train)
    assert params and all("input_layernorm" in n for n in params)
    assert sum(torch.Size(s).numel() for s, _ in params.values()) == L * H
