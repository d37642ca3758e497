"""What-ifs for `memgnn explain`: each change answered by replay, not guessed.

Each `WhatIf` is one change to the run: a training option (checkpointing, an 8-bit
optimizer, another attention kernel, offloading), the batch split into more accumulation
steps (B/2 with twice the gradient accumulation: the same samples per optimizer step), or
an allocator setting (`expandable_segments:True`). A change to the run is answered by the
answer layer's own `predict` (captured, then replayed: the figure `memgnn predict
--method replay` with the same flags gives, to the byte); the allocator setting by
`predictor.sim.simulate.simulate` on the same graph with that `AllocatorConfig`. A change
that does not apply to the run (already so, or refused by the spec, the device or the
capture) is listed with why. The cost, where a prior exists (`predictor.plan.space`), is
the step time relative to the run as it is.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from memgnn.predictor.answer.predict import autocast_gather
from memgnn.predictor.answer.types import Answer, PredictRequest, QueryConfig
from memgnn.predictor.errors import UserError
from memgnn.predictor.plan.space import cost, offload_cost
from memgnn.predictor.sim.simulate import simulate
from memgnn.predictor.spec.devices import get_profile
from memgnn.predictor.spec.train import TrainSpec

__all__ = ["WHATIFS", "WhatIf", "run_whatifs"]

log = logging.getLogger(__name__)

WHATIFS = (
    "checkpointing",
    "accumulation",
    "optimizer_8bit",
    "attention",
    "expandable_segments",
    "offload_activations",
    "offload_optimizer",
    "fsdp_mixed_precision",
)


@dataclass(kw_only=True, slots=True)
class WhatIf:
    """One what-if's answer: the change (`options`: training options; `sizes`: the sizes
    it uses; `alloc_conf`: an allocator setting), the predicted peak in the base answer's
    metric, the bytes saved against it (negative: it costs memory), and the relative step
    cost where a prior exists (`cost_note` says which, or why none)."""

    name: str
    label: str
    options: dict[str, Any] = field(default_factory=dict)
    sizes: dict[str, int] | None = None
    alloc_conf: str | None = None
    predicted_peak_bytes: int = 0
    saved_bytes: int = 0
    saved_fraction: float = 0.0
    cost: float | None = None
    cost_note: str = ""
    method: str = "replay"
    graph_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


Predictor = Callable[[PredictRequest], Answer]


def _candidates(
    train: TrainSpec, sizes: dict[str, int], names: tuple[str, ...], attention: str | None
) -> list[tuple]:
    """(name, label, options, sizes, alloc_conf) of each what-if asked for, or (name, why)
    for one that does not apply (`attention`: the kernel the run resolved to)."""
    out: list[tuple] = []
    for name in names:
        if name == "checkpointing":
            if train.activations.checkpointing == "none":
                out.append((name, "activation checkpointing of every block",
                            {"checkpointing": "full"}, None, None))  # fmt: skip
            else:
                out.append((name, f"checkpointing is already {train.activations.checkpointing}"))
        elif name == "accumulation":
            b, g = sizes.get("B"), train.loop.grad_accum
            if b is None or b < 2 or b % 2:
                out.append((name, f"the batch (B={b}) does not split in two"))
            else:
                out.append((name, f"B={b // 2} with grad_accum={2 * g} (same samples per step)",
                            {"grad_accum": 2 * g}, sizes | {"B": b // 2}, None))  # fmt: skip
        elif name == "optimizer_8bit":
            if train.optim.name in ("adam", "adamw"):
                out.append((name, "bitsandbytes' AdamW8bit (8-bit optimizer states)",
                            {"optimizer": "adamw8bit"}, None, None))  # fmt: skip
            else:
                out.append((name, f"the optimizer is {train.optim.name}, not Adam/AdamW"))
        elif name == "attention":
            for kernel in ("eager", "sdpa", "flash"):
                if kernel not in (train.kernels.attention, attention):
                    out.append((f"attention:{kernel}", f"attention implementation {kernel}",
                                {"attention": kernel}, None, None))  # fmt: skip
        elif name == "expandable_segments":
            out.append((name, "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True", {}, None,
                        "expandable_segments:True"))  # fmt: skip
        elif name == "offload_activations":
            for kind in ("save_on_cpu", "torchtune"):
                if kind != train.offload.activations:
                    out.append((f"offload_activations:{kind}", f"activation offloading ({kind})",
                                {"offload_activations": kind}, None, None))  # fmt: skip
        elif name == "offload_optimizer":
            if train.offload.optimizer == "none":
                out.append((name, "torchao's CPUOffloadOptimizer (optimizer step on the CPU)",
                            {"offload_optimizer": "torchao"}, None, None))  # fmt: skip
            else:
                why = f"the optimizer is already offloaded ({train.offload.optimizer})"
                out.append((name, why))
        elif name == "fsdp_mixed_precision":
            out.append(_fsdp_mixed_precision(train))
        else:
            raise UserError(f"unknown what-if {name!r}; expected some of {WHATIFS}",
                            loc=("whatifs",))  # fmt: skip
    return out


def _fsdp_mixed_precision(train: TrainSpec) -> tuple:
    """FSDP2's MixedPrecisionPolicy (bf16/fp16 gathers, fp32 reduce: torchtitan's) in place
    of autocast alone, whose weight-cast cache holds every gathered weight's cast."""
    name = "fsdp_mixed_precision"
    low, why = autocast_gather(train)
    if low is None:
        return name, why
    return (name, f"FSDP2 MixedPrecisionPolicy(param_dtype={low}, reduce_dtype=fp32)",
            {"fsdp_param_dtype": low, "fsdp_reduce_dtype": "fp32"}, None, None)  # fmt: skip


