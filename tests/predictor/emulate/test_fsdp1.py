"""--sharding fsdp1: FSDP1 FullyShardedDataParallel over the fake process group, by hand and
against PyTorch's MemTracker on the same run; FSDP-QLoRA against a real 2-rank gloo run."""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import torch
from gloo_ranks import spawn_ranks
from memgnn.dataset.cpu_backend import profiler_peak
from memgnn.predictor.capture.capture import CaptureConfig, capture
from memgnn.predictor.capture.step import TrainingStep
from memgnn.predictor.emulate.fsdp1 import fake_addresses, wrap_policy
from memgnn.predictor.emulate.parallel import fake_world
from memgnn.predictor.ir.vocab import CATEGORIES, PHASES
from memgnn.predictor.memory.analytic import AnalyticModel, live_curve
from memgnn.predictor.memory.base import Query
from memgnn.predictor.spec.train import TrainSpec
from torch._subclasses.fake_tensor import FakeTensorMode

SIZES = {"B": 3, "S": 40}
LORA = {"peft": "lora", "precision": "bf16", "lora_dtype": "model"}
QLORA = LORA | {"quantize_base": "nf4", "bnb_quant_storage": "bf16"}


@functools.cache
def _llama():
    from memgnn.predictor.zoo.resolve import resolve

    return resolve("llama")


@functools.cache
def _captured(target: str = "cpu", **kwargs) -> Any:
    return capture(_llama(), TrainSpec.of(**kwargs), CaptureConfig(target=target))


def _shapes() -> dict[str, tuple[int, ...]]:
    return {n: tuple(p.shape) for n, p in _llama().build().named_parameters()}


def _units() -> tuple[list[int], int]:
    """(numel of each decoder layer's parameters, the root's: embeddings, norm, lm_head)."""
    shapes = _shapes()
    layers = sorted({n.split(".")[2] for n in shapes if n.startswith("model.layers.")})
    per_layer = [
        sum(math.prod(s) for n, s in shapes.items() if n.startswith(f"model.layers.{i}."))
        for i in layers
    ]
    return per_layer, sum(math.prod(s) for s in shapes.values()) - sum(per_layer)


def _storages(graph, category: str, *, initial: bool | None = None, step: int | None = None):
    """[(bytes, alloc phase)] of the graph's storages of `category` (before the measured
    steps: `initial`; allocated in `step`)."""
    p = graph.paths[0]
    nbytes = graph.storage_bytes(0, graph.resolve_sizes(graph.symbols))
    code = CATEGORIES.index(category)
    out = []
    for u in range(p.num_storages):
        alloc = int(p.storages["alloc"][u])
        if p.storages["category"][u] != code or (initial is not None and (alloc < 0) != initial):
            continue
        if step is not None and (alloc < 0 or p.nodes["step"][alloc] != step):
            continue
        out.append((int(nbytes[u]), PHASES[p.nodes["phase"][alloc]] if alloc >= 0 else None))
    return out


def _buffer_bytes() -> int:
    return sum(b.numel() * b.element_size() for b in _llama().build().buffers())


