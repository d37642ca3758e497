"""torchao's CPUOffloadOptimizer (`predictor.emulate.offload_optim`): pinned host copies of
the large parameters and their gradients, their optimizer stepping on the host; checked
against a real CPU step and by hand for a CUDA target."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from memgnn.dataset.profile import ProfileConfig, profile
from memgnn.predictor.capture.capture import CaptureConfig, capture
from memgnn.predictor.emulate.offload_optim import CPUOffloadOptimizer
from memgnn.predictor.ir.vocab import CATEGORIES, PHASES, PLACES
from memgnn.predictor.memory.places import place_peaks
from memgnn.predictor.spec.bundle import ModelBundle
from memgnn.predictor.spec.train import TrainSpec
from torch import nn

BIG, SMALL = 128 * 64, 64 + 64 * 10 + 10  # >= 4096 elements: offloaded; the rest stays


def _mlp() -> ModelBundle:
    return ModelBundle(
        name="mlp",
        family="mlp",
        build=lambda: nn.Sequential(nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 10)),
        make_inputs=lambda s, d, t: {
            "x": torch.randn(s["B"], 128, device=d, dtype=t),
            "y": torch.randint(0, 10, (s["B"],), device=d),
        },
        loss=lambda m, i: F.cross_entropy(m(i["x"]), i["y"]),
        dims={"B": 4},
    )


def _bytes(graph, category: str, place: str, *, alive_before: bool = True) -> int:
    p = graph.paths[0]
    resolved = graph.resolve_sizes({"B": 4})
    codes, at_place = graph.place_bytes(0, resolved)
    nbytes = graph.storage_bytes(0, resolved) if place == "device" else at_place
    code = CATEGORIES.index(category)
    return int(
        sum(
            b
            for u, b in enumerate(nbytes)
            if p.storages["category"][u] == code
            and PLACES[codes[u]] == place
            and (p.storages["alloc"][u] < 0) == alive_before
        )
    )


@pytest.mark.parametrize("gradients", [False, True])
def test_equals_a_real_cpu_step(gradients):
    train = TrainSpec.of(offload_optimizer="torchao", offload_gradients=gradients)
    real = profile(_mlp(), train, {"B": 4}, ProfileConfig(backend="cpu"))
    sim = profile(_mlp(), train, {"B": 4}, ProfileConfig(backend="sim", device="cpu"))
    assert sim.peak_allocated_bytes == real.peak_allocated_bytes
    assert sim.breakdown["tensor_phase_peaks"] == real.breakdown["tensor_phase_peaks"]
    for key in ("host_pinned_peak_bytes", "host_pageable_peak_bytes", "host_categories"):
        assert sim.breakdown[key] == real.breakdown[key]


def test_what_lives_where_on_cuda_by_hand():
    graph = capture(_mlp(), TrainSpec.of(offload_optimizer="torchao"), CaptureConfig())
    # pinned: the host copy of the 8192-element weight and its gradient (fp32)
    assert _bytes(graph, "parameter", "pinned") == 4 * BIG
    assert _bytes(graph, "gradient", "pinned") == 4 * BIG
    # its fused CPU AdamW: two fp32 states and a step counter, in pageable host memory
    assert _bytes(graph, "optimizer_state", "pageable", alive_before=False) == 2 * 4 * BIG + 4
    # the small parameters' AdamW(fused=True) steps on the device: step counters too
    assert _bytes(graph, "optimizer_state", "device", alive_before=False) == 2 * 4 * SMALL + 3 * 4
    peaks = place_peaks(graph, 0, graph.resolve_sizes({"B": 4}))
    assert peaks["host_pinned_peak_bytes"] == 2 * 4 * BIG
    assert peaks["host_peak_bytes"] == 2 * 4 * BIG + 2 * 4 * BIG + 4


def test_offload_gradients_frees_the_gpu_gradient_in_backward():
    def optimizer_phase_gradients(gradients: bool) -> int:
        train = TrainSpec.of(offload_optimizer="torchao", offload_gradients=gradients)
        graph = capture(_mlp(), train, CaptureConfig())
        p = graph.paths[0]
        nbytes = graph.storage_bytes(0, graph.resolve_sizes({"B": 4}))
        first = p.nodes["phase"].index(PHASES.index("optimizer"))
        code = CATEGORIES.index("gradient")
        return int(
            sum(
                b
                for u, b in enumerate(nbytes)
                if p.storages["category"][u] == code
                and 0 <= p.storages["alloc"][u] < first <= p.storages["free"][u]
            )
        )

    kept, freed = optimizer_phase_gradients(False), optimizer_phase_gradients(True)
    assert kept - freed == 4 * BIG


def test_zero_grad_sets_to_none_only():
    opt = CPUOffloadOptimizer([nn.Parameter(torch.zeros(10))], lambda ts, host: torch.optim.SGD(ts))
    with pytest.raises(ValueError, match="to None only"):
        opt.zero_grad(set_to_none=False)
    with pytest.raises(ValueError, match="empty parameter list"):
        CPUOffloadOptimizer([], lambda ts, host: torch.optim.SGD(ts))
