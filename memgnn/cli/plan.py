"""`memgnn plan`: the best training config under --budget or --threshold, and why.

The search (`predictor.plan.search`) runs over batch, accumulation, checkpointing, precision,
optimizer implementation, sharding and GPU count; the answer is printed next to the
numbers a user reasons with (`predictor.plan.decision`): state bytes (parameters, gradients,
optimizer state: one rank's share), activation bytes per sample (the slope of the bound
in B), the straight-line largest batch, and the chosen B, G and checkpointed blocks.
`graphs` says how many captured graphs the search used (each captured once or read from
the cache), with the seconds each took to get.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from memgnn.cli.options import (
    METRIC_HELP,
    add_cache_args,
    add_device_args,
    add_limit_args,
    add_model_args,
    add_size_args,
    add_train_args,
    device_name,
    explicit_train_options,
    memory_limit,
    model_ref,
    parse_sizes,
    run_config,
    train_spec,
)
from memgnn.cli.render import compile_lines, config_lines, fmt_bytes, loop_line, model_line
from memgnn.predictor.answer.backend import LocalBackend
from memgnn.predictor.answer.plan import PlanRequest, plan
from memgnn.predictor.emulate.parallel import worst_stage
from memgnn.predictor.errors import UserError
from memgnn.predictor.ir.vocab import METRICS, SEARCH_MODES
from memgnn.predictor.plan.space import layouts
from memgnn.predictor.spec.devices import get_profile
from memgnn.predictor.spec.train import TrainSpec

__all__ = ["add_arguments", "add_plan_space_args", "decision_lines", "plan_cmd", "plan_request"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_args(p, config=True)
    add_size_args(p)
    add_train_args(p)
    add_limit_args(p, "one of the two is required")
    add_device_args(p)
    p.add_argument("--metric", choices=METRICS, default=None, help=METRIC_HELP)
    add_plan_space_args(p)
    p.add_argument(
        "--mode", choices=SEARCH_MODES, default=None,
        help="power: powers of two only (the default); binsearch: bisect between them too "
        "(the same as --any-batch)",
    )  # fmt: skip
    p.add_argument("--any-batch", action="store_true", help="any batch size (--mode binsearch)")
    p.add_argument("--json", action="store_true")
    add_cache_args(p)
    p.set_defaults(func=plan_cmd)


def add_plan_space_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("search space (comma lists)")
    g.add_argument("--max-batch", type=int, default=4096)
    g.add_argument("--accum-choices", default="1", help="comma list of G")
    g.add_argument("--checkpointing-choices", default="none,full", help="none,full,blocks:N,...")
    g.add_argument("--precision-choices", default=None, help="default: --precision")
    g.add_argument(
        "--optimizer-impl-choices",
        default=None,
        help="foreach,fused,for-loop (default: --optimizer-impl)",
    )
    g.add_argument("--sharding-choices", default=None, help="default: --sharding")
    g.add_argument(
        "--gpus-choices", default=None, help="default: --gpus; 1 runs unsharded, more take each"
    )
    g.add_argument("--effective-batch", type=int, default=None, help="B*G at least (per rank)")
    g.add_argument("--tp-choices", default=None, help="comma list of --tp (default: --tp)")
    g.add_argument("--pp-choices", default=None, help="comma list of --pp (default: --pp)")
    g.add_argument(
        "--pp-schedule-choices", default=None, help="comma list of --pp-schedule (default: its)"
    )
    g.add_argument(
        "--microbatch-choices", default=None, help="comma list of --microbatches (default: its)"
    )
    g.add_argument(
        "--layouts", action="store_true",
        help="search the model-parallel layouts of --gpus (or the largest --gpus-choices): "
        "--tp over powers of two within a node (up to 8) and --pp over powers of two up to "
        "16 stages, each with the data-parallel ranks left sharded by --sharding-choices; "
        "explicit --tp-choices / --pp-choices win",
    )  # fmt: skip


def _csv(text: str | None, name: str, cast=str) -> list:
    if text is None:
        return []
    try:
        out = [cast(x.strip()) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{name}: bad list {text!r}") from None
    if not out:
        raise ValueError(f"{name}: empty list")
    return out


def plan_request(args: argparse.Namespace) -> PlanRequest:
    """The answer layer's request for `memgnn plan`'s arguments."""
    if args.batch is not None:
        raise UserError("plan searches the batch size: cap it with --max-batch N, not --batch")
    if args.mode == "power" and args.any_batch:
        raise UserError("--mode power finds powers of two only; --any-batch needs binsearch")
    any_batch = args.any_batch or args.mode == "binsearch"
    device = get_profile(device_name(args))
    limit = memory_limit(args, device, required=True)
    base = train_spec(args)
    precisions = _csv(args.precision_choices, "--precision-choices") or [base.numerics.precision]
    space: dict[str, Any] = {
        "sizes": {k: v for k, v in parse_sizes(args).items() if k != "B"},
        "max_batch": args.max_batch,
        "grad_accum": _csv(args.accum_choices, "--accum-choices", int),
        "checkpointing": _csv(args.checkpointing_choices, "--checkpointing-choices"),
        "precision": precisions,
        "effective_batch": args.effective_batch,
        "mode": "binsearch" if any_batch else "power",
        "power_of_two": not any_batch,
        "optimizer_impl": _csv(args.optimizer_impl_choices, "--optimizer-impl-choices"),
        "sharding": _csv(args.sharding_choices, "--sharding-choices"),
        "gpus": _csv(args.gpus_choices, "--gpus-choices", int),
        "tp": _csv(args.tp_choices, "--tp-choices", int),
        "pp": _csv(args.pp_choices, "--pp-choices", int),
        "pp_schedule": _csv(args.pp_schedule_choices, "--pp-schedule-choices"),
        "microbatches": _csv(args.microbatch_choices, "--microbatch-choices", int),
    }
    if args.layouts:
        auto = layouts(max(space["gpus"] or [base.parallel.gpus]))
        space["tp"] = space["tp"] or auto["tp"]
        space["pp"] = space["pp"] or auto["pp"]
    return PlanRequest(
        model=model_ref(args),
        train=base,
        run_config=run_config(args),
        explicit=frozenset(explicit_train_options(args)),
        **(
            {"threshold": limit.threshold}
            if limit.source == "threshold"
            else {"budget": limit.budget_bytes}
        ),
        device=device.name,
        metric=args.metric,
        space=space,
    )


def plan_cmd(args: argparse.Namespace) -> int:
    req = plan_request(args)
    backend = LocalBackend(use_cache=not args.no_cache, capture_mode=args.capture)
    answer = plan(req, backend)
    if answer.best is None:
        raise UserError(answer.reason)
    out = answer.to_dict()
    if args.json:
        print(json.dumps(out, indent=2, default=str))
        return 0
    for line in decision_lines(out, out["limit_bytes"]):
        print(line)
    print(model_line(out["model"]))
    print(loop_line(TrainSpec.from_dict(out["train"])))
    for line in compile_lines(TrainSpec.from_dict(out["train"])):
        print(line)
    if out["config"]:
        for line in config_lines(out["config"]):
            print(line)
    for c in out["runners_up"]:
        where = f" {_layout(c)}" if c["gpus"] > 1 else ""
        print(
            f"  then B={c['batch_size']} G={c['grad_accum']} {c['checkpointing']} "
            f"{c['precision']} {c['optimizer_impl']}{where}: {fmt_bytes(c['bound_bytes'])}"
        )
    print(
        f"searched {out['variants']} configurations on {out['graphs']} captured graphs "
        f"({sum(out['graph_seconds']):.1f} s to capture or load them), {out['queries']} "
        "predictions"
    )
    for text in out["left_out"]:
        print(f"left out: {text}")
    return 0


def _ckpt_text(ckpt: str, blocks: int | None) -> str:
    if ckpt == "none":
        return "no checkpointing"
    if ckpt == "full":
        return f"all {blocks} blocks checkpointed" if blocks else "every block checkpointed"
    n = int(ckpt.split(":", 1)[1])
    return f"{n} of {blocks} blocks checkpointed" if blocks else f"{n} blocks checkpointed"


def _layout(c: dict[str, Any]) -> str:
    """How a candidate splits over its GPUs: the data-parallel ranks' sharding, --tp, --pp
    with its schedule and micro-batches."""
    tp, pp = c.get("tp") or 1, c.get("pp") or 1
    dp = c["gpus"] // (tp * pp)
    parts = [f"{c['sharding']} x{dp}" if dp > 1 else ""]
    parts.append(f"--tp {tp}" if tp > 1 else "")
    if pp > 1:
        micro = c.get("microbatches") or pp
        parts.append(f"--pp {pp} {c.get('pp_schedule', '1f1b')} ({micro} micro-batches of B)")
    return ", ".join(p for p in parts if p) + f" over {c['gpus']} GPUs"


def _stage_line(out: dict[str, Any]) -> str | None:
    """Every pipeline stage's peak and the worst, where the choice is a pipeline."""
    peaks = (out.get("best") or {}).get("stage_peaks") or []
    if len(peaks) < 2:
        return None
    each = ", ".join(f"{k}: {fmt_bytes(v)}" for k, v in enumerate(peaks))
    return f"stages {each} (worst: stage {worst_stage(peaks)})"


