"""What the governor builds at start: the model on its device, the default optimizer, the
GradScaler when a precision needs one, and the corrected predictor.

A `ModelBundle` is built inside the device's context (so every parameter is on it and
counted); a live module is checked against its bundle (`serving.governor.checks`) and its
tensors registered with the device.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from memgnn.predictor.capture.step import build_optimizer
from memgnn.predictor.memory.base import MemoryModel
from memgnn.predictor.memory.onnx_model import load_default_model
from memgnn.predictor.spec.bundle import ModelBundle
from memgnn.predictor.spec.train import TrainSpec
from memgnn.serving.governor.checks import check_module
from memgnn.serving.governor.config import GovernorConfig
from memgnn.serving.governor.correction import GovernedPredictor, ResidualCorrector
from memgnn.serving.governor.devices import EmulatedDevice, GovernedDevice
from torch import nn

log = logging.getLogger(__name__)

__all__ = ["default_optimizer", "make_predictor", "make_scaler", "place_model"]


def place_model(
    model: ModelBundle | nn.Module,
    bundle: ModelBundle | None,
    device: GovernedDevice,
    train: TrainSpec,
) -> tuple[ModelBundle | None, nn.Module]:
    """(bundle, module in train mode on `device`)."""
    if isinstance(model, ModelBundle):
        bundle = model
        with device.context(), torch.device(device.torch_device):
            module = model.build()
            if any(p.dtype != train.numerics.param_dtype for p in module.parameters()):
                module = module.to(train.numerics.param_dtype)
    else:
        module = model
        if bundle is not None:
            check_module(module, bundle, train)
        device.register_module(module)
    module.train()
    return bundle, module


def default_optimizer(
    model: nn.Module, device: GovernedDevice, train: TrainSpec
) -> torch.optim.Optimizer:
    """The TrainSpec's optimizer over the trainable parameters, its state on `device`."""
    params = [p for p in model.parameters() if p.requires_grad]
    if (
        train.optim.name == "adamw8bit"
    ):  # predictor.emulate.optim8bit models memory only: train with bnb's
        try:
            from bitsandbytes.optim import AdamW8bit
        except ImportError as exc:
            raise ValueError(
                "TrainSpec.of(optimizer='adamw8bit') trains with bitsandbytes.optim.AdamW8bit: "
                "install bitsandbytes or pass your own optimizer"
            ) from exc
        with device.context():
            return AdamW8bit(params, lr=train.optim.lr)
    with device.context():
        return build_optimizer(params, train, device.target)


def make_scaler(device: GovernedDevice, train: TrainSpec, precisions: list[str]) -> Any:
    """A GradScaler when the TrainSpec or a precision the policy may pick needs one."""
    if not (train.numerics.uses_grad_scaler or "amp-fp16" in precisions):
        return None
    if isinstance(device, EmulatedDevice) and device.fake is not None:
        raise ValueError("a fake-executing device cannot run a GradScaler (fp16)")
    return torch.amp.GradScaler(device=device.torch_device.type)


def make_predictor(
    model: MemoryModel | None, device: GovernedDevice, config: GovernorConfig
) -> GovernedPredictor:
    """`model` (the shipped one when None), cached and corrected for `device`."""
    return GovernedPredictor(
        model or load_default_model(),
        device=device.profile,
        metric=config.metric,
        corrector=ResidualCorrector(config.corrector),
        margin=config.margin,
        scenario=config.scenario,
        scale=device.byte_scale,
    )