@pytest.mark.parametrize("gpus", [2, 8])
def test_rank0_holds_one_padded_shard_of_each_flat_parameter(gpus):
    """One FlatParameter per decoder layer and one for the root, each padded to a multiple
    of N: rank 0 holds ceil(numel / N) elements of each (FSDP2 shards every tensor's dim 0
    instead: more padding)."""
    layers, root = _units()
    want = sum(-(-n // gpus) * 4 for n in [*layers, root]) + _buffer_bytes()
    graph = _captured(gpus=gpus, sharding="fsdp1")
    assert sum(b for b, _ in _storages(graph, "parameter", initial=True)) == want
    # forward and backward all-gather each unit whole: the unsharded flat parameters
    gathered = {b for b, _ in _storages(graph, "parameter", initial=False)}
    assert {-(-n // gpus) * gpus * 4 for n in [*layers, root]} <= gathered


def _fake_pg_peak(graph, sizes) -> int:
    """The schedule's peak without gloo's staging copies (the fake process group stages
    nothing): what a tracker sees on the fake run."""
    resolved = graph.resolve_sizes(sizes)
    ops = graph.paths[0].nodes["op"]
    scratch = graph.scratch_bytes(0, resolved).copy()
    scratch[[k for k, op in enumerate(ops) if op.startswith("c10d.")]] = 0
    initial, live = live_curve(graph, 0, graph.storage_bytes(0, resolved), scratch)
    return max(initial, int(live.max()))


def _mem_tracker_peak(train: TrainSpec, sizes) -> int:
    """PyTorch's MemTracker (torch.distributed._tools) over the same two steps."""
    from torch.distributed._tools.mem_tracker import MemTracker

    with fake_world(train) as world, FakeTensorMode(allow_non_fake_inputs=True):
        step = TrainingStep(
            _llama(), train, device=torch.device("cpu"), target="cpu", fake=True, world=world
        )
        tracker = MemTracker()
        tracker.track_external(step.model, step.optimizer)
        with tracker:
            step.run(sizes, steps=(0,))
            tracker.reset_mod_stats()  # the tracker takes one iteration at a time
            step.run(sizes, steps=(1,))
        peak = tracker.get_tracker_snapshot("peak")
    return max(dev["Total"] for dev in peak.values())


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"fsdp1_backward_prefetch": "NO_PREFETCH", "fsdp1_forward_prefetch": True},
        {"fsdp1_sharding_strategy": "SHARD_GRAD_OP"},
        {"fsdp_param_dtype": "bf16", "fsdp_reduce_dtype": "bf16"},
    ],  # use_orig_params=True: MemTracker cannot hook the parameters (views of the flat one)
)
def test_fsdp1_peak_matches_pytorchs_mem_tracker(options):
    kwargs = {"gpus": 2, "sharding": "fsdp1", **options}
    graph = _captured(**kwargs)
    theirs = _mem_tracker_peak(TrainSpec.of(**kwargs), SIZES)
    assert _fake_pg_peak(graph, SIZES) == theirs
    note = AnalyticModel().predict(graph, [Query(sizes=SIZES, device="cpu")])[0].breakdown
    assert note["parallel"]["sharding"] == "fsdp1"
    assert note["parallel"]["fsdp1_sharding_strategy"] == options.get(
        "fsdp1_sharding_strategy", "FULL_SHARD"
    )


def _live_gathered(graph, phase: str) -> int:
    """The most unsharded flat parameters alive at once in `phase` (all-gather outputs)."""
    p = graph.paths[0]
    code = CATEGORIES.index("parameter")
    new = [u for u in range(p.num_storages)
           if p.storages["alloc"][u] >= 0 and p.storages["category"][u] == code]  # fmt: skip
    live = most = 0
    for k in range(len(p.nodes["op"])):
        live += sum(int(p.storages["alloc"][u]) == k for u in new)
        if PHASES[p.nodes["phase"][k]] == phase:
            most = max(most, live)
        live -= sum(int(p.storages["free"][u]) == k for u in new)
    return most


def test_backward_prefetch_keeps_two_units_gathered():
    """BACKWARD_PRE all-gathers the next unit before the current one's gradient is
    computed: two unsharded flat parameters at once; NO_PREFETCH: one at a time, plus
    the root's, which FSDP1 keeps unsharded from forward through backward."""
    pre = _captured(gpus=2, sharding="fsdp1")
    none = _captured(gpus=2, sharding="fsdp1", fsdp1_backward_prefetch="NO_PREFETCH")
    assert _live_gathered(pre, "backward") == _live_gathered(none, "backward") + 1


def test_limit_all_gathers_leaves_the_allocations_unchanged():
    """The rate limiter makes the CPU thread wait on CUDA events (inside a record_function
    of its own); the program allocates the same storages in the same order."""
    on = _captured(gpus=2, sharding="fsdp1")
    off = _captured(gpus=2, sharding="fsdp1", fsdp1_limit_all_gathers=False)

    def allocations(graph) -> list[tuple[int, str, str]]:
        p = graph.paths[0]
        nbytes = graph.storage_bytes(0, graph.resolve_sizes(SIZES))
        return [(int(nbytes[u]), p.storages["dtype"][u], p.nodes["op"][p.storages["alloc"][u]])
                for u in range(p.num_storages) if p.storages["alloc"][u] >= 0]  # fmt: skip

    assert allocations(on) == allocations(off)
    assert _fake_pg_peak(on, SIZES) == _fake_pg_peak(off, SIZES)


def test_mixed_precision_gathers_in_param_dtype():
    """MixedPrecision(param_dtype=bf16) over fp32 parameters: the unsharded flat parameters
    are bf16 (half the bytes), the fp32 shards stay."""
    layers, root = _units()
    fp32 = _captured(gpus=2, sharding="fsdp1")
    bf16 = _captured(gpus=2, sharding="fsdp1", fsdp_param_dtype="bf16")
    whole = {-(-n // 2) * 2 for n in [*layers, root]}
    assert {b // 4 for b, _ in _storages(fp32, "parameter", initial=False)} >= whole
    assert {b // 2 for b, _ in _storages(bf16, "parameter", initial=False)} >= whole
    assert _storages(fp32, "parameter", initial=True) == _storages(bf16, "parameter", initial=True)


def test_lora_with_use_orig_params_takes_a_gradient_shard_of_the_frozen_weights():
    """LoRA adapters flattened with their frozen layer (use_orig_params=True, one unit per
    layer): each layer's gradient shard spans the whole flat parameter, frozen weights
    included. peft's wrap policy gives every adapter a unit of its own: only the adapters'
    elements. By hand, 2 ranks, bf16: per layer ceil((W + A) / 2) x 2 B against the
    adapters' ceil(a / 2) x 2 B each (peft's Llama targets q_proj, v_proj, r 8)."""
    layers, _ = _units()
    shapes = _shapes()
    q, v = (
        shapes["model.layers.0.self_attn.q_proj.weight"],
        shapes["model.layers.0.self_attn.v_proj.weight"],
    )
    adapters = [8 * q[1], q[0] * 8, 8 * v[1], v[0] * 8]  # lora_A, lora_B of q_proj, v_proj
    mixed = _captured(gpus=2, sharding="fsdp1", fsdp1_wrap="blocks", fsdp1_use_orig_params=True,
                      **LORA)  # fmt: skip
    alone = _captured(gpus=2, sharding="fsdp1", **LORA)  # wrap auto = peft under --peft lora
    grads = lambda g: sum(b for b, _ in _storages(g, "gradient", step=1))  # noqa: E731
    assert grads(mixed) == sum(-(-(n + sum(adapters)) // 2) * 2 for n in layers)
    assert grads(alone) == len(layers) * sum(-(-a // 2) * 2 for a in adapters)
    assert grads(mixed) > 20 * grads(alone)


def test_fsdp1_refusals_name_the_options():
    with pytest.raises(ValueError, match="uniform `requires_grad`.*--fsdp1-wrap peft"):
        _captured(gpus=2, sharding="fsdp1", fsdp1_wrap="blocks", **LORA)
    with pytest.raises(ValueError, match="--bnb-quant-storage bf16"):
        TrainSpec.of(gpus=2, sharding="fsdp1", **(QLORA | {"bnb_quant_storage": "uint8"}))
    with pytest.raises(ValueError, match="--fsdp1-use-orig-params applies to --sharding fsdp1"):
        TrainSpec.of(gpus=2, sharding="fsdp", fsdp1_use_orig_params=True)
    with pytest.raises(ValueError, match="--fsdp1-cpu-offload true with --fsdp1-sharding-s"):
        TrainSpec.of(gpus=4, sharding="fsdp1", fsdp1_cpu_offload=True,
                     fsdp1_sharding_strategy="HYBRID_SHARD")  # fmt: skip
    with pytest.raises(ValueError, match="--sharding fsdp1 \\(sharded within groups\\)"):
        TrainSpec.of(gpus=2, sharding="fsdp1", fsdp1_sharding_strategy="HYBRID_SHARD")
    assert TrainSpec.of(gpus=4, sharding="fsdp1", fsdp1_sharding_strategy="HYBRID_SHARD") \
        .parallel.shard_group_size == 2  # fmt: skip
    assert TrainSpec.of(gpus=4, sharding="fsdp1", fsdp1_sharding_strategy="NO_SHARD") \
        .parallel.shard_group_size == 1  # fmt: skip


def test_accumulation_without_sync_keeps_the_unsharded_flat_gradients():
    """FSDP1 no_sync() (--grad-sync last): each flat parameter keeps its whole padded
    gradient through the unsynced micro-step; synced, its shard. 2 ranks, fp32."""
    layers, root = _units()
    every = _captured(gpus=2, sharding="fsdp1", grad_accum=2)
    last = _captured(gpus=2, sharding="fsdp1", grad_accum=2, grad_sync="last")
    peak = lambda g: AnalyticModel().predict(g, [Query(sizes=SIZES, device="cpu")])[0]  # noqa: E731
    whole = sum(-(-n // 2) * 2 * 4 for n in [*layers, root])
    assert peak(last).breakdown["categories"]["gradient"] == whole
    assert peak(every).breakdown["categories"]["gradient"] == whole // 2
    count = lambda g: sum("reduce_scatter" in op for op in g.paths[0].nodes["op"])  # noqa: E731
    assert 2 * count(last) == count(every) > 0


def test_hybrid_shard_shards_within_the_group():
    """HYBRID_SHARD on 4 ranks in groups of 2: rank 0 holds what FULL_SHARD on 2 holds."""
    hybrid = _captured(gpus=4, sharding="fsdp1", fsdp1_sharding_strategy="HYBRID_SHARD")
    full2 = _captured(gpus=2, sharding="fsdp1")
    assert _storages(hybrid, "parameter", initial=True) == _storages(
        full2, "parameter", initial=True
    )
    assert any("allreduce" in op for op in hybrid.paths[0].nodes["op"])  # across the groups


def test_every_unit_is_resharded_within_its_step():
    """Frozen units (a QLoRA base) take no post-backward hook: FSDP1 reshards them in its
    catch-all after backward, which compares the flat parameter's address with its local
    shard's. On fake tensors (address 0) that check said 'already resharded' and one unit
    stayed gathered across steps; with fake_addresses every all-gathered flat parameter is
    freed in the forward or backward that gathered it (the root's: after its backward)."""
    graph = _captured("cuda", gpus=2, sharding="fsdp1", **QLORA)
    p = graph.paths[0]
    code = CATEGORIES.index("parameter")
    spans = set()
    for u in range(p.num_storages):
        alloc, free = int(p.storages["alloc"][u]), p.storages["free"][u]
        if alloc < 0 or p.storages["category"][u] != code:
            continue
        assert free is not None and int(free) >= 0, "an unsharded flat parameter outlives the run"
        spans.add((PHASES[p.nodes["phase"][alloc]], PHASES[p.nodes["phase"][int(free)]],
                   int(p.nodes["step"][int(free)]) - int(p.nodes["step"][alloc])))  # fmt: skip
    assert spans == {("forward", "forward", 0), ("backward", "backward", 0),
                     ("forward", "backward", 0)}  # fmt: skip


def test_fake_addresses_tell_storages_apart():
    with FakeTensorMode():
        a, b = torch.empty(8), torch.empty(8)
        with fake_addresses():
            assert a.data_ptr() != b.data_ptr() and a.data_ptr() > 0
            assert a[2:].data_ptr() == a.data_ptr() + 8
            a.untyped_storage().resize_(0)
            assert a.data_ptr() == 0 and a.untyped_storage().data_ptr() == 0
        assert b.data_ptr() == 0  # restored: fake tensors have no address


def test_wrap_policies():
    from torch.distributed.fsdp.wrap import _or_policy

    train = TrainSpec.of(**LORA)
    assert wrap_policy([torch.nn.Linear(1, 1)], train).func is _or_policy  # auto -> peft
    blocks = TrainSpec.of(**LORA, gpus=2, sharding="fsdp1", fsdp1_wrap="blocks")
    assert wrap_policy([torch.nn.Linear(1, 1)], blocks).func is not _or_policy


# ---- FSDP-QLoRA -----------------------------------------------------------------------


def _qlora_units() -> tuple[list[int], int, int]:
    """(per layer: numel of the bf16-stored 4-bit codes + norms, the root's numel, the
    quant state's bytes per rank: fp32 absmax per block of 64 and the 16-entry code)."""
    shapes = _shapes()
    layers, root = _units()
    linears = {n: s for n, s in shapes.items() if n.startswith("model.layers.") and len(s) == 2}
    codes = {n: (math.prod(s) + 1) // 4 for n, s in linears.items()}  # bnb: (n+1) // (2 x 2)
    per_layer = [
        n - sum(math.prod(s) - codes[k] for k, s in linears.items()
                if k.startswith(f"model.layers.{i}."))
        for i, n in enumerate(layers)
    ]  # fmt: skip
    state = sum(4 * -(-math.prod(s) // 64) + 16 * 4 for s in linears.values())
    return per_layer, root, state


def test_fsdp1_qlora_shards_the_codes_and_keeps_the_quant_state_whole():
    """FSDP-QLoRA by hand, 2 ranks: each layer's FlatParameter (bf16 codes + norms) and the
    root's sharded, each adapter its own unit (peft's policy), the quant state whole on
    every rank (bitsandbytes keeps it on the module, not as module state)."""
    per_layer, root, state = _qlora_units()
    shapes = _shapes()
    q, v = (
        shapes["model.layers.0.self_attn.q_proj.weight"],
        shapes["model.layers.0.self_attn.v_proj.weight"],
    )
    adapters = [8 * q[1], q[0] * 8, 8 * v[1], v[0] * 8]
    shards = sum(-(-n // 2) * 2 for n in [*per_layer, root])
    shards += len(per_layer) * sum(-(-a // 2) * 2 for a in adapters)
    graph = _captured("cuda", gpus=2, sharding="fsdp1", **QLORA)
    assert sum(b for b, _ in _storages(graph, "parameter", initial=True)) == (
        shards + state + _buffer_bytes()
    )
    # MixedPrecision(buffer_dtype) casts the module buffers in the first forward (new
    # storages kept from then on): the model's own, not the quant state
    fp16 = _captured("cuda", gpus=2, sharding="fsdp1", fsdp_buffer_dtype="fp16", **QLORA)
    p = fp16.paths[0]
    nbytes = fp16.storage_bytes(0, fp16.resolve_sizes(fp16.symbols))
    cast = [
        int(nbytes[u])
        for u in range(p.num_storages)
        if p.storages["alloc"][u] >= 0 and p.storages["dtype"][u] == "float16"
        and (p.storages["free"][u] is None or p.storages["free"][u] < 0)
    ]  # fmt: skip
    assert sorted(cast) == sorted(b.numel() * 2 for b in _llama().build().buffers())


def test_fsdp2_keeps_uint8_codes_whole_and_shards_float_ones():
    """accelerate's fully_shard path leaves uint8-stored 4-bit codes out of sharding;
    stored in bf16 they are sharded (per tensor, dim 0) with the rest."""
    per_layer, root, state = _qlora_units()
    whole = _captured("cuda", gpus=2, sharding="fsdp", **(QLORA | {"bnb_quant_storage": "uint8"}))
    split = _captured("cuda", gpus=2, sharding="fsdp", **QLORA)
    initial = lambda g: sum(b for b, _ in _storages(g, "parameter", initial=True))  # noqa: E731
    codes = 2 * sum(per_layer) - sum(  # the codes' bytes (the layers' numel less the norms)
        math.prod(s) * 2
        for n, s in _shapes().items()
        if n.startswith("model.layers.") and len(s) == 1
    )
    assert initial(whole) - initial(split) == pytest.approx(codes / 2, rel=0.01)


def _rank(rank: int, port: int, out: str) -> None:
    """One rank of a real FSDP-QLoRA job on CPU: transformers' replace_with_bnb_linear
    (real bnb Linear4bit, nf4, bf16 storage), peft LoRA (bf16 adapters), FSDP1 with peft's
    fsdp_auto_wrap_policy; peak live bytes from torch.profiler over two steps."""
    import bitsandbytes as bnb
    import peft
    import torch.distributed as dist
    import transformers
    from memgnn.predictor.capture.step import build_optimizer
    from peft.utils.other import fsdp_auto_wrap_policy
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.profiler import ProfilerActivity, profile, record_function
    from transformers.integrations.bitsandbytes import replace_with_bnb_linear
    from transformers.quantizers.base import get_keys_to_not_convert

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)  # fmt: skip
    torch.set_num_threads(1)
    bf16 = torch.bfloat16
    bundle = _llama()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        torch.set_default_dtype(bf16)
        model = bundle.build().train()
        torch.set_default_dtype(torch.float32)
        weights = {n: m.weight.data for n, m in model.named_modules() if type(m) is torch.nn.Linear}
        config = transformers.BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=bf16,
            bnb_4bit_quant_storage=bf16,
        )  # fmt: skip
        model = replace_with_bnb_linear(model, get_keys_to_not_convert(model), config)
        for name, m in model.named_modules():
            if isinstance(m, bnb.nn.Linear4bit):
                m.weight = bnb.nn.Params4bit(
                    weights.pop(name), requires_grad=False, quant_type="nf4",
                    compress_statistics=False, quant_storage=bf16, module=m,
                )  # fmt: skip
                m.to("cpu")
        del weights
        model.is_loaded_in_4bit = True
        model = peft.get_peft_model(model, peft.LoraConfig(r=8, lora_alpha=16),
                                    autocast_adapter_dtype=False)  # fmt: skip
        model = FullyShardedDataParallel(model, auto_wrap_policy=fsdp_auto_wrap_policy(model),
                                         device_id=torch.device("cpu"))  # fmt: skip
        opt = build_optimizer(
            [p for p in model.parameters() if p.requires_grad], TrainSpec(), "cpu"
        )
        with record_function("steps"):
            for _ in range(2):
                loss = bundle.loss(model, bundle.make_inputs(SIZES, torch.device("cpu"), bf16))
                loss.backward()
                del loss
                opt.step()
                opt.zero_grad(set_to_none=True)
    peak = profiler_peak(prof, region="steps")
    Path(out, f"rank{rank}.json").write_text(json.dumps(peak))
    dist.destroy_process_group()


@pytest.mark.slow  # two spawned ranks, about a minute on 2 shared cores
def test_fsdp1_qlora_rank_peak_matches_a_real_gloo_run(tmp_path):
    """memgnn's rank-0 peak for FSDP-QLoRA (its bitsandbytes stand-ins; captured for a CPU
    target to compare like with like: bitsandbytes 0.50.2's CPU path dequantises and runs
    F.linear as the stand-ins do) against a real 2-rank gloo run. gloo's worker thread
    frees a collective's staging copy when it lets go of the work, sometimes after the main
    thread's next allocations (a few KB more, at random, on either rank): the lowest peak
    over the ranks (their shards differ by padding only, 512 B here) and up to three runs.
    Within 2 KB of ~1.5 MB: memgnn counts ~1 KB more than the profiler in the plain
    DDP/FSDP2/FSDP1 checks too (benchmarks/results/sharding.md)."""
    pytest.importorskip("bitsandbytes")
    train = TrainSpec.of(gpus=2, sharding="fsdp1", **QLORA)
    with mock.patch("memgnn.predictor.capture.step.check_cuda_only", lambda *_: None):
        graph = capture(_llama(), train, CaptureConfig(target="cpu"))
    ours = AnalyticModel().predict(graph, [Query(sizes=SIZES, device="cpu")])[0]
    real: list[int] = []
    for _attempt in range(3):
        real += spawn_ranks(_rank, tmp_path)
        if abs(ours.predicted_peak_bytes - min(real)) <= 2048:
            break
    assert abs(ours.predicted_peak_bytes - min(real)) <= 2048, real
