"""A transformers.Trainer's own training step (`capture.hf_trainer`): captured on fake
tensors it equals the same Trainer's step run for real on the CPU, to the byte; the
Trainer's weights, optimizer and scheduler are left as they were; a Trainer over a meta
model (`no_weights`) is captured the same."""

from __future__ import annotations

import pytest
import torch
from memgnn.dataset.cpu_backend import profile_cpu
from memgnn.predictor.capture.hf_trainer import (
    TrainerStep,
    capture_trainer,
    fake_weights,
    no_weights,
    trainer_bundle,
)
from memgnn.predictor.memory.analytic import sweep
from memgnn.predictor.spec.train import TrainSpec
from tiny_models import tiny_llama_config

transformers = pytest.importorskip("transformers")

SIZES = {"B": 2, "S": 16}


def _trainer(tmp_path, *, meta: bool = False, accum: int = 2, checkpointing: bool = False):
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=SIZES["B"], report_to=[],
        use_cpu=True, gradient_accumulation_steps=accum,
        **({"activation_checkpointing": True} if checkpointing else {}),
    )  # fmt: skip
    torch.manual_seed(0)
    if meta:
        with no_weights():
            model = transformers.AutoModelForCausalLM.from_config(tiny_llama_config())
            return transformers.Trainer(model=model, args=args)
    model = transformers.AutoModelForCausalLM.from_config(tiny_llama_config())
    return transformers.Trainer(model=model, args=args)


def _real_step(trainer) -> dict:
    """The Trainer's step run for real under memgnn's CPU recorder."""
    runner = TrainerStep(trainer)
    try:
        with runner.prepared():
            return profile_cpu(trainer_bundle(trainer, SIZES), TrainSpec(), SIZES,
                               make_step=lambda t: runner.user_step(trainer.model, t))  # fmt: skip
    finally:
        runner.restore()


@pytest.mark.slow
def test_a_trainers_training_step_equals_a_real_cpu_step_to_the_byte(tmp_path):
    trainer = _trainer(tmp_path)
    weight = trainer.model.model.embed_tokens.weight
    graph = capture_trainer(trainer, sizes=SIZES, target="cpu")
    # the Trainer as it was: its own weights (real), no optimizer or scheduler made
    assert trainer.model.model.embed_tokens.weight is weight
    assert trainer.optimizer is None and trainer.lr_scheduler is None
    real = _real_step(trainer)
    swept = sweep(graph, SIZES)
    assert swept.peak_bytes == real["peak_allocated_bytes"] > 0
    assert swept.best.breakdown == real["breakdown"]["categories"]
    assert swept.best.phase_peaks == real["breakdown"]["tensor_phase_peaks"]
    # the Trainer's own pieces ran: two micro-steps (gradient_accumulation_steps=2), its
    # fused AdamW (args.optim's default), its clipping
    ops = list(graph.paths[0].nodes["op"])
    assert "_fused_adamw_.default" in ops
    assert any(op.startswith("_foreach_norm") for op in ops)
    assert set(graph.paths[0].nodes["micro"]) == {0, 1}
    meta = graph.meta["user_step"]["trainer"]
    assert meta["gradient_accumulation_steps"] == 2 and meta["optim"] == "adamw_torch_fused"


def test_a_trainer_over_a_meta_model_is_captured_as_one_with_weights(tmp_path):
    meta = _trainer(tmp_path / "meta", meta=True, accum=1)
    real = _trainer(tmp_path / "real", accum=1)
    assert next(meta.model.parameters()).is_meta
    got = sweep(capture_trainer(meta, sizes=SIZES, target="cpu"), SIZES)
    want = sweep(capture_trainer(real, sizes=SIZES, target="cpu"), SIZES)
    assert got.peak_bytes == want.peak_bytes and got.best.breakdown == want.best.breakdown
    params = sum(p.numel() * 4 for p in real.model.parameters())  # by hand: fp32, tied once
    assert want.best.breakdown["parameter"] >= params
    assert next(meta.model.parameters()).is_meta  # put back


def test_fake_weights_keeps_ties_and_puts_the_originals_back():
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    model = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10, bias=False))
    model[1].weight = model[0].weight  # tied
    model.register_buffer("scale", torch.ones(3))
    originals = [model[0].weight, model.scale]
    with FakeTensorMode(), fake_weights(model):
        assert isinstance(model[0].weight, FakeTensor)
        assert model[0].weight is model[1].weight and model[0].weight.requires_grad
        assert isinstance(model.scale, FakeTensor) and model.scale.shape == (3,)
    assert [model[0].weight, model.scale] == originals and model[1].weight is originals[0]


def test_a_trainer_given_its_own_optimizer_runs_that_one(tmp_path):
    args = transformers.TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True,
                                          per_device_train_batch_size=SIZES["B"])  # fmt: skip
    with no_weights():
        model = transformers.AutoModelForCausalLM.from_config(tiny_llama_config())
        sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        trainer = transformers.Trainer(model=model, args=args, optimizers=(sgd, None))
    graph = capture_trainer(trainer, sizes=SIZES, target="cpu")
    assert trainer.optimizer is sgd  # put back
    assert graph.meta["user_step"]["optimizer"] == "torch.optim.sgd.SGD"
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    # by hand: SGD with momentum keeps one buffer per parameter, nothing else
    assert sweep(graph, SIZES).best.breakdown["optimizer_state"] == params


@pytest.mark.slow
def test_a_trainers_activation_checkpointing_is_run_as_train_turns_it_on(tmp_path):
    trainer = _trainer(tmp_path / "ck", accum=1, checkpointing=True)
    graph = capture_trainer(trainer, sizes=SIZES, target="cpu")
    assert not trainer.model.is_activation_checkpointing  # off again, as it was
    assert graph.meta["user_step"]["trainer"]["activation_checkpointing"]
    real = _real_step(trainer)
    swept = sweep(graph, SIZES)
    assert swept.peak_bytes == real["peak_allocated_bytes"]
    assert swept.best.breakdown == real["breakdown"]["categories"]
    plain = sweep(capture_trainer(_trainer(tmp_path / "p", accum=1), sizes=SIZES, target="cpu"),
                  SIZES)  # fmt: skip
    assert swept.best.phase_peaks["forward"] < plain.best.phase_peaks["forward"]
