"""torchao's float8 training (`predictor.emulate.float8`): which Linears convert, what a
converted Linear keeps for backward (by hand), and the captured step against a real CPU
step of the same torchao code (torch 2.13 runs float8 casts and `_scaled_mm` on the CPU)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from memgnn.dataset.profile import ProfileConfig, profile
from memgnn.predictor.capture.capture import CaptureConfig, capture
from memgnn.predictor.emulate.float8 import apply_float8, check_float8, float8_filter, output_head
from memgnn.predictor.ir.vocab import PHASES
from memgnn.predictor.spec.bundle import ModelBundle
from memgnn.predictor.spec.train import TrainSpec
from torch import nn
from torch.autograd.graph import saved_tensors_hooks

pytest.importorskip("torchao")

B, D, H = 32, 64, 128
RECIPES = ["tensorwise", "rowwise", "rowwise_with_gw_hp"]


class Net(nn.Module):
    """Two Linears float8 takes, one it cannot (10 outputs) and the output head."""

    def __init__(self):
        super().__init__()
        self.up = nn.Linear(D, H)
        self.down = nn.Linear(H, D, bias=False)
        self.odd = nn.Linear(D, 10)
        self.output = nn.Linear(D, 16)

    def forward(self, x):
        h = torch.relu(self.down(torch.relu(self.up(x))))
        return self.output(h) + self.odd(h).sum(-1, keepdim=True)


def _net() -> ModelBundle:
    return ModelBundle(
        name="float8-net",
        family="mlp",
        build=Net,
        make_inputs=lambda s, d, t: {
            "x": torch.randn(s["B"], D, device=d, dtype=t),
            "y": torch.randint(0, 16, (s["B"],), device=d),
        },
        loss=lambda m, i: F.cross_entropy(m(i["x"]).float(), i["y"]),
        dims={"B": B},
    )


def _converted(model: nn.Module) -> list[str]:
    from torchao.float8.float8_linear import Float8Linear

    return sorted(n for n, m in model.named_modules() if isinstance(m, Float8Linear))


def test_torchtitans_filter_skips_the_head_and_dims_not_divisible_by_16():
    model = Net()
    assert output_head(model) is model.output
    apply_float8(model, TrainSpec.of(float8="rowwise"), device=torch.device("cpu"), target="cpu")
    assert _converted(model) == ["down", "up"]
    keep = float8_filter(Net(), ("up",))  # a plain word: substring of the name
    assert [keep(m, n) for n, m in Net().named_children()] == [False, True, False, True]


def test_nothing_converted_is_an_error_naming_the_filter():
    train = TrainSpec.of(float8="tensorwise", float8_filter_fqns="output,up,down")
    with pytest.raises(ValueError, match="float8-filter-fqns"):
        apply_float8(Net(), train, device=torch.device("cpu"), target="cpu")


@pytest.mark.parametrize("recipe", RECIPES)
def test_a_float8_linear_keeps_its_input_and_weight_in_bf16(recipe):
    """By hand: eager Float8Linear saves (input_hp, weight_hp_t), M*K*2 + N*K*2 bytes in
    bf16, as nn.Linear does; the float8 casts are temporaries, made again in backward."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(D, H, bias=False)).to(torch.bfloat16)
    convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(recipe))
    x = torch.randn(B, D, dtype=torch.bfloat16, requires_grad=True)
    saved: list[tuple[torch.dtype, int]] = []

    def pack(t):
        saved.append((t.dtype, t.nelement() * t.element_size()))
        return t

    with saved_tensors_hooks(pack, lambda t: t):
        model(x)
    assert sorted(saved) == sorted([(torch.bfloat16, B * D * 2), (torch.bfloat16, H * D * 2)])


def _forward_float8_bytes(graph, sizes) -> list[int]:
    p = graph.paths[0]
    nbytes = graph.storage_bytes(0, graph.resolve_sizes(sizes))
    forward = PHASES.index("forward")
    return sorted(
        int(nbytes[u])
        for u, (dtype, alloc) in enumerate(
            zip(p.storages["dtype"], p.storages["alloc"], strict=True)
        )
        if "float8" in str(dtype) and alloc >= 0 and p.nodes["phase"][alloc] == forward
    )


@pytest.mark.parametrize("recipe", RECIPES)
def test_capture_runs_torchaos_float8_casts(recipe):
    """Each converted Linear's forward casts its input (B x K) and weight (N x K) to float8,
    one byte an element (and the column-major weight copy `_scaled_mm` takes)."""
    graph = capture(_net(), TrainSpec.of(float8=recipe, precision="bf16"), CaptureConfig(sm=90))
    casts = _forward_float8_bytes(graph, {"B": B})
    for n in (B * D, D * H, B * H, H * D):  # up: input, weight; down: input, weight
        assert n in casts
    plain = capture(_net(), TrainSpec.of(precision="bf16"), CaptureConfig(sm=90))
    assert _forward_float8_bytes(plain, {"B": B}) == []


