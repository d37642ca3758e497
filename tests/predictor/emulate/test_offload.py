"""Activation offloading (`predictor.emulate.offload`): torch's save_on_cpu and torchtune's
OffloadActivations, each checked against a real CPU step (the host is the same memory
there: what is offloaded and its bytes are what the check compares) and, for a CUDA
target, by what backward copies back."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from memgnn.dataset.profile import ProfileConfig, profile
from memgnn.predictor.capture.capture import CaptureConfig, capture
from memgnn.predictor.emulate.offload import OffloadActivations, save_on_cpu_hooks
from memgnn.predictor.ir.recorder import StepRecorder
from memgnn.predictor.ir.vocab import PHASES, PLACES
from memgnn.predictor.memory.analytic import sweep
from memgnn.predictor.spec.bundle import ModelBundle
from memgnn.predictor.spec.train import TrainSpec
from tiny_models import tiny_gpt_bundle
from torch import nn
from torch.autograd.graph import saved_tensors_hooks

D, B = 64, 8


class Chain(nn.Module):
    """Linear + tanh blocks and an output head (torchtune's name for it: `output`)."""

    def __init__(self, depth: int = 4):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(D, D) for _ in range(depth))
        self.output = nn.Linear(D, 10)

    def forward(self, x):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return self.output(x)


def _chain() -> ModelBundle:
    return ModelBundle(
        name="chain",
        family="mlp",
        build=Chain,
        make_inputs=lambda s, d, t: {
            "x": torch.randn(s["B"], D, device=d, dtype=t),
            "y": torch.randint(0, 10, (s["B"],), device=d),
        },
        loss=lambda m, i: F.cross_entropy(m(i["x"]), i["y"]),
        dims={"B": B},
    )


def _saved(forward, keep=lambda t: True) -> list[int]:
    """Bytes of every tensor autograd saves in `forward` (a real run, torch's own hooks)."""
    sizes: list[int] = []

    def pack(t):
        if keep(t):
            sizes.append(t.element_size() * t.nelement())
        return t

    with saved_tensors_hooks(pack, lambda t: t):
        forward()
    return sizes


def _pinned(graph, sizes, step: int = 0) -> list[int]:
    """Bytes of the pinned storages the forward of `step` made, in order."""
    p = graph.paths[0]
    resolved = graph.resolve_sizes(sizes)
    codes, nbytes = graph.place_bytes(0, resolved)
    forward = PHASES.index("forward")
    out = []
    for u, (code, alloc) in enumerate(zip(codes, p.storages["alloc"], strict=True)):
        if PLACES[code] == "pinned" and alloc >= 0:
            if p.nodes["phase"][alloc] == forward and p.nodes["step"][alloc] == step:
                out.append(int(nbytes[u]))
    return out


def _same_as_a_real_cpu_step(bundle, train, sizes) -> dict:
    real = profile(bundle, train, sizes, ProfileConfig(backend="cpu"))
    sim = profile(bundle, train, sizes, ProfileConfig(backend="sim", device="cpu"))
    assert sim.peak_allocated_bytes == real.peak_allocated_bytes
    assert sim.breakdown["tensor_phase_peaks"] == real.breakdown["tensor_phase_peaks"]
    for key in ("host_pinned_peak_bytes", "host_peak_bytes", "host_categories"):
        assert sim.breakdown[key] == real.breakdown[key]
    return sim.breakdown


@pytest.mark.parametrize("kind", ["save_on_cpu", "torchtune"])
def test_offloaded_activations_equal_a_real_cpu_step(kind):
    for bundle in (_chain(), tiny_gpt_bundle()):
        sizes = {"B": B} if bundle.name == "chain" else {"B": 3, "S": 17}
        for ckpt in ("none", "full") if bundle.name != "chain" else ("none",):
            train = TrainSpec.of(offload_activations=kind, checkpointing=ckpt)
            breakdown = _same_as_a_real_cpu_step(bundle, train, sizes)
            assert breakdown["host_pinned_peak_bytes"] > 0
            assert breakdown["host_categories"] == {"activation": breakdown["host_peak_bytes"]}


def test_save_on_cpu_copies_every_saved_tensor_parameters_included():
    model = Chain()
    x = torch.randn(B, D)
    saved = _saved(lambda: model(x))
    # each Linear saves its input and, where its input needs a gradient (all but the
    # first), its weight (a transposed view: not a Parameter)
    assert sorted(saved).count(4 * D * D) == len(model.layers) - 1
    graph = capture(_chain(), TrainSpec.of(offload_activations="save_on_cpu"), CaptureConfig())
    assert sorted(_pinned(graph, {"B": B})) == sorted(saved)


def test_torchtune_offloads_activations_of_1kb_and_more_but_not_the_head():
    model = Chain()
    x = torch.randn(B, D)
    hidden = torch.tanh(torch.randn(B, D, requires_grad=True))
    head = _saved(lambda: model.output(hidden))
    assert sorted(head) == [B * D * 4, 4 * 10 * D]  # its input and its weight's view
    eligible = _saved(
        lambda: model(x),
        keep=lambda t: t.element_size() * t.nelement() >= 1024 and not isinstance(t, nn.Parameter),
    )
    graph = capture(_chain(), TrainSpec.of(offload_activations="torchtune"), CaptureConfig())
    expected = sorted(eligible)
    for size in head:  # the head runs under torchtune's NoOpManager: kept on the device
        expected.remove(size)
    assert sorted(_pinned(graph, {"B": B})) == expected


def test_on_cuda_backward_copies_each_host_tensor_back():
    train = TrainSpec.of(offload_activations="save_on_cpu")
    cuda = capture(_chain(), train, CaptureConfig(target="cuda"))
    cpu = capture(_chain(), train, CaptureConfig(target="cpu"))
    p = cuda.paths[0]
    copies = [
        i
        for i, op in enumerate(p.nodes["op"])
        if op.startswith("copy_") and p.nodes["phase"][i] == PHASES.index("backward")
    ]
    # one host-to-device copy per saved tensor, per step; none on a CPU target (torch's
    # unpack returns the host tensor itself there)
    assert len(copies) == 2 * len(_pinned(cuda, {"B": B}))
    assert not any(
        op.startswith("copy_") and ph == PHASES.index("backward")
        for op, ph in zip(cpu.paths[0].nodes["op"], cpu.paths[0].nodes["phase"], strict=True)
    )
    plain = capture(_chain(), TrainSpec(), CaptureConfig(target="cuda"))
    sizes = {"B": 4096}  # activations dominate: the device peak drops
    assert sweep(cuda, sizes).peak_bytes < sweep(plain, sizes).peak_bytes


def test_hooks_place_their_copies_in_pinned_memory():
    x = torch.randn(16, 32, requires_grad=True)
    rec = StepRecorder()
    with rec:
        with save_on_cpu_hooks("cuda"):
            y = torch.tanh(x)
        y.sum().backward()
    places = [s.place for s in rec.storages]
    assert places.count("pinned") == 1  # tanh's output, copied once
    manager = OffloadActivations(min_offload_size=4096)
    with StepRecorder() as rec2:
        with manager:
            y = torch.tanh(x)  # 2048 bytes: under the threshold, kept as it is
    assert "pinned" not in [s.place for s in rec2.storages]
    with pytest.raises(ValueError, match="max_fwd_stash_size"):
        OffloadActivations(max_fwd_stash_size=0)
