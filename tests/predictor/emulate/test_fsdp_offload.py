"""FSDP CPU offload of parameters (--fsdp1-cpu-offload, --fsdp-cpu-offload): the host and
device split by hand, and FSDP1's device + host total against a real 2-rank gloo run."""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from gloo_ranks import spawn_ranks
from memgnn.dataset.cpu_backend import profiler_peak
from memgnn.predictor.capture.capture import CaptureConfig, capture
from memgnn.predictor.ir.vocab import CATEGORIES, PHASES, PLACES
from memgnn.predictor.memory.analytic import AnalyticModel, live_curve
from memgnn.predictor.memory.base import Query
from memgnn.predictor.spec.train import TrainSpec

SIZES = {"B": 3, "S": 40}
FSDP1 = {"gpus": 2, "sharding": "fsdp1", "fsdp1_cpu_offload": True}
FSDP2 = {"gpus": 2, "sharding": "fsdp", "fsdp_cpu_offload": True}


@functools.cache
def _llama():
    from memgnn.predictor.zoo.resolve import resolve

    return resolve("llama")


@functools.cache
def _captured(target: str = "cpu", **kwargs) -> Any:
    return capture(_llama(), TrainSpec.of(**kwargs), CaptureConfig(target=target))


def _shapes() -> dict[str, tuple[int, ...]]:
    return {n: tuple(p.shape) for n, p in _llama().build().named_parameters()}


def _units() -> list[int]:
    """FSDP1's units (numel): each decoder layer, and the root (embeddings, norm, lm_head)."""
    shapes = _shapes()
    layers = sorted({n.split(".")[2] for n in shapes if n.startswith("model.layers.")})
    per_layer = [
        sum(math.prod(s) for n, s in shapes.items() if n.startswith(f"model.layers.{i}."))
        for i in layers
    ]
    return [*per_layer, sum(math.prod(s) for s in shapes.values()) - sum(per_layer)]


def _buffer_bytes() -> int:
    return sum(b.numel() * b.element_size() for b in _llama().build().buffers())


def _answer(graph, device: str = "cpu") -> Any:
    return AnalyticModel().predict(graph, [Query(sizes=SIZES, device=device)])[0]


