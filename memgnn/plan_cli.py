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
import time
from typing import Any

from memgnn.args import memory_limit, parse_sizes, train_spec
from memgnn.display import fmt_bytes, loop_line, model_line

__all__ = ["add_plan_space_args", "decision_lines", "plan_cmd"]


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


def _counting(graph_for):
    """graph_for that records the seconds each distinct capture took to get."""
    seen: dict[str, float] = {}

    def wrapped(train):
        key = json.dumps(train.flat(), sort_keys=True)
        t0 = time.perf_counter()
        graph = graph_for(train)
        seen.setdefault(key, round(time.perf_counter() - t0, 3))
        return graph

    return wrapped, seen


def plan_cmd(args: argparse.Namespace) -> int:
    from memgnn.commands import _graph_for, _model_info, resolve_bundle
    from memgnn.predictor.answer.exact import ReplayModel
    from memgnn.predictor.errors import UserError
    from memgnn.predictor.memory.onnx_model import load_default_model
    from memgnn.predictor.plan.search import PlanConfig, plan
    from memgnn.predictor.plan.space import SearchSpace, capture_spec, variants
    from memgnn.predictor.spec.devices import get_profile

    if args.batch is not None:
        raise UserError("plan searches the batch size: cap it with --max-batch N, not --batch")
    if args.mode == "power" and args.any_batch:
        raise UserError("--mode power finds powers of two only; --any-batch needs binsearch")
    any_batch = args.any_batch or args.mode == "binsearch"
    device = get_profile(args.device)
    limit = memory_limit(args, device, required=True)
    bundle = resolve_bundle(args)
    base = train_spec(args)
    sizes = bundle.sizes(parse_sizes(args))
    precisions = _csv(args.precision_choices, "--precision-choices") or [base.numerics.precision]
    for p in precisions:
        device.check_precision(p)
    space = SearchSpace(
        sizes={k: v for k, v in sizes.items() if k != "B"},
        max_batch=args.max_batch,
        grad_accum=_csv(args.accum_choices, "--accum-choices", int),
        checkpointing=_csv(args.checkpointing_choices, "--checkpointing-choices"),
        precision=precisions,
        effective_batch=args.effective_batch,
        mode="binsearch" if any_batch else "power",
        power_of_two=not any_batch,
        optimizer_impl=_csv(args.optimizer_impl_choices, "--optimizer-impl-choices"),
        sharding=_csv(args.sharding_choices, "--sharding-choices"),
        gpus=_csv(args.gpus_choices, "--gpus-choices", int),
    )
    cfg = PlanConfig(
        budget_bytes=limit.budget_bytes, device=device.name, metric=args.metric,
        threshold=limit.threshold,
    )  # fmt: skip
    if "B" not in bundle.dims:
        raise ValueError(f"model {bundle.name!r} has no batch dim B to plan")
    graph_for, seen = _counting(
        _graph_for(bundle, device, sizes, not args.no_cache, capture=args.capture)
    )
    target = "cuda" if device.is_gpu else "cpu"
    # blocks counted on the first graph the search captures (fake tensors: no weights built)
    first = capture_spec(variants(base, space)[0])
    info = _model_info(graph_for(first), bundle, first, target)
    exact = ReplayModel() if device.is_gpu else None  # decides the steps near the budget
    res = plan(
        load_default_model(), graph_for, base, space, cfg, n_blocks=info["blocks"], exact=exact
    )
    if res.best is None:
        raise UserError(res.reason)
    best = res.best
    picked = first.with_options(**_train_fields(best))
    chosen = capture_spec(picked)  # captured already
    out = {
        "batch_size": best.batch_size,
        "grad_accum": best.grad_accum,
        "checkpointing": best.checkpointing,
        "precision": best.precision,
        "optimizer_impl": best.optimizer_impl,
        "gpus": best.gpus,
        "sharding": best.sharding,
        "global_batch": best.batch_size * best.grad_accum * best.gpus,
        "decision": best.decision,
        "prediction": best.prediction,
        "budget_bytes": cfg.budget_bytes,
        "limit_bytes": cfg.limit,
        "threshold": cfg.threshold,
        "runners_up": [c.to_dict() for c in res.runners_up],
        "queries": res.queries,
        "variants": res.variants,
        "graphs": res.graphs,
        "graph_seconds": list(seen.values()),
        "model": _model_info(graph_for(chosen), bundle, chosen, target),
        "train": picked.to_dict(),  # the chosen step as the answer assumed it
    }
    if args.json:
        print(json.dumps(out, indent=2, default=str))
        return 0
    for line in decision_lines(out, cfg.limit):
        print(line)
    print(model_line(out["model"]))
    print(loop_line(chosen))
    for c in res.runners_up:
        where = f" {c.sharding} x{c.gpus}" if c.gpus > 1 else ""
        print(
            f"  then B={c.batch_size} G={c.grad_accum} {c.checkpointing} {c.precision} "
            f"{c.optimizer_impl}{where}: {fmt_bytes(c.bound_bytes)}"
        )
    print(
        f"searched {res.variants} configurations on {res.graphs} captured graphs "
        f"({sum(seen.values()):.1f} s to capture or load them), {res.queries} predictions"
    )
    return 0


def _train_fields(c: Any) -> dict[str, Any]:
    names = ("precision", "checkpointing", "optimizer_impl", "gpus", "sharding", "grad_accum")
    return {n: getattr(c, n) for n in (*names, "fsdp_reshard_after_forward")}


def _ckpt_text(ckpt: str, blocks: int | None) -> str:
    if ckpt == "none":
        return "no checkpointing"
    if ckpt == "full":
        return f"all {blocks} blocks checkpointed" if blocks else "every block checkpointed"
    n = int(ckpt.split(":", 1)[1])
    return f"{n} of {blocks} blocks checkpointed" if blocks else f"{n} blocks checkpointed"


def decision_lines(out: dict[str, Any], limit: int) -> list[str]:
    """The answer as the worked example reasons: state, per-sample bytes, largest batch,
    then the choice."""
    d = out["decision"]
    cats = d.get("state_by_category") or {}
    where = f" per rank ({out['sharding']} over {out['gpus']} GPUs)" if out["gpus"] > 1 else ""
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
    lines.append(
        f"chosen B={out['batch_size']}, G={out['grad_accum']}, "
        f"{_ckpt_text(out['checkpointing'], out['model'].get('blocks'))}, "
        f"{out['precision']}, optimizer {out['optimizer_impl']}"
        + (f", {out['sharding']} over {out['gpus']} GPUs" if out["gpus"] > 1 else "")
        + f" (global batch {out['global_batch']}): bound {fmt_bytes(p['upper_bound_bytes'])} "
        f"{p['metric']} ({p['method']})"
    )
    return lines
