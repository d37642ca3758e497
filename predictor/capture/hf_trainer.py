"""A `transformers.Trainer`'s own training step, captured as the user's step (`user_step`).

What runs is the Trainer's code, one optimizer step of its loop (`Trainer._inner_training_loop`
/ `_run_epoch`): `get_batch_samples` (the `gradient_accumulation_steps` micro-batches
fetched up front and the loss's item count), `training_step(model, inputs,
num_items_in_batch)` per micro-batch (its `compute_loss`, its autocast, its
`accelerator.backward`), gradient clipping at `max_grad_norm` through the accelerator, the
optimizer and scheduler its own `create_optimizer` / `create_scheduler` build,
`lr_scheduler.step()`, `model.zero_grad()`; and what `train()` does to the model first
that the step depends on, activation checkpointing (`TrainerStep.prepared`). Logging,
callbacks and the loss accumulator (`_tr_loss`, a 0-d tensor) are left out; NEFTune,
Liger and torch.compile are not run (the assumptions say so where they are set).

The Trainer's model is run on fake tensors of its parameters' and buffers' shapes
(`fake_weights`, swapped in for the capture and back after): its own weights are never
read, so a Trainer whose model was built on the meta device (`no_weights`) is captured
the same as one with real weights; nothing is allocated. The Trainer's optimizer
and scheduler are made for the capture and its own (None before `train()`) put back.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from memgnn.predictor.capture.user_step import (
    UserStep,
    capture_user_step,
    fake_weights,
    user_bundle,
)
from memgnn.predictor.errors import UserError
from torch import nn

log = logging.getLogger(__name__)

__all__ = [
    "TrainerStep",
    "capture_trainer",
    "fake_weights",
    "no_weights",
    "token_batch",
    "trainer_bundle",
]


@contextlib.contextmanager
def no_weights() -> Iterator[None]:
    """Build a model and its Trainer without weights: modules made inside put their
    parameters and buffers on the meta device (`torch.device("meta")`), and a Trainer made
    inside does not move its model to its device (a meta tensor has no data to copy).

        with no_weights():
            model = AutoModelForCausalLM.from_config(config)
            trainer = Trainer(model=model, args=args)
    """
    import transformers

    move = transformers.Trainer._move_model_to_device

    def keep_on_meta(self: Any, model: nn.Module, device: Any) -> None:
        if any(p.is_meta for p in model.parameters()):
            return
        move(self, model, device)

    transformers.Trainer._move_model_to_device = keep_on_meta
    try:
        with torch.device("meta"):
            yield
    finally:
        transformers.Trainer._move_model_to_device = move


def token_batch(vocab_size: int, *, attention_mask: bool = False) -> Callable[..., Any]:
    """A causal-LM micro-batch of shape (B, S): `input_ids` and `labels` (a full batch,
    no padding); `attention_mask=True` adds a mask, which transformers cannot see is all
    ones on fake tensors: the capture then builds the padded batch's 4-D mask (a real
    step skips it when the mask is all ones)."""

    def make(B: int, S: int) -> dict[str, torch.Tensor]:  # noqa: N803 - the sizes' names
        ids = torch.randint(0, vocab_size, (B, S))
        batch = {"input_ids": ids, "labels": ids.clone()}
        if attention_mask:
            batch["attention_mask"] = torch.ones(B, S, dtype=torch.long)
        return batch

    return make


def _checkpointing_on(model: nn.Module) -> bool:
    """Whether transformers' activation checkpointing is on (5.x's name, else 4.x's)."""
    if hasattr(type(model), "is_activation_checkpointing"):
        return bool(model.is_activation_checkpointing)
    return bool(getattr(model, "is_gradient_checkpointing", False))