def _storages(graph, place: str, category: str | None = None) -> list[tuple[int, int, str, str]]:
    """[(bytes, alloc node, alloc phase, alloc op)] of the storages at `place` (of
    `category`)."""
    p = graph.paths[0]
    resolved = graph.resolve_sizes(SIZES)
    codes, host = graph.place_bytes(0, resolved)
    nbytes = np.where(codes == 0, graph.storage_bytes(0, resolved), host)
    out = []
    for u in range(p.num_storages):
        if codes[u] != PLACES.index(place):
            continue
        if category is not None and p.storages["category"][u] != CATEGORIES.index(category):
            continue
        alloc = int(p.storages["alloc"][u])
        phase, op = (
            (PHASES[p.nodes["phase"][alloc]], p.nodes["op"][alloc]) if alloc >= 0 else ("", "")
        )
        out.append((int(nbytes[u]), alloc, phase, op))
    return out


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_fsdp1_offload_host_holds_shards_gradients_and_optimizer_state(target):
    """By hand, 2 ranks, fp32, AdamW: the host holds each unit's padded shard
    (ceil(n / 2) x 4 B) twice pinned (parameter, `_cpu_grad`) and twice pageable (exp_avg,
    exp_avg_sq) plus one 4 B step counter per flat parameter; the device holds no
    parameter shard before the step (buffers only), and every parameter storage the step
    allocates on it is an unsharded flat parameter (ceil(n / 2) x 2 x 4 B), or on a CUDA
    target the H2D copy of a shard (ceil(n / 2) x 4 B), freed within the step."""
    shards = [-(-n // 2) * 4 for n in _units()]
    graph = _captured(target, **FSDP1)
    note = _answer(graph, "cpu" if target == "cpu" else "rtx4090-24gb").breakdown
    assert note["host_pinned_peak_bytes"] == 2 * sum(shards)
    assert note["host_categories"]["parameter"] == sum(shards)
    assert note["host_categories"]["gradient"] == sum(shards)
    assert note["host_categories"]["optimizer_state"] == 2 * sum(shards) + 4 * len(shards)
    assert note["parallel"]["fsdp1_cpu_offload"] is True
    initial = [b for b, alloc, *_ in _storages(graph, "device", "parameter") if alloc < 0]
    assert sum(initial) == _buffer_bytes()
    made = {b for b, alloc, *_ in _storages(graph, "device", "parameter") if alloc >= 0}
    assert made == {s * 2 for s in shards}  # the unsharded flat parameters (resize_)
    device = _storages(graph, "device")
    # each reduce-scatter's output: the device gradient shard, freed when backward ends
    # (FSDP1's final callback hands `_cpu_grad` to the optimizer)
    rs = [b for b, _, phase, op in device if b in shards and op == "empty_like.default"]
    assert sorted(rs) == sorted(shards * 2)
    # a CUDA run copies each shard to the GPU whenever FSDP1 unshards it with the shard in
    # place: forward and backward, the root too (after forward it points at its host shard
    # while its gathered copy stays: the copy is made and dropped); a CPU device copies none
    clones = [b for b, _, phase, op in device if b in shards and op == "clone.default"]
    assert sorted(clones) == (sorted(shards * 4) if target == "cuda" else [])


def test_fsdp1_offload_moves_shards_off_the_device():
    """The device peak with offload drops by at least the parameter shards (a CPU target:
    no copies), the optimizer state leaves the device whole."""
    shards = sum(-(-n // 2) * 4 for n in _units())
    plain = _answer(_captured(gpus=2, sharding="fsdp1"))
    offload = _answer(_captured(**FSDP1))
    assert offload.breakdown["categories"]["optimizer_state"] == 0
    assert plain.predicted_peak_bytes - offload.predicted_peak_bytes >= shards


def test_fsdp2_offload_host_holds_shards_and_gradient_copies():
    """FSDP2 CPUOffloadPolicy, 2 ranks, fp32, on a CUDA target: each parameter's padded
    dim-0 shard pinned on the host, each gradient shard a pinned host copy of its own; the
    device holds no shard before the step."""
    shards = [-(-s[0] // 2) * math.prod(s[1:]) * 4 for s in _shapes().values()]
    graph = _captured("cuda", **FSDP2)
    note = _answer(graph, "rtx4090-24gb").breakdown
    assert note["host_pinned_peak_bytes"] == 2 * sum(shards)
    assert note["host_categories"]["parameter"] == sum(shards)
    assert note["host_categories"]["gradient"] == sum(shards)
    assert note["parallel"]["fsdp_cpu_offload"] is True
    pinned_grads = [b for b, *_ in _storages(graph, "pinned", "gradient")]
    assert sorted(pinned_grads) == sorted(shards * 2)  # a copy per parameter per step
    initial = [b for b, alloc, *_ in _storages(graph, "device", "parameter") if alloc < 0]
    assert sum(initial) == _buffer_bytes()


def test_offload_refusals_name_the_options():
    with pytest.raises(ValueError, match="--fsdp-cpu-offload applies to --sharding fsdp"):
        TrainSpec.of(gpus=2, sharding="fsdp1", fsdp_cpu_offload=True)
    with pytest.raises(ValueError, match="--fsdp1-cpu-offload applies to --sharding fsdp1"):
        TrainSpec.of(gpus=2, sharding="fsdp", fsdp1_cpu_offload=True)
    with pytest.raises(ValueError, match="NO_SHARD is not modelled"):
        TrainSpec.of(**FSDP1, fsdp1_sharding_strategy="NO_SHARD")
    with pytest.raises(ValueError, match="amp-fp16.*not modelled"):
        TrainSpec.of(**FSDP1, precision="amp-fp16")
    with pytest.raises(ValueError, match="--grad-sync last is not modelled"):
        TrainSpec.of(**FSDP2, grad_accum=2, grad_sync="last")
    with pytest.raises(ValueError, match="not --optimizer adamw8bit"):
        TrainSpec.of(**FSDP1, optimizer="adamw8bit")


def _rank(rank: int, port: int, out: str) -> None:
    """One rank of a real FSDP1 CPUOffload(offload_params=True) job on CPU (fp32 llama,
    transformer_auto_wrap_policy on the decoder layers, torch AdamW on the CPU shards);
    peak live bytes from torch.profiler over two steps. Without an accelerator memory
    cannot be pinned and torch.cpu.Stream has no synchronize(): `unpinned`,
    `cpu_stream_sync`, as memgnn's capture runs it."""
    import torch.distributed as dist
    from memgnn.predictor.capture.step import build_optimizer
    from memgnn.predictor.emulate.fsdp_offload import cpu_stream_sync, unpinned
    from memgnn.predictor.spec.bundle import default_blocks
    from torch.distributed.fsdp import CPUOffload, FullyShardedDataParallel
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
    from torch.profiler import ProfilerActivity, profile, record_function

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)  # fmt: skip
    torch.set_num_threads(1)
    bundle = _llama()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        with unpinned(), cpu_stream_sync():
            model = bundle.build().train()
            classes = {type(b) for b in (bundle.blocks or default_blocks)(model)}
            policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls=classes)
            model = FullyShardedDataParallel(
                model, auto_wrap_policy=policy, cpu_offload=CPUOffload(offload_params=True),
                device_id=torch.device("cpu"),
            )  # fmt: skip
            opt = build_optimizer(list(model.parameters()), TrainSpec(), "cpu")
            with record_function("steps"):
                for _ in range(2):
                    inputs = bundle.make_inputs(SIZES, torch.device("cpu"), torch.float32)
                    loss = bundle.loss(model, inputs)
                    loss.backward()
                    del loss, inputs
                    opt.step()
                    opt.zero_grad(set_to_none=True)
    peak = profiler_peak(prof, region="steps")
    Path(out, f"rank{rank}.json").write_text(json.dumps(peak))
    dist.destroy_process_group()


def _total_peak(graph) -> int:
    """The peak of device and host storages together (on a CPU they are one RAM)."""
    resolved = graph.resolve_sizes(SIZES)
    codes, host = graph.place_bytes(0, resolved)
    total = graph.storage_bytes(0, resolved) + np.where(codes != 0, host, 0)
    initial, live = live_curve(graph, 0, total, graph.scratch_bytes(0, resolved))
    return max(initial, int(live.max()))


@pytest.mark.slow  # two spawned ranks, about a minute on 2 shared cores
def test_fsdp1_offload_total_matches_a_real_gloo_run(tmp_path):
    """memgnn's rank-0 device + host total under FSDP1 CPU offload (a CPU target: host and
    device are the same RAM) against a real 2-rank gloo run's profiler peak; gloo's late
    frees as in test_fsdp1's real run (lowest rank, up to three runs, 2 KB)."""
    ours = _total_peak(_captured("cpu", **FSDP1, fsdp1_wrap="blocks"))
    real: list[int] = []
    for _attempt in range(3):
        real += spawn_ranks(_rank, tmp_path)
        if abs(ours - min(real)) <= 2048:
            break
    assert abs(ours - min(real)) <= 2048, (ours, real)
