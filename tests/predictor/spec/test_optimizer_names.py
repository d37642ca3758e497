"""Optimizer names a spec accepts (`predictor.spec.optimizer_names`): any torch.optim class by
name, the library optimizers, and a clear refusal for the rest."""

from __future__ import annotations

import re

import pytest
import torch
from memgnn.predictor.spec.optimizer_names import (
    LIBRARY_OPTIMIZERS,
    OPTIMIZER_PATTERN,
    check_optimizer,
    impl_support,
    torch_class,
)
from memgnn.predictor.spec.train import TrainSpec


@pytest.mark.parametrize("name", ["RMSprop", "NAdam", "Adagrad", "Adamax", "ASGD", "Rprop"])
def test_any_torch_optim_class_is_accepted_by_name(name):
    train = TrainSpec.of(optimizer=f"torch.optim.{name}")
    assert torch_class(train.optim.name) is getattr(torch.optim, name)
    assert re.match(OPTIMIZER_PATTERN, train.optim.name)


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("torch.optim.SparseAdam", "sparse gradients"),
        ("torch.optim.LBFGS", "closure"),
        ("torch.optim.Optimizer", "base class"),
        ("torch.optim.Adamm", "has no optimizer torch.optim.Adamm"),
        ("torch.optim.lr_scheduler", "has no optimizer"),
        ("keras.Adam", "unknown optimizer"),
    ],
)
def test_what_cannot_run_is_refused_naming_why(name, why):
    with pytest.raises(ValueError, match=why):
        TrainSpec.of(optimizer=name)


def test_implementations_come_from_the_class_itself():
    assert impl_support(torch.optim.AdamW) == (True, True)
    assert impl_support(torch.optim.NAdam) == (True, False)
    check_optimizer("torch.optim.NAdam", "foreach")
    with pytest.raises(ValueError, match="no fused implementation.*for-loop, foreach"):
        TrainSpec.of(optimizer="torch.optim.NAdam", optimizer_impl="fused")


@pytest.mark.parametrize("name", LIBRARY_OPTIMIZERS)
def test_library_optimizers_run_their_own_kernels(name):
    assert TrainSpec.of(optimizer=name).optim.name == name
    with pytest.raises(ValueError, match="own kernel: --optimizer-impl must be auto"):
        TrainSpec.of(optimizer=name, optimizer_impl="foreach")


def test_optimizer_in_backward_refuses_what_torchtune_refuses():
    assert TrainSpec.of(optimizer_in_bwd=True).optim.in_backward
    for bad, why in (
        ({"grad_accum": 2}, "no gradient accumulation"),
        ({"precision": "amp-fp16"}, "GradScaler"),
        ({"set_to_none": False}, "--zero-grad zero"),
        ({"offload_optimizer": "torchao"}, "pick one"),
    ):
        with pytest.raises(ValueError, match=why):
            TrainSpec.of(optimizer_in_bwd=True, **bad)


def test_an_unknown_name_points_at_the_classes_it_may_mean():
    with pytest.raises(ValueError, match=r"did you mean torch\.optim\.RMSprop\?"):
        TrainSpec.of(optimizer="rmsprop")
