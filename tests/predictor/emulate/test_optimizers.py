"""Optimizers by name (`predictor.emulate.optimizers`): torch.optim classes, bitsandbytes',
torchao's low-bit AdamWs, lion-pytorch and torchtune's optimizer-in-backward, each checked
against a real CPU step (exact bytes) and, for a CUDA target, by hand."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from memgnn.dataset.profile import ProfileConfig, profile
from memgnn.predictor.capture.capture import CaptureConfig, capture
from memgnn.predictor.emulate.optimizers import host_state
from memgnn.predictor.ir.vocab import CATEGORIES, PLACES
from memgnn.predictor.memory.analytic import sweep
from memgnn.predictor.spec.bundle import ModelBundle
from memgnn.predictor.spec.train import TrainSpec
from tiny_models import tiny_gpt_bundle
from torch import nn

SIZES = {"B": 3, "S": 17}
WIDE = 512 * 256  # >= 1e5 elements: bitsandbytes pages its state


def _wide_mlp() -> ModelBundle:
    """One weight of 131072 elements (paged by bitsandbytes), one of 2048 (not 8-bit)."""
    return ModelBundle(
        name="wide-mlp",
        family="mlp",
        build=lambda: nn.Sequential(nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 8)),
        make_inputs=lambda s, d, t: {
            "x": torch.randn(s["B"], 512, device=d, dtype=t),
            "y": torch.randint(0, 8, (s["B"],), device=d),
        },
        loss=lambda m, i: F.cross_entropy(m(i["x"]), i["y"]),
        dims={"B": 4},
    )


def _same_as_a_real_cpu_step(bundle: ModelBundle, train: TrainSpec, sizes) -> dict:
    real = profile(bundle, train, sizes, ProfileConfig(backend="cpu"))
    sim = profile(bundle, train, sizes, ProfileConfig(backend="sim", device="cpu"))
    assert sim.peak_allocated_bytes == real.peak_allocated_bytes
    assert sim.breakdown["tensor_phase_peaks"] == real.breakdown["tensor_phase_peaks"]
    assert sim.breakdown["categories"] == real.breakdown["categories"]
    return sim.breakdown


def _state_bytes(graph, sizes, place: str = "device") -> int:
    p = graph.paths[0]
    resolved = graph.resolve_sizes(sizes)
    code = CATEGORIES.index("optimizer_state")
    codes, at_place = graph.place_bytes(0, resolved)
    nbytes = graph.storage_bytes(0, resolved) if place == "device" else at_place
    return int(
        sum(
            b
            for b, c, where in zip(nbytes, p.storages["category"], codes, strict=True)
            if c == code and PLACES[where] == place
        )
    )


@pytest.mark.parametrize(
    "name",
    ["RMSprop", "NAdam", "Adagrad", "Adamax", "Adadelta", "RAdam", "Rprop", "SGD", "Adafactor"],
)
def test_a_torch_optim_class_by_name_equals_a_real_cpu_step(name):
    train = TrainSpec.of(optimizer=f"torch.optim.{name}")
    _same_as_a_real_cpu_step(tiny_gpt_bundle(), train, SIZES)


def test_asgd_averages_without_a_temporary_while_mu_is_one():
    # the for-loop reads mu.item(): 1 for ASGD's first t0 = 10^6 steps (a copy, no temporary)
    train = TrainSpec.of(optimizer="torch.optim.ASGD")
    real = profile(tiny_gpt_bundle(), train, SIZES, ProfileConfig(backend="cpu"))
    sim = profile(tiny_gpt_bundle(), train, SIZES, ProfileConfig(backend="sim", device="cpu"))
    steady = ("optimizer", "zero_grad", "backward")
    for phase in steady:  # the recorder counts Python scalars (`torch.as_tensor`) apart
        got = sim.breakdown["tensor_phase_peaks"][phase]
        assert abs(got - real.breakdown["tensor_phase_peaks"][phase]) <= 8
    foreach = TrainSpec.of(optimizer="torch.optim.ASGD", optimizer_impl="foreach")
    _same_as_a_real_cpu_step(tiny_gpt_bundle(), foreach, SIZES)


def test_state_is_read_from_the_optimizer_not_a_table():
    bundle = tiny_gpt_bundle()
    params = sum(p.numel() for p in bundle.build().parameters())
    n_params = len(list(bundle.build().parameters()))
    per_param = {  # what each class keeps, by hand (fp32): tensors of the parameter's size
        "RMSprop": 1, "Adamax": 2, "NAdam": 2, "SGD": 0, "Adagrad": 1,
    }  # fmt: skip
    for name, copies in per_param.items():
        train = TrainSpec.of(optimizer=f"torch.optim.{name}")
        graph = capture(bundle, train, CaptureConfig(target="cpu"))
        scalars = {"RMSprop": 1, "Adamax": 1, "NAdam": 2, "SGD": 0, "Adagrad": 1}[name]
        assert _state_bytes(graph, SIZES) == 4 * copies * params + 4 * scalars * n_params, name


def test_a_cuda_run_keeps_step_counters_where_the_class_puts_them():
    bundle = tiny_gpt_bundle()
    params = sum(p.numel() for p in bundle.build().parameters())
    n = len(list(bundle.build().parameters()))
    cuda = CaptureConfig(target="cuda")
    # foreach NAdam: step and mu_product on the host; fused AdamW: step on the device;
    # foreach ASGD: step, eta and mu on the device (probed on fake CUDA tensors)
    nadam = capture(bundle, TrainSpec.of(optimizer="torch.optim.NAdam"), cuda)
    assert _state_bytes(nadam, SIZES) == 2 * 4 * params
    fused_adamw = TrainSpec.of(optimizer="torch.optim.AdamW", optimizer_impl="fused")
    fused = capture(bundle, fused_adamw, cuda)
    assert _state_bytes(fused, SIZES) == 2 * 4 * params + 4 * n
    asgd = capture(bundle, TrainSpec.of(optimizer="torch.optim.ASGD"), cuda)
    assert _state_bytes(asgd, SIZES) == 4 * params + 3 * 4 * n
    opt = torch.optim.Adam([nn.Parameter(torch.zeros(3))], foreach=True)
    opt.param_groups[0]["params"][0].grad = torch.zeros(3)
    opt.step()
    assert [t.shape for t in host_state([opt], "cuda")] == [torch.Size([])]
    assert host_state([opt], "cpu") == []


@pytest.mark.parametrize("name", ["bnb.PagedAdamW8bit", "bnb.PagedAdamW", "bnb.Lion8bit"])
def test_bitsandbytes_runs_its_own_step_and_equals_a_real_cpu_step(name):
    pytest.importorskip("bitsandbytes")
    _same_as_a_real_cpu_step(_wide_mlp(), TrainSpec.of(optimizer=name), {"B": 4})


def test_paged_states_live_in_unified_memory_on_cuda():
    pytest.importorskip("bitsandbytes")
    train = TrainSpec.of(optimizer="bnb.PagedAdamW8bit")
    graph = capture(_wide_mlp(), train, CaptureConfig(target="cuda"))
    sizes = {"B": 4}
    # the 131072-element weight's two uint8 states are paged; its absmax (512 blocks of
    # 256, fp32, two) and the rest (small parameters: fp32 states) stay in the allocator
    assert _state_bytes(graph, sizes, "managed") == 2 * WIDE
    small = 256 + 2048 + 8  # bias 256, weight 2048, bias 8: under 4096 elements, fp32
    maps = 2 * 256 * 4  # the two maps, copied to the device at the first 8-bit parameter
    assert _state_bytes(graph, sizes) == 2 * 4 * (WIDE // 256) + 2 * 4 * small + maps
    swept = sweep(graph, sizes)
    from memgnn.predictor.memory.places import place_peaks

    assert place_peaks(graph, 0, swept.sizes)["managed_peak_bytes"] == 2 * WIDE


@pytest.mark.parametrize(
    ("name", "code_bytes", "block", "qmap_entries"),
    [
        ("torchao.AdamW8bit", 1.0, 256, 256),
        ("torchao.AdamW4bit", 0.5, 128, 16),
        ("torchao.AdamWFp8", 1.0, 256, 0),
    ],
)
def test_torchao_low_bit_states_by_hand(name, code_bytes, block, qmap_entries):
    pytest.importorskip("torchao")
    from torchao.optim import subclass_4bit, subclass_8bit

    graph = capture(_wide_mlp(), TrainSpec.of(optimizer=name), CaptureConfig(target="cuda"))
    qmap = 4 * qmap_entries  # each state keeps its own fp32 map (fp8 codes need none)
    per_state = int(WIDE * code_bytes) + 4 * (WIDE // block) + qmap
    small = 256 + 2048 + 8  # under 4096 elements: zeros_like(p), fp32
    # the step counter is a host tensor on CUDA (`torch.tensor(0.0)`, no device)
    assert _state_bytes(graph, {"B": 4}) == 2 * per_state + 2 * 4 * small
    _same_as_a_real_cpu_step(_wide_mlp(), TrainSpec.of(optimizer=name), {"B": 4})
    # stepped in backward (torchtune's optimizer_in_bwd): the states are made inside the
    # backward hooks, from torchao's quantisation maps computed on the host beforehand
    # (on fake tensors inside backward their `.tolist()` was an error)
    in_bwd = TrainSpec.of(optimizer=name, optimizer_in_bwd=True)
    for module in (subclass_8bit, subclass_4bit):  # as a fresh process has them
        module.get_qmap_signed.cache_clear()
        module.get_qmap_unsigned.cache_clear()
    capture(_wide_mlp(), in_bwd, CaptureConfig(target="cuda"))
    _same_as_a_real_cpu_step(_wide_mlp(), in_bwd, {"B": 4})


def test_lion_pytorch_keeps_one_state_like_the_parameter():
    pytest.importorskip("lion_pytorch")
    bundle = tiny_gpt_bundle()
    params = sum(p.numel() for p in bundle.build().parameters())
    train = TrainSpec.of(optimizer="lion_pytorch.Lion", precision="bf16")
    graph = capture(bundle, train, CaptureConfig(target="cuda"))
    assert _state_bytes(graph, SIZES) == 2 * params  # bf16, like the parameters
    _same_as_a_real_cpu_step(bundle, TrainSpec.of(optimizer="lion_pytorch.Lion"), SIZES)


def test_optimizer_in_backward_frees_each_gradient_after_its_step():
    bundle = _wide_mlp()
    sizes = {"B": 4}
    train = TrainSpec.of(optimizer_in_bwd=True)
    breakdown = _same_as_a_real_cpu_step(bundle, train, sizes)
    graph = capture(bundle, train, CaptureConfig(target="cuda"))
    plain = capture(bundle, TrainSpec(), CaptureConfig(target="cuda"))
    params = sum(p.numel() for p in bundle.build().parameters())
    # no gradient outlives its parameter's step: at the end of backward none is alive,
    # where the plain step holds every one of them into the optimizer step
    in_bwd, before = sweep(graph, sizes), sweep(plain, sizes)
    assert before.best.breakdown["gradient"] == 4 * params
    assert in_bwd.best.breakdown.get("gradient", 0) < 4 * WIDE
    assert in_bwd.peak_bytes < before.peak_bytes
    assert breakdown["categories"]["optimizer_state"] == 2 * 4 * params + 4 * 4