def _same_as_a_real_cpu_step(train: TrainSpec) -> int:
    real = profile(_net(), train, {"B": B}, ProfileConfig(backend="cpu"))
    sim = profile(_net(), train, {"B": B}, ProfileConfig(backend="sim", device="cpu"))
    assert sim.peak_allocated_bytes == real.peak_allocated_bytes
    assert sim.breakdown["tensor_phase_peaks"] == real.breakdown["tensor_phase_peaks"]
    assert sim.breakdown["categories"] == real.breakdown["categories"]
    return sim.peak_allocated_bytes


@pytest.mark.slow
@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_float8_step_equals_a_real_cpu_step(recipe, precision):
    plain = _same_as_a_real_cpu_step(TrainSpec.of(precision=precision))
    float8 = _same_as_a_real_cpu_step(TrainSpec.of(float8=recipe, precision=precision))
    assert float8 != plain  # the casts' temporaries are in the answer


def test_float8_bf16_step_equals_a_real_cpu_step():
    _same_as_a_real_cpu_step(TrainSpec.of(float8="rowwise", precision="bf16"))


def test_the_answer_names_the_recipe_and_the_layers():
    graph = capture(
        _net(), TrainSpec.of(float8="tensorwise", precision="bf16"), CaptureConfig(sm=90)
    )
    assert graph.meta["model_info"]["module_class"].endswith("+ float8 tensorwise (2/4 Linear)")


def test_amp_on_a_cuda_target_casts_the_input_as_cuda_autocast_does():
    """On CUDA Float8Linear casts its input to the autocast dtype itself: the captured
    forward holds bf16 copies of the fp32 activations the converted Linears read."""
    train = TrainSpec.of(float8="tensorwise", precision="amp-bf16")
    graph = capture(_net(), train, CaptureConfig(target="cuda", sm=90))
    assert _forward_float8_bytes(graph, {"B": B})
    with pytest.raises(ValueError, match="CUDA autocast only"):
        capture(_net(), train, CaptureConfig(target="cpu"))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"quantize_base": "nf4", "peft": "lora"}, "pick one"),
        ({"peft": "lora"}, "not modelled"),
        ({"precision": "fp16"}, "bf16 or fp32"),
        ({"sharding": "zero1", "gpus": 2}, "not modelled"),
        ({"float8_filter_fqns": "a b"}, "comma-separated"),
    ],
)
def test_combinations_float8_does_not_model_are_errors(options, message):
    with pytest.raises(ValueError, match=message):
        TrainSpec.of(float8="rowwise", **options)


def test_the_filter_without_float8_is_an_error():
    with pytest.raises(ValueError, match="applies to --float8"):
        TrainSpec.of(float8_filter_fqns="up")


def test_older_gpus_are_refused():
    train = TrainSpec.of(float8="rowwise", precision="bf16")
    with pytest.raises(ValueError, match="8.9"):
        check_float8(train, "cuda", 80)
    check_float8(train, "cuda", 90)


@pytest.mark.parametrize("sharding", ["ddp", "fsdp"])
def test_float8_under_sharding_casts_every_blocks_linears(sharding):
    """Converted before FSDP2 / DDP wrap the model (torchtitan's order): each rank's
    forward casts the unsharded weights of the blocks' Linears (TinyGPT: d=32)."""
    from tiny_models import tiny_gpt_bundle

    train = TrainSpec.of(float8="tensorwise", precision="bf16", sharding=sharding, gpus=2)
    graph = capture(tiny_gpt_bundle(), train, CaptureConfig(sm=90))
    casts = _forward_float8_bytes(graph, {"B": 3, "S": 16})
    for n_out, n_in in ((96, 32), (32, 32), (128, 32), (32, 128)):  # qkv, proj, fc1, fc2
        assert n_out * n_in in casts
    assert graph.meta["model_info"]["module_class"].endswith("(8/9 Linear)")


def test_for_a_cuda_target_a_float8_linear_sees_the_autocast_dtype():
    """Capture autocasts on the CPU; Float8Linear reads CUDA's autocast state only, so for
    a CUDA target each converted layer gets its input cast as `Float8Linear.forward` casts
    it on CUDA (to the autocast dtype), and not for a CPU target."""
    seen: list[torch.dtype] = []
    for target in ("cuda", "cpu"):
        model = nn.Sequential(nn.Linear(D, H))
        apply_float8(
            model,
            TrainSpec.of(float8="tensorwise", float8_filter_fqns=""),
            device=torch.device("cpu"),
            target=target,
        )
        model[0].register_forward_pre_hook(lambda m, args: seen.append(args[0].dtype))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            model(torch.randn(B, D))
    assert seen == [torch.bfloat16, torch.float32]