class TrainerStep:
    """`trainer`'s step as `UserStep` runs one (see the module docstring): `make_batch`
    (the micro-batches), `make_optimizer` (the Trainer's own), `step_fn`; `restore()`
    puts the Trainer's optimizer, scheduler and accumulation count back."""

    def __init__(self, trainer: Any, make_batch: Callable[..., Any] | None = None):
        self.trainer = trainer
        self.accum = max(int(trainer.args.gradient_accumulation_steps), 1)
        if make_batch is None:
            vocab = getattr(getattr(trainer.model, "config", None), "vocab_size", None)
            if not isinstance(vocab, int):
                raise ValueError(
                    "the Trainer's model has no config.vocab_size: give make_batch(**sizes)"
                )
            make_batch = token_batch(vocab)
        self.micro_batch = make_batch
        keep = ("optimizer", "lr_scheduler", "current_gradient_accumulation_steps")
        self._saved = {k: getattr(trainer, k, None) for k in keep}
        self.fakes: dict[int, Any] = {}  # id(weight) -> the capture's fake (`fake_weights`)
        self.checkpointing = False  # turned on for the step as train() would (`prepared`)

    @contextlib.contextmanager
    def prepared(self) -> Iterator[None]:
        """What `Trainer.train()` does to the model before its loop and the step depends
        on: activation checkpointing at `args.activation_checkpointing` (4.x:
        `gradient_checkpointing`), with its kwargs, `every_n_layers` and `offload`, as
        `train()` calls it; turned off again after (the model as it was)."""
        args, model = self.trainer.args, self.trainer.model
        on = getattr(args, "activation_checkpointing", None)
        if on is None:
            on = getattr(args, "gradient_checkpointing", False)
        was = bool(_checkpointing_on(model))
        if not on or was:
            yield
            return
        kwargs = dict(getattr(args, "activation_checkpointing_kwargs", None)
                      or getattr(args, "gradient_checkpointing_kwargs", None) or {})  # fmt: skip
        every, offload = kwargs.pop("every_n_layers", 1), kwargs.pop("offload", False)
        enable = getattr(model, "activation_checkpointing_enable", None)
        if enable is not None:
            enable(activation_checkpointing_kwargs=kwargs or None, every_n_layers=every,
                   offload=offload)  # fmt: skip
            disable = model.activation_checkpointing_disable
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs or None)
            disable = model.gradient_checkpointing_disable
        self.checkpointing = True
        try:
            yield
        finally:
            disable()

    def restore(self) -> None:
        for k, v in self._saved.items():
            setattr(self.trainer, k, v)

    def make_batch(self, **sizes: int) -> list[Any]:
        """The loop's `get_batch_samples`: every micro-batch of the step, fetched first."""
        return [self.micro_batch(**sizes) for _ in range(self.accum)]

    def make_optimizer(self, params: list[nn.Parameter]) -> torch.optim.Optimizer:
        """The Trainer's optimizer: the one it was given (`optimizers=(opt, sched)`),
        rebuilt with the same class and param groups over the captured weights, else
        what its `create_optimizer` makes; and its `create_scheduler`'s scheduler."""
        trainer = self.trainer
        given = self._saved["optimizer"]
        trainer.optimizer = trainer.lr_scheduler = None
        if given is not None:
            trainer.optimizer = self._rebuild(getattr(given, "optimizer", given))
        optimizer = trainer.create_optimizer()
        trainer.create_scheduler(num_training_steps=2, optimizer=optimizer)
        return optimizer

    def _rebuild(self, given: Any) -> Any:
        fakes = self.fakes
        groups = [
            {k: v for k, v in g.items() if k != "params"}
            | {"params": [fakes.get(id(p), p) for p in g["params"]]}
            for g in given.param_groups
        ]
        try:
            return type(given)(groups)
        except (TypeError, ValueError) as exc:
            raise UserError(
                f"the Trainer's own optimizer {type(given).__name__} cannot be rebuilt from its "
                f"param groups ({exc}): give the Trainer optimizer_cls_and_kwargs or args.optim"
            ) from exc

    def step_fn(self, model: nn.Module, optimizer: Any, batches: list[Any]) -> torch.Tensor:
        trainer = self.trainer
        trainer.current_gradient_accumulation_steps = len(batches)
        get = getattr(trainer, "get_batch_samples", None)
        items = None
        if get is not None:
            batches, items = get(iter(batches), len(batches), trainer.args.device)
        loss = None
        for inputs in batches:
            loss = trainer.training_step(model, inputs, items)
        if trainer.args.max_grad_norm and trainer.args.max_grad_norm > 0:
            trainer.accelerator.clip_grad_norm_(model.parameters(), trainer.args.max_grad_norm)
        optimizer.step()
        trainer.lr_scheduler.step()
        model.zero_grad()
        assert loss is not None
        return loss

    def user_step(self, model: nn.Module, target: str) -> UserStep:
        """A `UserStep` running this step on `model` (real or fake weights)."""
        return UserStep(model, self.step_fn, self.make_batch, self.make_optimizer,
                        device=torch.device("cpu"), target=target)  # fmt: skip