def run_whatifs(
    base_req: PredictRequest, base: Answer, graph: Any, predict_one: Predictor, *,
    names: tuple[str, ...] = WHATIFS,
) -> tuple[list[WhatIf], list[dict[str, str]]]:  # fmt: skip
    """(the what-ifs answered, ranked by bytes saved; those that did not apply, with why).

    `base_req` is the request `base` answers (one config, method replay), `graph` its
    captured step, `predict_one` the answer layer's predict of one request."""
    train = base_req.train
    sizes = dict(base.sizes)
    config = base_req.configs[0]
    info = base.model or {}
    done: list[WhatIf] = []
    skipped: list[dict[str, str]] = []
    for cand in _candidates(train, sizes, names, info.get("attention")):
        if len(cand) == 2:
            skipped.append({"name": cand[0], "why": cand[1]})
            continue
        name, label, options, new_sizes, conf = cand
        w = WhatIf(name=name, label=label, options=options, sizes=new_sizes, alloc_conf=conf)
        try:
            if conf is not None:
                value = _allocator_value(graph, base, config, conf)
                w.graph_id = base.graph_id
            else:
                new_train = train.with_options(**options)
                one = replace(config, sizes=new_sizes or config.sizes)
                req = replace(base_req, train=new_train, configs=[one])
                got = predict_one(req)
                value, w.method, w.graph_id = got.predicted_peak_bytes, got.method, got.graph_id
                w.cost, w.cost_note = _cost(name, train, new_train, got, info)
        except (UserError, ValueError) as exc:
            if getattr(exc, "status", None) == 503:  # the request is over (cancelled, timed out)
                raise
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            skipped.append({"name": name, "why": first})
            continue
        except Exception as exc:  # a capture the change breaks: said, not fatal
            log.warning("what-if %s failed: %s", name, exc)
            skipped.append({"name": name, "why": f"{type(exc).__name__}: {exc}"[:300]})
            continue
        if conf is not None:
            w.cost_note = "no step cost: the allocator maps pages as it grows (a prior of 1.0)"
            w.cost = 1.0
        w.predicted_peak_bytes = value
        w.saved_bytes = base.predicted_peak_bytes - value
        w.saved_fraction = round(w.saved_bytes / base.predicted_peak_bytes, 6) if (
            base.predicted_peak_bytes
        ) else 0.0  # fmt: skip
        done.append(w)
    done.sort(key=lambda w: (-w.saved_bytes, w.name))
    return done, skipped


def _allocator_value(graph: Any, base: Answer, config: QueryConfig, conf: str) -> int:
    """The base metric of the same graph replayed under `conf` (the base answer's own
    settings otherwise: the device's usable memory as the capacity)."""
    device = get_profile(base.device)
    if not device.is_gpu:
        raise UserError("an allocator setting acts on a CUDA device only")
    from memgnn.predictor.snapshot.conf import allocator_config

    cfg = allocator_config(conf)
    res = simulate(graph, base.sizes, device, scenario=config.scenario, allocator=cfg)
    if res.stats.get("would_oom"):  # what the step needs, as the answer does
        res = simulate(
            graph, base.sizes, device, scenario=config.scenario, allocator=cfg.unlimited()
        )
    return int({"allocated": res.peak_allocated_bytes, "reserved": res.peak_reserved_bytes,
                "device_total": res.device_total_bytes}[base.metric])  # fmt: skip


def _cost(
    name: str, old: TrainSpec, new: TrainSpec, got: Answer, info: dict[str, Any]
) -> tuple[float | None, str]:
    blocks = info.get("blocks") or None
    if name == "checkpointing":
        rel = cost(new, blocks) / cost(old, blocks)
        return round(rel, 4), "recompute prior: a full extra forward ~ 1/3 of a step"
    if name.startswith("offload_activations"):
        kind = new.offload.activations
        host = int(got.breakdown.get("host_peak_bytes", 0))
        tokens = got.sizes.get("B", 1) * got.sizes.get("S", 1) * max(new.loop.grad_accum, 1)
        params = int(info.get("parameters") or 0)
        rel = offload_cost(kind, host, params, tokens)
        return round(rel, 4), (
            f"PCIe prior: {host} host bytes copied twice at 25 GB/s against 6*N*D FLOPs at "
            "40% of 312 TFLOP/s"
        )
    if name == "accumulation":
        return None, "no prior: the same samples per step in twice the micro-steps"
    return None, "no cost prior for this change"