def decision_lines(out: dict[str, Any], limit: int) -> list[str]:
    """The answer as the worked example reasons: state, per-sample bytes, largest batch,
    then the choice."""
    d = out["decision"]
    cats = d.get("state_by_category") or {}
    where = f" per rank ({_layout(out['best'])})" if out["gpus"] > 1 else ""
    share = f"{out['threshold'] * 100:g}% of {fmt_bytes(out['budget_bytes'])}"
    lines = [f"limit {fmt_bytes(limit)} ({share})"]
    if d.get("state_bytes") is not None:
        lines.append(
            f"state {fmt_bytes(d['state_bytes'])}{where}: parameters "
            f"{fmt_bytes(cats.get('parameter'))}, gradients {fmt_bytes(cats.get('gradient'))}, "
            f"optimizer state {fmt_bytes(cats.get('optimizer_state'))}"
        )
    if d.get("per_sample_bytes") is not None:
        lo, hi = d["slope_batches"]
        lines.append(
            f"activations {fmt_bytes(d['per_sample_bytes'])} per sample (slope of the bound "
            f"between B={lo} and B={hi}); fixed {fmt_bytes(d['fixed_bytes'])} (state + what "
            "does not grow with B)"
        )
        lines.append(
            f"theoretical largest batch (limit - fixed) / per-sample = {d['theoretical_max_batch']}"
        )
    p = out["prediction"]
    if (stages := _stage_line(out)) is not None:
        lines.append(stages)
    lines.append(
        f"chosen B={out['batch_size']}, G={out['grad_accum']}, "
        f"{_ckpt_text(out['checkpointing'], out['model'].get('blocks'))}, "
        f"{out['precision']}, optimizer {out['optimizer_impl']}"
        + (f", {_layout(out['best'])}" if out["gpus"] > 1 else "")
        + f" (global batch {out['global_batch']}): bound {fmt_bytes(p['upper_bound_bytes'])} "
        f"{p['metric']} ({p['method']})"
    )
    return lines
