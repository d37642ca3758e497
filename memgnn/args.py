"""The options every model command shares (model, sizes, training) and their parsing into
sizes, model args and a `TrainSpec`: used by the parser (`memgnn.cli`) and by the commands
(`memgnn.commands`, `memgnn.snapshot_cli`), so neither imports the other for them."""

from __future__ import annotations

import argparse

from memgnn.predictor.spec import (
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
    g.add_argument("--checkpointing", default="none", help="none | full | blocks:N")
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
        "--quantize-base",
        choices=QUANTIZE_BASES,
        default="none",
        help="QLoRA: the frozen base's Linears in bitsandbytes nf4 (nf4-dq: double quant) "
        "or int8; GPU devices, with --peft lora",
    )


def add_cache_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--no-cache",
        action="store_true",
        help="capture anew, store nothing (the cache: $MEMGNN_CACHE, default ~/.cache/memgnn)",
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
        quantize_base=args.quantize_base,
    )


__all__ = [
    "add_cache_arg",
    "add_model_args",
    "add_size_args",
    "add_train_args",
    "model_args",
    "parse_sizes",
    "train_spec",
]
