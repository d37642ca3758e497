"""The options every model command shares (model, sizes, training) and their parsing into
sizes, model args and a `TrainSpec`: used by the parser (`memgnn.cli`) and by the commands
(`memgnn.commands`, `memgnn.snapshot_cli`), so neither imports the other for them."""

from __future__ import annotations

import argparse

from memgnn.predictor.ir.vocab import SHARDINGS
from memgnn.predictor.spec.train import (
    ATTENTIONS,
    BNB_VERSION,
    GRAD_SYNCS,
    LORA_DTYPES,
    OPTIMIZER_IMPLS,
    OPTIMIZERS,
    PEFT_METHODS,
    PRECISIONS,
    QUANTIZE_BASES,
    STEP_KINDS,
    TrainSpec,
)


def _key_value(text: str) -> tuple[str, str]:
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    key, value = text.split("=", 1)
    return key.strip(), value.strip()


def _bool(text: str) -> bool:
    value = text.strip().lower()
    if value not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return value == "true"


def add_model_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model")
    g.add_argument("--model", required=True, help="zoo name, hf:PATH/config.json or py:mod:fn")
    g.add_argument("--model-arg", action="append", type=_key_value, default=[], metavar="K=V")
    g.add_argument("--task", default=None, help="for hf: specs (causal-lm, seq-cls, ...)")


def add_size_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sizes")
    g.add_argument("--batch", type=int, default=None, help="batch size (symbol B)")
    g.add_argument("--seq", type=int, default=None, help="sequence length (symbol S)")
    g.add_argument("--image", type=int, default=None, help="image size (model hparam)")
    g.add_argument("--dim", action="append", type=_key_value, default=[], metavar="SYM=N")


def add_train_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("training")
    g.add_argument("--precision", choices=PRECISIONS, default="fp32")
    g.add_argument("--optimizer", choices=OPTIMIZERS, default="adamw")
    g.add_argument("--optimizer-impl", choices=OPTIMIZER_IMPLS, default="auto")
    g.add_argument(
        "--checkpointing",
        default="none",
        help="none | full | blocks:N (the first N blocks) | hf (transformers' own, every layer)",
    )
    g.add_argument("--grad-accum", type=int, default=1)
    g.add_argument("--steps", choices=STEP_KINDS, default="both")
    g.add_argument(
        "--zero-grad",
        choices=("none", "zero"),
        default="none",
        help="zero_grad(set_to_none=True) ('none', the default) or keep zeroed grads",
    )
    g.add_argument("--peft", choices=PEFT_METHODS, default="none", help="LoRA through peft")
    g.add_argument("--lora-r", type=int, default=8)
    g.add_argument("--lora-alpha", type=float, default=16.0)
    g.add_argument("--lora-dropout", type=float, default=0.0)
    g.add_argument("--lora-targets", default="", help="q_proj,v_proj,...; default: peft's")
    g.add_argument(
        "--lora-dtype",
        choices=LORA_DTYPES,
        default="fp32",
        help="adapters in fp32 (peft's default upcast) or in the model's dtype (LitGPT's LoRA)",
    )
    g.add_argument("--gpus", type=int, default=1, help="world size; the answer is one rank's")
    g.add_argument("--sharding", choices=SHARDINGS, default="none", help="how ranks split")
    g.add_argument(
        "--fsdp-reshard-after-forward",
        type=_bool,
        default=True,
        metavar="true|false",
        help="fsdp/hsdp: free all-gathered parameters after forward (default true)",
    )
    g.add_argument("--hsdp-shard-size", type=int, default=0, help="hsdp: ranks per shard group")
    g.add_argument(
        "--grad-sync",
        choices=GRAD_SYNCS,
        default="every",
        help="with --grad-accum on several GPUs: sync gradients every micro-step, or the last "
        "only (DDP/FSDP no_sync: unsharded gradients kept until then)",
    )
    g.add_argument(
        "--quantize-base",
        choices=QUANTIZE_BASES,
        default="none",
        help="QLoRA: the frozen base's Linears in bitsandbytes nf4 (nf4-dq: double quant) "
        "or int8; GPU devices, with --peft lora",
    )
    g.add_argument(
        "--bnb-version",
        default=BNB_VERSION,
        help=f"bitsandbytes release of --quantize-base's kernels (default {BNB_VERSION}); "
        "before 0.43.2 every 4-bit matmul kept its input until the graph was freed",
    )
    g.add_argument(
        "--hold-outputs",
        action="store_true",
        help="the loop keeps the last micro-step's loss/outputs (and graph) until the next "
        "forward's (`loss = model(b).loss` in a for loop; LitGPT); default: freed after backward",
    )
    g.add_argument(
        "--attention",
        choices=ATTENTIONS,
        default="auto",
        help="HF attn_implementation: eager | sdpa | flash (flash_attention_2, CUDA sm80+); "
        "auto: the model class's default",
    )


