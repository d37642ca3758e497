"""`memgnn predict`: a training step's peak memory, answered by the answer layer
(`predictor.answer.predict`) in this process or by a running service (`--url`): the same
JSON document either way."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from memgnn.cli.options import (
    add_cache_args,
    add_limit_args,
    add_query_args,
    device_name,
    explicit_train_options,
    memory_limit,
    model_ref,
    parse_sizes,
    run_config,
    train_spec,
)
from memgnn.cli.render import (
    compile_lines,
    config_lines,
    fmt_bytes,
    loop_line,
    model_line,
    verdict_line,
)
from memgnn.cli.snapshot import plot_prediction
from memgnn.predictor.answer.backend import CLI_REPLAY_BUDGET_MS, LocalBackend
from memgnn.predictor.answer.predict import predict
from memgnn.predictor.answer.types import PredictRequest, QueryConfig
from memgnn.predictor.ir.vocab import METHOD_CHOICES
from memgnn.predictor.spec.devices import DeviceProfile, get_profile
from memgnn.predictor.spec.train import TrainSpec
from memgnn.serving.client import remote_predict

__all__ = ["add_arguments", "predict_lines", "predict_request", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_query_args(p)
    p.add_argument("--url", default=None, help="ask a running `memgnn serve` instead")
    p.add_argument("--token", default=None, help="bearer token for --url")
    p.add_argument("--plot", default=None, help="also draw the simulated step (OUT.png|svg)")
    p.add_argument(
        "--method", choices=METHOD_CHOICES, default="auto",
        help="replay: the simulator's exact bytes; auto: replay within --replay-budget-ms",
    )  # fmt: skip
    p.add_argument(
        "--replay-budget-ms", type=float, default=None,
        help=f"auto's per-request budget (default {CLI_REPLAY_BUDGET_MS:g}: one answer per "
        "process, so loading the compiled core from numba's cache fits and compiling it does "
        "not; with --url the server's own default)",
    )  # fmt: skip
    add_limit_args(p, "a fits / does not fit verdict on the upper bound")
    p.add_argument("--json", action="store_true")
    add_cache_args(p)
    p.set_defaults(func=run)


def predict_request(args: argparse.Namespace, device: DeviceProfile) -> PredictRequest:
    """The answer layer's request for `memgnn predict`'s arguments (the limit checked
    first: a bad --budget fails before a capture)."""
    limit = memory_limit(args, device)
    limit_fields: dict[str, Any] = {}
    if limit is not None and limit.source == "threshold":
        limit_fields["threshold"] = limit.threshold
    elif limit is not None:
        limit_fields["budget"] = limit.budget_bytes
    return PredictRequest(
        model=model_ref(args),
        train=train_spec(args),
        run_config=run_config(args),
        explicit=frozenset(explicit_train_options(args)),
        configs=[
            QueryConfig(
                sizes=parse_sizes(args), device=device.name, metric=args.metric,
                scenario=args.scenario,
            )
        ],
        method=args.method,
        replay_budget_ms=args.replay_budget_ms,
        **limit_fields,
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    if args.url and args.plot:
        raise ValueError("--plot draws a local simulation; it cannot be used with --url")
    device = get_profile(device_name(args))
    req = predict_request(args, device)
    device.check_precision(req.train.numerics.precision)
    if args.url:
        out = remote_predict(args.url, req, token=args.token)
    else:
        backend = LocalBackend(use_cache=not args.no_cache, capture_mode=args.capture)
        out = predict(req, backend).predictions[0].to_dict()
    for w in out["warnings"]:
        print(f"memgnn predict: warning: {w}", file=sys.stderr)
    if out.get("config"):
        for w in out["config"]["warnings"]:
            print(f"memgnn predict: {out['config']['path']}: {w}", file=sys.stderr)
    if args.plot:
        graph = backend.entry(out["graph_id"]).graph
        title = (
            f"{out['model']['spec']} {out['sizes']} on {device.name}: predicted "
            f"{out['metric']} peak {fmt_bytes(out['predicted_peak_bytes'])} "
            f"({out['method']}, {out['model_version']})"
        )
        plot_prediction(args.plot, graph, out["sizes"], device, out, scenario=args.scenario,
                        title=title)  # fmt: skip
    if args.json:
        print(json.dumps(out, indent=2, default=str))
        return 0
    for line in predict_lines(out):
        print(line)
    return 0


def _ranks(par: dict[str, Any]) -> str:
    """How the ranks split: the sharding, and `tp N` (x `dp M` under a sharding) for --tp;
    `pp N` (x `fsdp dp M`, x `tp T`), the schedule and micro-batches for --pp."""
    tp, pp = par.get("tp", 1), par.get("pp", 1)
    if pp > 1:
        fsdp = f" x fsdp dp {par['dp']}" if par["sharding"] == "fsdp" else ""
        split = fsdp + (f" x tp {tp}" if tp > 1 else "")
        return f"pp {pp}{split}: {par['pp_schedule']}, {par['microbatches']} micro-batches"
    if tp == 1:
        return par["sharding"]
    if par["sharding"] == "none":
        return f"tp {tp}"
    return f"{par['sharding']} dp {par['dp']} x tp {tp}"


def predict_lines(out: dict[str, Any]) -> list[str]:
    """The text answer of `memgnn predict` from its JSON document."""
    par = out["breakdown"].get("parallel")
    name = out["model"]["spec"] if out["model"] else out["graph_id"]
    lines = [
        f"{name} {out['sizes']} on {out['device']}: {out['metric']} peak "
        f"{fmt_bytes(out['predicted_peak_bytes'])} (bound {fmt_bytes(out['upper_bound_bytes'])}),"
        f" model {out['model_version']} ({out['method']})"
        + (f", per rank (rank {par['rank']} of {par['world_size']}, {_ranks(par)})" if par else "")
    ]
    if par and "stage_peak_bytes" in par and any(len(s) > 1 for s in par["rank_stages"]):
        who = "rank" if par["world_size"] == par["pp"] else "pp rank"  # x fsdp / tp: stage k's
        lines.append("pipeline ranks: " + ", ".join(  # interleaved: the stages each holds
            f"{who} {k} (stages {', '.join(map(str, s))}) {fmt_bytes(b)}"
            + (" (worst)" if k == par["worst_stage"] else "")
            for k, (b, s) in enumerate(zip(par["stage_peak_bytes"], par["rank_stages"]))
        ))  # fmt: skip
    elif par and "stage_peak_bytes" in par:  # --pp: every stage, the worst named
        lines.append("pipeline stages: " + ", ".join(
            f"stage {k} {fmt_bytes(b)}" + (" (worst)" if k == par["worst_stage"] else "")
            for k, b in enumerate(par["stage_peak_bytes"])
        ))  # fmt: skip
    if out["model"]:
        lines.append(model_line(out["model"]))
    if out["train"]:
        lines.append(loop_line(TrainSpec.from_dict(out["train"])))
        lines += compile_lines(TrainSpec.from_dict(out["train"]))
    if route := out["breakdown"].get("route"):
        lines.append(f"path: {route['method']} ({route['reason']})")
    if cfg := out.get("config"):
        lines += config_lines(cfg)
    if out["verdict"] is not None:
        lines.append(verdict_line(out["verdict"], f"upper bound {out['metric']}"))
    return lines
