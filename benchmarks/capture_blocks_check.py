"""Check the capture of repeated blocks against a full capture, storage for storage.

For each case (model, depth, training setup) the model is captured twice at the same
depth: `CaptureConfig(mode="blocks")` (a capture at `blocks_depth` blocks, the middle one
replicated) and `mode="full"`. The two graphs must have the same graph id (the hash of
every node, storage, size expression, guard), hence the same allocated peak and the same
replayed reserved bytes, which are reported too (simulated a100-80gb, B=2, S=96). A case
that cannot replicate must say so and fall back to the full capture.

    nice -n 10 python benchmarks/capture_blocks_check.py [--only NAME] [--out FILE.md]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from memgnn.predictor.capture.capture import CaptureConfig, capture
from memgnn.predictor.sim.simulate import simulate
from memgnn.predictor.spec.devices import get_profile
from memgnn.predictor.spec.train import TrainSpec
from memgnn.predictor.zoo.resolve import make_bundle, resolve

TINY_LLAMA = {
    "hidden_size": "64",
    "intermediate_size": "172",
    "num_attention_heads": "4",
    "num_key_value_heads": "2",
    "vocab_size": "512",
}
TINY_GPT2 = {"n_embd": "64", "n_head": "4", "vocab_size": "512"}
TINY_GEMMA2 = {
    "hidden_size": "64",
    "intermediate_size": "128",
    "num_attention_heads": "4",
    "num_key_value_heads": "2",
    "head_dim": "16",
    "vocab_size": "512",
}


def _zoo(n: int):
    return make_bundle("llama", {"layers": n})


def _hf(name: str, args: dict[str, str]):
    return lambda n: resolve(f"hf:{name}", args | {"num_hidden_layers": str(n)})


LLAMA = _hf("meta-llama/Llama-2-7b-hf", TINY_LLAMA)
GPT2 = _hf("gpt2", TINY_GPT2)
GEMMA2 = _hf("google/gemma-2-9b", TINY_GEMMA2)
T = TrainSpec


def cases():
    """(name, bundle at n blocks, training, n, captured blocks)."""
    return [
        ("zoo llama fp32", _zoo, T(), 6, 4),
        ("zoo llama fp32, depth 5", _zoo, T(), 8, 5),
        ("zoo llama bf16 fused AdamW", _zoo, T(precision="bf16", optimizer_impl="fused"), 6, 4),
        ("zoo llama amp-bf16 for-loop", _zoo, T(precision="amp-bf16", optimizer_impl="for-loop"), 6, 4),  # noqa: E501
        ("zoo llama checkpointing full", _zoo, T(checkpointing="full"), 6, 4),
        ("zoo llama checkpointing blocks:8", _zoo, T(checkpointing="blocks:8"), 6, 4),
        ("zoo llama blocks:2 (falls back)", _zoo, T(checkpointing="blocks:2"), 6, 4),
        ("zoo llama sgd, steady step", _zoo, T(optimizer="sgd", steps="steady"), 6, 4),
        ("zoo llama grad_accum 2", _zoo, T(grad_accum=2), 6, 4),
        ("hf gpt2 fp32", GPT2, T(), 6, 4),
        ("hf gpt2 bf16 hf checkpointing", GPT2, T(precision="bf16", checkpointing="hf"), 6, 4),
        ("hf llama LoRA bf16", LLAMA, T(precision="bf16", peft="lora"), 6, 4),
        ("hf llama LoRA for-loop", LLAMA, T(peft="lora", optimizer_impl="for-loop"), 6, 4),
        ("hf llama fsdp 2 GPUs (falls back)", LLAMA, T(gpus=2, sharding="fsdp"), 6, 4),
        ("hf gemma-2 alternating windows (falls back)", GEMMA2, T(), 6, 4),
    ]  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="default: benchmarks/results/capture_blocks_check.md "
                    "(a run with --only writes only where --out says)")  # fmt: skip
    ap.add_argument("--only", default="", help="run the cases whose name contains this")
    args = ap.parse_args()
    device = get_profile("a100-80gb")
    sizes = {"B": 2, "S": 96}
    rows = []
    for name, make, train, n, depth in cases():
        if args.only and args.only not in name:
            continue
        bundle = make(n)
        t0 = time.process_time()
        fast = capture(bundle, train, CaptureConfig(mode="blocks", blocks_depth=depth))
        t1 = time.process_time()
        full = capture(bundle, train, CaptureConfig(mode="full"))
        t2 = time.process_time()
        mode = fast.meta["capture"]["mode"]
        a, b = simulate(fast, sizes, device), simulate(full, sizes, device)
        same = fast.graph_id == full.graph_id
        row = (
            f"| {name} | {n} | {depth} | {mode} | {fast.paths[0].num_storages} | "
            f"{'yes' if same else 'NO'} | {a.peak_allocated_bytes} | {b.peak_allocated_bytes} | "
            f"{a.peak_reserved_bytes} | {b.peak_reserved_bytes} | {t1 - t0:.2f} | {t2 - t1:.2f} | "
            f"{fast.meta['capture'].get('why', '')} |"
        )
        print(row, flush=True)
        rows.append(row)
    head = [
        "# Repeated-block capture vs full capture, storage for storage",
        "",
        "Command: `nice -n 10 python benchmarks/capture_blocks_check.py`; same = identical "
        "graph id (every node, storage, size expression and guard); peaks at B=2, S=96 on a "
        "simulated a100-80gb (allocated, reserved; bytes); CPU seconds of each capture.",
        "",
        "| case | blocks | captured | mode | storages | same graph | blocks allocated | "
        "full allocated | blocks reserved | full reserved | blocks CPU s | full CPU s | "
        "fallback reason |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    out = args.out or (None if args.only else "benchmarks/results/capture_blocks_check.md")
    if out:
        head[2] = head[2].replace(
            "capture_blocks_check.py`",
            f"capture_blocks_check.py{' --only ' + repr(args.only) if args.only else ''}`",
        )
        Path(out).write_text("\n".join(head + rows) + "\n")


if __name__ == "__main__":
    main()
