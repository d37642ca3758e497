"""The answer for the user's own training step: `predict_step` and `predict_trainer`.

`predict_step(make_model, step_fn, make_batch, optimizer=..., sizes=..., device=...)`
captures the user's step function on fake tensors (`capture.user_step`: no weight is
built) and answers its graph through `answer.predict`, the same layer every other answer
comes from: on a GPU device the allocator simulator's exact replay (or the learned model
where the replay does not fit the budget), the bound, the breakdown; on `cpu` the liveness
sweep. `predict_trainer(trainer, sizes=...)` does the same for a `transformers.Trainer`'s
own `training_step` and the optimizer step its loop runs after it
(`capture.hf_trainer`).

Every answer says what it assumed: `train` describes the step that ran (the step
function, the optimizer, the loop, the sizes) and `breakdown["assumptions"]` lists what
memgnn took for granted (the sizes the capture holds at, values read from tensors).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from memgnn.predictor.answer.backend import Backend, LocalBackend
from memgnn.predictor.answer.predict import predict
from memgnn.predictor.answer.types import PredictAnswer, PredictRequest, QueryConfig
from memgnn.predictor.capture.query import unused_sizes
from memgnn.predictor.capture.user_step import MakeOptimizer, StepFn, capture_user_step
from memgnn.predictor.errors import UserError
from memgnn.predictor.ir.graph import StepGraph
from memgnn.predictor.spec.devices import get_profile

log = logging.getLogger(__name__)

__all__ = ["answer_graph", "predict_step", "predict_trainer", "step_assumptions"]


def _target(device: str) -> tuple[str, int]:
    try:
        profile = get_profile(device)
    except ValueError as exc:
        raise UserError(str(exc), loc=("device",)) from None
    return ("cuda" if profile.is_gpu else "cpu"), profile.sm or 80


def _check_sizes(sizes: Mapping[str, int]) -> dict[str, int]:
    if not sizes:
        raise UserError(
            "give the batch's sizes by name, e.g. sizes={'B': 8}: make_batch(**sizes) builds "
            "the batch",
            loc=("sizes",),
        )
    return dict(sizes)


def step_assumptions(graph: StepGraph) -> list[str]:
    """What an answer for a captured user step assumed (from the graph's meta)."""
    meta = graph.meta.get("user_step", {})
    sizes = ", ".join(f"{k}={v}" for k, v in meta.get("sizes", {}).items())
    out = [
        "the loop: step_fn(model, optimizer, make_batch(**sizes)) run twice (the first step, "
        "where optimizer state is created, and a steady one); each step's batch and return "
        "value dropped before the next",
        (
            f"sizes symbolic (traced at {sizes}): the graph holds where its guards do"
            if meta.get("symbolic")
            else f"captured at concrete sizes {sizes}: the answer is for these sizes only"
        ),
        "state alive before the first step: the model's parameters and buffers and the "
        "optimizer (tensors the model holds outside them are not counted until made in a step)",
    ]
    if meta.get("value_reads"):
        out.append(
            f"{meta['value_reads']} float read(s) of tensor values outside the optimizer step "
            "(e.g. loss.item()) taken as 0.0: values decide no sizes here"
        )
    if meta.get("trainer"):
        out.extend(meta["trainer"].get("assumptions", []))
    return out


def answer_graph(
    graph: StepGraph,
    *,
    sizes: Mapping[str, int],
    device: str,
    metric: str | None = None,
    method: str = "replay",
    budget: int | str | None = None,
    backend: Backend | None = None,
) -> PredictAnswer:
    """`answer.predict` for a captured user step, with its `train` and assumptions."""
    req = PredictRequest(
        graph=graph, configs=[QueryConfig(sizes=dict(sizes), device=device, metric=metric)],
        method=method, budget=budget,
    )  # fmt: skip
    answer = predict(req, backend or LocalBackend(use_cache=False))
    meta = graph.meta.get("user_step", {})
    train = {"step": "user"} | {k: v for k, v in meta.items() if k != "value_reads"}
    if "trainer" in train:
        train["trainer"] = {k: v for k, v in train["trainer"].items() if k != "assumptions"}
    notes = step_assumptions(graph)
    # a concrete capture's sizes reach no formula (they are fixed): no "unused size" warning
    fixed = set() if meta.get("symbolic") else set(unused_sizes(graph, list(sizes)))
    preds = [
        replace(
            a,
            train=train,
            warnings=[w for w in a.warnings if w not in fixed],
            breakdown={**a.breakdown, "assumptions": notes},
        )  # fmt: skip
        for a in answer.predictions
    ]
    return replace(answer, predictions=preds)


def predict_step(
    make_model: Callable[[], Any],
    step_fn: StepFn,
    make_batch: Callable[..., Any],
    *,
    optimizer: MakeOptimizer | None = None,
    sizes: Mapping[str, int],
    device: str = "h100-80gb",
    metric: str | None = None,
    method: str = "replay",
    budget: int | str | None = None,
    symbolic: bool = False,
    backend: Backend | None = None,
) -> PredictAnswer:
    """Peak memory of the user's own training step on `device` (see the module docstring).

    make_model(): builds the model (run on fake tensors: no weight is allocated), or a
    built model (its weights swapped for fake tensors during the capture, then put back);
    optimizer(params): builds the optimizer from the trainable parameters, e.g.
    `lambda params: torch.optim.AdamW(params, lr=1e-4)` (None: `step_fn` gets None);
    make_batch(**sizes): one step's batch, any structure of tensors;
    step_fn(model, optimizer, batch): one training step, written as for a real run
    (device-agnostic: the batch arrives on the model's device).
    `metric`, `method`, `budget` as `memgnn predict` takes them."""
    sizes = _check_sizes(sizes)
    target, sm = _target(device)
    graph = capture_user_step(
        make_model, step_fn, make_batch, optimizer, sizes=sizes, target=target, sm=sm,
        symbolic=symbolic,
    )  # fmt: skip
    return answer_graph(graph, sizes=sizes, device=device, metric=metric, method=method,
                        budget=budget, backend=backend)  # fmt: skip


def predict_trainer(
    trainer: Any,
    *,
    sizes: Mapping[str, int],
    make_batch: Callable[..., Any] | None = None,
    device: str = "h100-80gb",
    metric: str | None = None,
    method: str = "replay",
    budget: int | str | None = None,
    backend: Backend | None = None,
) -> PredictAnswer:
    """Peak memory of a `transformers.Trainer`'s own training step on `device`: its
    `training_step` (its `compute_loss`, its backward), gradient clipping, the optimizer
    and scheduler it creates, `model.zero_grad()` (`capture.hf_trainer`). The trainer's
    model is run on fake tensors of its parameters' shapes (its own weights are not
    touched: a Trainer built inside `capture.hf_trainer.no_weights()`, its model on the
    meta device, works). `make_batch(**sizes)`: one micro-batch (default: a causal-LM
    batch of `input_ids` and `labels` of shape (B, S), `capture.hf_trainer.token_batch`)."""
    from memgnn.predictor.capture.hf_trainer import capture_trainer

    sizes = _check_sizes(sizes)
    target, sm = _target(device)
    graph = capture_trainer(trainer, sizes=sizes, make_batch=make_batch, target=target, sm=sm)
    return answer_graph(graph, sizes=sizes, device=device, metric=metric, method=method,
                        budget=budget, backend=backend)  # fmt: skip