# A one-shot CLI answer: the compiled replay core's load from numba's on-disk cache
# (2.19 s, benchmarks/results/replay_speed.md "JIT warm-up") fits, its compile (67.59 s) does
# not; the server keeps its per-request 250 ms (`ServeConfig.replay_budget_ms`).
CLI_REPLAY_BUDGET_MS = 5000.0

BUDGET_HELP = (
    "memory budget: bytes with a unit (24GiB, 68GB) or >= 1024 without (8e9), or a fraction "
    "of the device: 50%% or 0.5; a bare small integer such as 1 is refused as ambiguous"
)
THRESHOLD_HELP = (
    "fraction 0 < F <= 1 of the device's memory the bound may reach (0.85: 85%% of an "
    "80 GiB card); not with --budget"
)


def add_limit_args(p: argparse.ArgumentParser, what: str) -> None:
    """--budget / --threshold (mutually exclusive, checked by `predictor.spec.limits`)."""
    g = p.add_argument_group(f"memory limit ({what})")
    g.add_argument("--budget", default=None, help=BUDGET_HELP)
    g.add_argument("--threshold", type=float, default=None, help=THRESHOLD_HELP)


def memory_limit(args: argparse.Namespace, device, *, required: bool = False):
    """The `predictor.spec.limits.MemoryLimit` of --budget / --threshold on `device` (or None)."""
    from memgnn.predictor.spec.limits import resolve_limit

    return resolve_limit(
        budget=args.budget,
        threshold=args.threshold,
        device_total=device.total_bytes,
        device=device.name,
        required=required,
    )


def add_cache_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--no-cache",
        action="store_true",
        help="capture anew, store nothing (the cache: $MEMGNN_CACHE, default ~/.cache/memgnn)",
    )
    p.add_argument(
        "--capture",
        choices=("blocks", "full"),
        default="blocks",
        help="blocks (default): a model whose layers are alike is captured at 4 layers and "
        "its repeated layer replicated (full capture where that is not shown exact); "
        "full: capture every layer",
    )


def _int_value(key: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{key} must be an integer, got {value!r}") from None


def parse_sizes(args: argparse.Namespace) -> dict[str, int]:
    sizes: dict[str, int] = {}
    if args.batch is not None:
        sizes["B"] = args.batch
    if args.seq is not None:
        sizes["S"] = args.seq
    for key, value in args.dim:
        sizes[key] = _int_value(f"--dim {key}", value)
    for key, value in sizes.items():
        if value < 1:
            raise ValueError(f"size {key} must be >= 1, got {value}")
    return sizes


def model_args(args: argparse.Namespace) -> dict[str, str]:
    out = dict(args.model_arg)
    if getattr(args, "image", None) is not None:
        if args.image < 1:
            raise ValueError(f"--image must be >= 1, got {args.image}")
        out["image"] = str(args.image)
    return out


def train_spec(args: argparse.Namespace) -> TrainSpec:
    return TrainSpec(
        precision=args.precision,
        optimizer=args.optimizer,
        optimizer_impl=args.optimizer_impl,
        checkpointing=args.checkpointing,
        grad_accum=args.grad_accum,
        steps=args.steps,
        set_to_none=args.zero_grad == "none",
        peft=args.peft,
        lora_r=args.lora_r,
        lora_alpha=args.lora_alpha,
        lora_dropout=args.lora_dropout,
        lora_targets=args.lora_targets,
        lora_dtype=args.lora_dtype,
        gpus=args.gpus,
        sharding=args.sharding,
        fsdp_reshard_after_forward=args.fsdp_reshard_after_forward,
        hsdp_shard_size=args.hsdp_shard_size,
        grad_sync=args.grad_sync,
        quantize_base=args.quantize_base,
        attention=args.attention,
        bnb_version=args.bnb_version,
        hold_outputs=args.hold_outputs,
    )


__all__ = [
    "CLI_REPLAY_BUDGET_MS",
    "add_cache_arg",
    "add_limit_args",
    "add_model_args",
    "add_size_args",
    "add_train_args",
    "memory_limit",
    "model_args",
    "parse_sizes",
    "train_spec",
]