@contextlib.contextmanager
def _faked(runner: TrainerStep, model: nn.Module) -> Iterator[None]:
    with fake_weights(model) as fakes, runner.prepared():
        runner.fakes = fakes
        yield


def _assumptions(trainer: Any, runner: TrainerStep) -> list[str]:
    args, accum = trainer.args, runner.accum
    optim = getattr(args.optim, "value", args.optim)
    return [
        f"one optimizer step of the Trainer's loop: {accum} x training_step, clip_grad_norm_ "
        f"at max_grad_norm={args.max_grad_norm}, optimizer.step (args.optim={optim}), "
        "lr_scheduler.step, model.zero_grad; logging, callbacks and the loss accumulator "
        "left out",
        "the step's micro-batches are on the device from its start (get_batch_samples "
        "fetches them all first; a GPU run copies each in training_step)",
    ] + [
        "activation checkpointing on, as Trainer.train() turns it on "
        "(args.activation_checkpointing, its kwargs)"
    ] * runner.checkpointing + [
        f"args.{name} is set: {what} not run by the capture"
        for name, what in (("neftune_noise_alpha", "NEFTune's embedding noise hook"),
                           ("use_liger_kernel", "Liger's kernel patches"),
                           ("torch_compile", "torch.compile"))
        if getattr(args, name, None)
    ]  # fmt: skip


def capture_trainer(
    trainer: Any,
    *,
    sizes: Mapping[str, int],
    make_batch: Callable[..., Any] | None = None,
    target: str = "cuda",
    sm: int = 80,
) -> Any:
    """Capture `trainer`'s own training step on fake tensors (a `StepGraph`; module
    docstring). `make_batch(**sizes)`: one micro-batch (default `token_batch`)."""
    runner = TrainerStep(trainer, make_batch)
    model = trainer.model
    name = type(model).__name__
    try:
        graph = capture_user_step(
            model, runner.step_fn, runner.make_batch, runner.make_optimizer, sizes=sizes,
            target=target, sm=sm, name=f"{type(trainer).__name__}:{name}",
            prepare=lambda: _faked(runner, model),
        )  # fmt: skip
    finally:
        runner.restore()
    graph.meta["user_step"]["step_fn"] = f"{type(trainer).__module__}.{type(trainer).__name__}"
    graph.meta["user_step"]["trainer"] = {
        "gradient_accumulation_steps": runner.accum,
        "activation_checkpointing": runner.checkpointing,
        "optim": str(getattr(trainer.args.optim, "value", trainer.args.optim)),
        "max_grad_norm": trainer.args.max_grad_norm,
        "assumptions": _assumptions(trainer, runner),
    }
    return graph


def trainer_bundle(trainer: Any, sizes: Mapping[str, int]) -> Any:
    """The bundle naming `trainer`'s step (for the CPU recorder, as capture names it)."""
    return user_bundle(
        trainer.model, sizes, f"{type(trainer).__name__}:{type(trainer.model).__name__}"
    )
