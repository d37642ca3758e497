"""hf:PATH specs as Hub configs are written: a config's own dtype, attention support."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from memgnn.predictor import zoo
from memgnn.predictor.capture.step import TrainingStep
from memgnn.predictor.spec.train import TrainSpec
from tiny_models import write_tiny_gpt2_config

pytest.importorskip("transformers")

CPU = torch.device("cpu")


def _hub_style_config(tmp_path: Path, **extra) -> Path:
    """A tiny GPT-2 config.json written with a dtype, as every Hub config is."""
    path = write_tiny_gpt2_config(tmp_path / "cfg" / "config.json")
    data = json.loads(path.read_text()) | extra
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("key", ["torch_dtype", "dtype"])
@pytest.mark.parametrize(
    "precision, expected",
    [("fp32", torch.float32), ("amp-bf16", torch.float32), ("bf16", torch.bfloat16)],
)
def test_training_spec_decides_param_dtype_not_the_config(tmp_path, key, precision, expected):
    path = _hub_style_config(tmp_path, **{key: "float16"})
    bundle = zoo.resolve(f"hf:{path}")
    step = TrainingStep(bundle, TrainSpec.of(precision=precision), device=CPU, target="cpu")
    dtypes = {p.dtype for p in step.model.parameters()}
    assert dtypes == {expected}


def _write_config(tmp_path: Path, model_type: str, **kwargs) -> Path:
    import transformers

    folder = tmp_path / model_type
    transformers.AutoConfig.for_model(model_type, **kwargs).save_pretrained(str(folder))
    return folder / "config.json"


@pytest.mark.parametrize(
    "model_type, task, kwargs, attention",
    [
        ("bloom", "causal-lm", dict(n_layer=1, hidden_size=32, n_head=2, vocab_size=64), "eager"),
        (
            "deberta-v2",
            "masked-lm",
            dict(
                num_hidden_layers=1,
                hidden_size=32,
                num_attention_heads=2,
                intermediate_size=64,
                vocab_size=64,
                max_position_embeddings=64,
            ),
            "eager",
        ),
        ("gpt2", "causal-lm", dict(n_layer=1, n_embd=32, n_head=2, vocab_size=64), "sdpa"),
    ],
)
def test_attention_follows_what_the_model_class_supports(
    tmp_path, model_type, task, kwargs, attention
):
    from memgnn.predictor.zoo.hf import attention_for

    path = _write_config(tmp_path, model_type, **kwargs)
    bundle = zoo.resolve(f"hf:{path}", task=task)
    model = bundle.build()
    assert model.config._attn_implementation == attention
    config = type(model.config).from_json_file(str(path))
    assert attention_for(config, task) == attention
    loss = bundle.loss(model, bundle.make_inputs({"B": 2, "S": 8}, CPU, torch.float32))
    loss.backward()


def test_a_task_the_config_has_no_model_for_names_the_ones_it_has(tmp_path):
    path = _write_config(tmp_path, "deberta-v2", num_hidden_layers=1, hidden_size=32)
    with pytest.raises(ValueError, match=r"no AutoModelForCausalLM.*masked-lm"):
        zoo.resolve(f"hf:{path}", task="causal-lm")


def _write(tmp_path: Path, config) -> str:
    path = tmp_path / type(config).__name__ / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    config.to_json_file(str(path))
    return str(path)


def test_configs_with_alike_layers_get_a_depth_knob(tmp_path):
    from memgnn.predictor.zoo.hf import repeated_layers
    from transformers import GPT2Config, LlamaConfig

    llama = LlamaConfig(
        num_hidden_layers=6, hidden_size=32, intermediate_size=64, num_attention_heads=2,
        num_key_value_heads=1, vocab_size=128,
    )  # fmt: skip
    bundle = zoo.resolve(f"hf:{_write(tmp_path, llama)}")
    assert bundle.layers == 6
    small = bundle.with_layers(4)
    with torch.device("meta"):
        assert len(small.build().model.layers) == 4
    assert repeated_layers(GPT2Config(n_layer=5)) == 5  # n_layer through the attribute map
    llama.layer_types = ["full_attention", "sliding_attention"] * 3
    assert repeated_layers(llama) is None  # layers that differ: captured in full
    assert zoo.resolve(f"hf:{_write(tmp_path, llama)}").layers is None
    llama.layer_types = ["full_attention"] * 6
    assert repeated_layers(llama) == 6
    llama.mlp_only_layers = [0]
    assert repeated_layers(llama) is None


def test_hybrid_layouts_are_captured_in_full():
    """Attention among state-space layers, however a hybrid config says where: an index
    list (Bamba), a period (Jamba), a kind list cycled over the layers (RecurrentGemma's
    3-long `block_types`). Replicating the first block would count every layer as it."""
    from memgnn.predictor.zoo.hf import repeated_layers
    from transformers import BambaConfig, JambaConfig, RecurrentGemmaConfig

    small = dict(num_hidden_layers=4, hidden_size=64, num_attention_heads=4)
    assert repeated_layers(BambaConfig(**small, attn_layer_indices=[2])) is None
    assert repeated_layers(JambaConfig(**small, attn_layer_period=2, attn_layer_offset=1)) is None
    gemma = RecurrentGemmaConfig(**small, block_types=["recurrent", "recurrent", "attention"])
    assert repeated_layers(gemma) is None
    # a hybrid's default (every layer a mamba mixer) is alike, and replicated
    assert repeated_layers(BambaConfig(**small)) == 4


def _tiny_gemma3_vlm(tmp_path: Path) -> str:
    from transformers import Gemma3Config

    text = dict(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, vocab_size=96,
    )  # fmt: skip
    vision = dict(
        hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        image_size=28, patch_size=14,
    )  # fmt: skip
    config = Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4)
    config.architectures = ["Gemma3ForConditionalGeneration"]
    return _write(tmp_path, config)


def test_a_decoder_only_vision_language_config_trains_as_causal_lm_on_text(tmp_path):
    """Gemma 3 4B+ name Gemma3ForConditionalGeneration, which is no seq2seq model: the
    task is causal-lm (AutoModelForCausalLM builds that class), its vocabulary read from
    text_config, and a text batch runs a real CPU step (the vision tower gets no grad)."""
    bundle = zoo.resolve(f"hf:{_tiny_gemma3_vlm(tmp_path)}")
    assert bundle.hparams["task"] == "causal-lm"
    step = TrainingStep(bundle, TrainSpec.of(optimizer="sgd"), device=CPU, target="cpu")
    assert type(step.model).__name__ == "Gemma3ForConditionalGeneration"
    inputs = bundle.make_inputs({"B": 2, "S": 8}, CPU, torch.float32)
    assert int(inputs["input_ids"].max()) < 96
    loss = bundle.loss(step.model, inputs)
    loss.backward()
    vision = [p.grad for n, p in step.model.named_parameters() if "vision_tower" in n]
    assert vision and all(g is None for g in vision)


def test_infer_task_of_bare_vision_backbones_and_encoder_decoders():
    from memgnn.predictor.zoo.hf_tasks import infer_task
    from transformers import Dinov2Config, SiglipConfig, T5Config

    assert infer_task(Dinov2Config(architectures=["Dinov2Model"])) == "image-cls"
    assert infer_task(SiglipConfig(architectures=["SiglipModel"])) == "image-cls"
    t5 = T5Config(architectures=["T5ForConditionalGeneration"])
    assert infer_task(t5) == "seq2seq"


def test_image_size_of_a_composite_config_comes_from_its_vision_config(tmp_path):
    from transformers import SiglipConfig

    vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                  num_attention_heads=2, image_size=48, patch_size=16)  # fmt: skip
    text = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                num_attention_heads=2, vocab_size=50)  # fmt: skip
    config = SiglipConfig(text_config=text, vision_config=vision, architectures=["SiglipModel"])
    bundle = zoo.resolve(f"hf:{_write(tmp_path, config)}")
    assert bundle.hparams["task"] == "image-cls"
    images = bundle.make_inputs({"B": 2}, CPU, torch.float32)["pixel_values"]
    assert tuple(images.shape) == (2, 3, 48, 48)


def test_multi_head_latent_attention_captures_for_a_cuda_target(tmp_path):
    """A DeepSeek-V2 config (q/k head dim 24, v 16, complex rotary) captures in bf16 for
    sm90: attention runs the memory-efficient kernel, B and S stay symbols."""
    from memgnn.predictor.capture.capture import CaptureConfig, capture
    from transformers import DeepseekV2Config

    config = DeepseekV2Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2, kv_lora_rank=16,
        q_lora_rank=None, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
        n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2,
        first_k_dense_replace=1, architectures=["DeepseekV2ForCausalLM"],
    )  # fmt: skip
    bundle = zoo.resolve(f"hf:{_write(tmp_path, config)}")
    graph = capture(bundle, TrainSpec.of(precision="bf16"), CaptureConfig(target="cuda", sm=90))
    ops = set(graph.paths[0].nodes["op"])
    assert "_scaled_dot_product_efficient_attention.default" in ops
    assert "_scaled_dot_product_flash_attention.default" not in ops
    small = graph.storage_bytes(0, graph.resolve_sizes({"B": 2, "S": 16})).sum()
    large = graph.storage_bytes(0, graph.resolve_sizes({"B": 3, "S": 40})).sum()
    assert large > small


@pytest.mark.parametrize("key", ["torch_dtype", "dtype"])
def test_a_bundle_knows_the_dtype_its_checkpoint_is_stored_in(tmp_path, key):
    assert zoo.resolve(f"hf:{_hub_style_config(tmp_path, **{key: 'bfloat16'})}").stored_dtype == (
        "bfloat16"
    )


_SMALL = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, vocab_size=256)
_MOE = dict(intermediate_size=128, moe_intermediate_size=32, num_experts_per_tok=2)


@pytest.mark.slow  # a symbolic capture, a real CPU step and its simulation, ~5-15 s each
@pytest.mark.parametrize(
    "model_type, kwargs",
    [
        # dots.llm1: its shared experts are moe_intermediate_size x n_shared_experts wide
        # (the config class defaults n_shared_experts to None, which the model cannot build)
        ("dots1", dict(**_SMALL, **_MOE, num_hidden_layers=2, n_routed_experts=4,
                       n_shared_experts=1, first_k_dense_replace=1)),
        # LFM2-MoE: short convolutions and attention by layer_types (None: unbuildable)
        ("lfm2_moe", dict(**_SMALL, **_MOE, num_hidden_layers=2, num_experts=4,
                          num_dense_layers=1, layer_types=["conv", "full_attention"])),
        # Gemma 4: full-attention layers with a head_dim of their own (per-layer overrides)
        ("gemma4_text", dict(**_SMALL, intermediate_size=128, head_dim=16, num_hidden_layers=2,
                             global_head_dim=32, vocab_size_per_layer_input=256,
                             hidden_size_per_layer_input=16)),
        # Mamba2's chunked scan pads a symbolic input by a constant (the pad hook)
        ("mamba2", dict(hidden_size=64, num_hidden_layers=2, num_heads=4, head_dim=32,
                        n_groups=2, vocab_size=256)),
        # Zamba: one attention block shared by (tied across) its hybrid layers; its CPU
        # selective scan loops over the sequence in Python, which pins S (a guard)
        ("zamba", dict(**_SMALL, intermediate_size=128, num_hidden_layers=3,
                       layers_block_type=["linear_attention", "hybrid", "hybrid"])),
    ],
)  # fmt: skip
def test_recent_families_capture_symbolically_as_a_real_cpu_step_runs(tmp_path, model_type, kwargs):
    """Each family's symbolic capture holds at sizes it was not traced at (no guard pins B,
    nor S unless a Python loop runs over it) and, simulated there, peaks where a real CPU
    step of the same model does."""
    from memgnn.dataset.profile import ProfileConfig, profile
    from memgnn.predictor.capture.capture import CaptureConfig, capture

    bundle = zoo.resolve(f"hf:{_write_config(tmp_path, model_type, **kwargs)}", task="causal-lm")
    model = bundle.build()
    if model_type == "gemma4_text":  # sliding layer: head_dim 16, full-attention: 32
        assert [layer.self_attn.head_dim for layer in model.model.layers] == [16, 32]
    if model_type == "zamba":  # the shared block is one set of parameters
        shared = [layer.shared_transf for layer in model.model.layers[1:]]
        assert shared[0].self_attn.q_proj.weight is shared[1].self_attn.q_proj.weight
    train = TrainSpec.of(steps="first")
    graph = capture(bundle, train, CaptureConfig(target="cpu"))
    seq = 128 if model_type == "zamba" else 24
    assert ("(S == 128)" in graph.guards) == (model_type == "zamba")
    assert not graph.violated_guards(graph.resolve_sizes({"B": 2, "S": seq}))
    sizes = {"B": 3, "S": 128 if model_type == "zamba" else 37}
    real = profile(bundle, train, sizes, ProfileConfig(backend="cpu"))
    sim = profile(bundle, train, sizes, ProfileConfig(backend="sim", device="cpu"), graph=graph)
    assert sim.stats["label_graph"] == "symbolic"
    assert sim.peak_allocated_bytes == real.peak_allocated_bytes
