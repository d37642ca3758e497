"""FSDP-QLoRA per rank: memgnn next to a real 2-rank gloo run on CPU (bitsandbytes' CPU path).

- real gloo: 2 processes; a Llama built in bf16, its Linears replaced by transformers' own
  `replace_with_bnb_linear` (real `bnb.nn.Linear4bit`, nf4, `bnb_4bit_quant_storage=bf16`,
  quantised on the CPU), peft LoRA (r 8, alpha 16, peft's Llama targets q_proj/v_proj,
  adapters in bf16: `autocast_adapter_dtype=False`), then FSDP1 `FullyShardedDataParallel`
  with peft's own `fsdp_auto_wrap_policy` (HF Trainer's FSDP-QLoRA) or FSDP2 `fully_shard`
  per decoder layer and root; AdamW (for-loop), two steps; per-rank peak live bytes from
  torch.profiler's CPU allocator events (as benchmarks/sharding.py). bitsandbytes 0.50.2's
  CPU `gemm_4bit` dequantises the weight and runs `F.linear`, as its CUDA path does for
  long inputs, and its backward dequantises again: the temporaries memgnn's stand-ins model.
- memgnn: the same spec captured for a CPU target (`--quantize-base` is refused on CPU
  targets in the product, its stand-ins model bitsandbytes' CUDA kernels; here the check is
  lifted to compare like with like), evaluated at the sizes (allocated, with gloo staging).

    .venv/bin/python benchmarks/sharding_qlora.py [--repeats 3]  # -> results/sharding_qlora.md
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
from pathlib import Path
from unittest import mock

import bitsandbytes as bnb
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from memgnn.dataset.cpu_backend import profiler_peak
from memgnn.predictor.capture.capture import CaptureConfig, capture
from memgnn.predictor.capture.step import build_optimizer
from memgnn.predictor.ir.vocab import CATEGORIES
from memgnn.predictor.memory.analytic import AnalyticModel
from memgnn.predictor.memory.base import Query
from memgnn.predictor.spec.bundle import default_blocks
from memgnn.predictor.spec.train import TrainSpec
from memgnn.predictor.zoo.resolve import resolve
from memgnn.serving.client import free_port
from sharding import OUT, SMALL, SMALL_SIZES, memgnn_peak

log = logging.getLogger("sharding_qlora")
BF16 = torch.bfloat16


def spec_for(sharding: str, kind: str) -> TrainSpec:
    return TrainSpec.of(
        precision="bf16", peft="lora", lora_dtype="model", quantize_base=kind,
        bnb_quant_storage="bf16", gpus=2, sharding=sharding,
    )  # fmt: skip


def _quantised_lora(bundle, kind: str):
    """The model as transformers + peft build a QLoRA model (real bitsandbytes layers)."""
    import peft
    import transformers
    from torch import nn
    from transformers.integrations.bitsandbytes import replace_with_bnb_linear
    from transformers.quantizers.base import get_keys_to_not_convert

    old = torch.get_default_dtype()
    torch.set_default_dtype(BF16)
    try:
        model = bundle.build().train()
    finally:
        torch.set_default_dtype(old)
    weights = {n: m.weight.data for n, m in model.named_modules() if type(m) is nn.Linear}
    config = transformers.BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=BF16,
        bnb_4bit_quant_storage=BF16, bnb_4bit_use_double_quant=kind == "nf4-dq",
    )  # fmt: skip
    model = replace_with_bnb_linear(
        model, modules_to_not_convert=get_keys_to_not_convert(model), quantization_config=config
    )
    for name, module in model.named_modules():
        if isinstance(module, bnb.nn.Linear4bit):
            module.weight = bnb.nn.Params4bit(
                weights.pop(name), requires_grad=False, quant_type="nf4",
                compress_statistics=kind == "nf4-dq", quant_storage=BF16, module=module,
            )  # fmt: skip
            module.to("cpu")  # quantises
    del weights
    model.is_loaded_in_4bit = True
    lora = peft.LoraConfig(r=8, lora_alpha=16)
    return peft.get_peft_model(model, lora, autocast_adapter_dtype=False)


def _real_rank(rank: int, world: int, port: int, sharding: str, kind: str, out: str) -> None:
    from torch.profiler import ProfilerActivity, profile, record_function

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    spec, args = SMALL
    bundle = resolve(spec, args)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        model = _quantised_lora(bundle, kind)
        if sharding == "fsdp1":
            from peft.utils.other import fsdp_auto_wrap_policy
            from torch.distributed.fsdp import FullyShardedDataParallel

            policy = fsdp_auto_wrap_policy(model)
            model = FullyShardedDataParallel(
                model, auto_wrap_policy=policy, device_id=torch.device("cpu")
            )
        else:
            from torch.distributed.fsdp import fully_shard

            for layer in model.base_model.model.model.layers:
                fully_shard(layer)
            fully_shard(model)
        params = [p for p in model.parameters() if p.requires_grad]
        opt = build_optimizer(params, TrainSpec(), "cpu")
        with record_function("steps"):
            for _ in range(2):
                inputs = bundle.make_inputs(SMALL_SIZES, torch.device("cpu"), BF16)
                loss = bundle.loss(model, inputs)
                loss.backward()
                del loss, inputs
                opt.step()
                opt.zero_grad(set_to_none=True)
    peak = profiler_peak(prof, region="steps")
    Path(out, f"rank{rank}.json").write_text(json.dumps({"peak": peak}))
    dist.destroy_process_group()


def real_peaks(sharding: str, kind: str, world: int = 2) -> list[int]:
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(
            _real_rank, args=(world, free_port(), sharding, kind, tmp), nprocs=world,
            join=True, start_method="spawn",
        )  # fmt: skip
        return [json.loads(Path(tmp, f"rank{r}.json").read_text())["peak"] for r in range(world)]


def _gradient_bytes(graph, step: int = 1) -> int:
    """Bytes of the gradient storages allocated in `step` (the steady one)."""
    p = graph.paths[0]
    nbytes = graph.storage_bytes(0, graph.resolve_sizes(graph.symbols))
    code = CATEGORIES.index("gradient")
    return sum(
        int(nbytes[u])
        for u in range(p.num_storages)
        if p.storages["category"][u] == code and p.storages["alloc"][u] >= 0
        and p.nodes["step"][p.storages["alloc"][u]] == step
    )  # fmt: skip


def lora_gradient_rows() -> list[str]:
    """LoRA under FSDP1 on a catalog model: each layer's adapters flattened with its frozen
    weights (use_orig_params=True, one unit per layer) against peft's policy (each adapter
    its own unit): rank 0's gradient bytes per step, by hand and by memgnn."""
    spec = "hf:TinyLlama/TinyLlama-1.1B-Chat-v1.0"
    bundle = resolve(spec)
    gpus = 8
    base = {"peft": "lora", "precision": "bf16", "lora_dtype": "model", "gpus": gpus,
            "sharding": "fsdp1"}  # fmt: skip
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        model = bundle.build()
        layers = [sum(p.numel() for p in b.parameters()) for b in default_blocks(model)]
        hidden = model.config.hidden_size
        kv = model.config.num_key_value_heads * (hidden // model.config.num_attention_heads)
    adapters = [8 * hidden, hidden * 8, 8 * hidden, kv * 8]  # q_proj, v_proj: A, B (r 8)
    out = [
        f"## LoRA under FSDP1: {spec}, {gpus} ranks, bf16, peft's default targets (q_proj, "
        "v_proj, r 8), adapters in bf16; rank 0's gradient bytes per step",
        "",
        "| wrap | use_orig_params | by hand | memgnn | peak (a100-80gb, B 1, S 512) |",
        "|---|---|---|---|---|",
    ]
    for wrap, orig in (("blocks", True), ("peft", False)):
        train = TrainSpec.of(**base, fsdp1_wrap=wrap, fsdp1_use_orig_params=orig)
        graph = capture(bundle, train, CaptureConfig(target="cuda"))
        if wrap == "blocks":  # the whole flat parameter's shard, frozen weights included
            hand = sum(-(-(n + sum(adapters)) // gpus) * 2 for n in layers)
        else:  # each adapter's own flat parameter
            hand = len(layers) * sum(-(-a // gpus) * 2 for a in adapters)
        peak = (
            AnalyticModel()
            .predict(graph, [Query(sizes={"B": 1, "S": 512}, device="a100-80gb")])[0]
            .predicted_peak_bytes
        )
        out.append(f"| {wrap} | {orig} | {hand:,} | {_gradient_bytes(graph):,} | {peak:,} |")
        log.info("%s", out[-1])
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3, help="real runs per row (min is kept)")
    ap.add_argument("--quick", action="store_true", help="skip the catalog LoRA rows")
    a = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(1)
    spec, args = SMALL
    bundle = resolve(spec, args)
    lines = [
        "# FSDP-QLoRA per rank (rank 0, tensor bytes, allocated, cpu device)",
        "",
        f"`python benchmarks/sharding_qlora.py --repeats {a.repeats}` (torch "
        f"{torch.__version__}, bitsandbytes {bnb.__version__}). {spec} {args}, sizes "
        f"{SMALL_SIZES}, bf16, LoRA r 8 on q_proj/v_proj (bf16 adapters), 4-bit codes in "
        "bf16 storage, AdamW (for-loop), 2 steps, 2 ranks over gloo. real gloo: the lowest "
        "of the repeats per rank (gloo's worker thread frees a collective's staging copy "
        "when it finishes, which sometimes overlaps the next allocations: + one staging "
        "buffer); memgnn: the capture for a CPU target (see the module docstring).",
        "",
        "| sharding | quant | memgnn (gloo) | real gloo rank 0 | err | real rank 1 | runs "
        "(rank 0) | memgnn parameter | capture s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for sharding, kind in (("fsdp1", "nf4"), ("fsdp1", "nf4-dq"), ("fsdp", "nf4")):
        train = spec_for(sharding, kind)
        with mock.patch("memgnn.predictor.capture.step.check_cuda_only", lambda *_: None):
            ours, _, cats, secs, _ = memgnn_peak(bundle, train, SMALL_SIZES)
        runs = [real_peaks(sharding, kind) for _ in range(a.repeats)]
        real0, real1 = (min(r[k] for r in runs) for k in (0, 1))
        err = f"{100 * (ours - real0) / real0:+.3f}% ({ours - real0:+,} B)"
        lines.append(
            f"| {sharding} | {kind} | {ours:,} | {real0:,} | {err} | {real1:,} | "
            f"{', '.join(f'{r[0]:,}' for r in runs)} | {cats['parameter']:,} | {secs:.1f} |"
        )
        log.info("%s", lines[-1])
    if not a.quick:
        lines += ["", *lora_gradient_rows()]
    OUT.mkdir(exist_ok=True)
    (OUT / "sharding_qlora.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
