"""Does the model and optimizer the governor is given match what it predicts for?

The step graph is captured from the `ModelBundle` and the `TrainSpec`; a live module or
optimizer passed next to them must be the same training step, or every prediction is for
another one. `check_module` compares trainable parameters (count, shapes, dtypes) with the
bundle's model, built on the meta device (no memory). `check_optimizer` compares the
optimizer's class, its parameters and the hyperparameters that change its state memory
(SGD momentum buffers, Adam's amsgrad maximum, the multi-tensor/fused implementation) with
the TrainSpec's. A difference in what is stored raises `ValueError` naming it; one that only
changes transient memory (foreach vs for-loop) is a warning.
"""

from __future__ import annotations

import logging
from collections import Counter

import torch
from memgnn.predictor.spec.bundle import ModelBundle
from memgnn.predictor.spec.train import TrainSpec
from torch import nn

log = logging.getLogger(__name__)

__all__ = ["check_module", "check_optimizer"]

_CLASSES: dict[str, type[torch.optim.Optimizer]] = {
    "sgd": torch.optim.SGD,
    "adam": torch.optim.Adam,
    "adamw": torch.optim.AdamW,
    "adafactor": torch.optim.Adafactor,
}


def _signature(params: list[nn.Parameter]) -> Counter:
    return Counter((tuple(p.shape), p.dtype) for p in params)


def check_module(module: nn.Module, bundle: ModelBundle, train: TrainSpec) -> None:
    """ValueError if `module`'s trainable parameters are not the bundle model's."""
    with torch.device("meta"):
        reference = bundle.build().to(train.numerics.param_dtype)
    want = [p for p in reference.parameters() if p.requires_grad]
    have = [p for p in module.parameters() if p.requires_grad]
    n_want, n_have = sum(p.numel() for p in want), sum(p.numel() for p in have)
    if n_want != n_have or _signature(want) != _signature(have):
        extra = _signature(have) - _signature(want)
        missing = _signature(want) - _signature(have)
        raise ValueError(
            f"the module is not the model the governor predicts for ({bundle.name} "
            f"{bundle.hparams}): {n_have} trainable parameters in {len(have)} tensors, "
            f"expected {n_want} in {len(want)}; unexpected (shape, dtype) "
            f"{sorted(extra.elements())[:3]}, missing {sorted(missing.elements())[:3]}"
        )


def check_optimizer(optimizer: torch.optim.Optimizer, module: nn.Module, train: TrainSpec):
    """ValueError if `optimizer` keeps other state than the TrainSpec's optimizer would."""
    expected = _CLASSES.get(train.optim.name)
    name = expected.__name__ if expected is not None else "bitsandbytes' AdamW8bit"
    cls = type(optimizer)
    bnb = cls.__name__ == "AdamW8bit" and cls.__module__.startswith("bitsandbytes")
    if (cls is not expected) if expected else not bnb:
        raise ValueError(
            f"the optimizer is {type(optimizer).__name__}, but the governor predicts for "
            f"TrainSpec.of(optimizer={train.optim.name!r}) ({name}); its state memory "
            "differs: pass a TrainSpec with the optimizer you train with"
        )
    held = {id(p) for g in optimizer.param_groups for p in g["params"]}
    trainable = [p for p in module.parameters() if p.requires_grad]
    if held != {id(p) for p in trainable}:
        inside = sum(id(p) in held for p in trainable)
        raise ValueError(
            f"the optimizer holds {len(held)} parameter tensors, {inside} of the module's "
            f"{len(trainable)} trainable ones: the governor predicts for an optimizer over "
            "exactly the module's trainable parameters"
        )
    for group in optimizer.param_groups:
        if train.optim.name == "sgd" and not group.get("momentum"):
            raise ValueError(
                "SGD without momentum keeps no momentum buffers, but the governor's "
                "TrainSpec.of(optimizer='sgd') predicts them (momentum=0.9)"
            )
        if group.get("amsgrad"):
            raise ValueError(
                f"{type(optimizer).__name__}(amsgrad=True) keeps a third state tensor per "
                "parameter that the governor's prediction does not have"
            )
        impl = "fused" if group.get("fused") else "foreach" if group.get("foreach") else None
        if impl is None and group.get("foreach") is False:
            impl = "for-loop"
        if impl is not None and train.optim.impl not in ("auto", impl):
            log.warning(
                "the optimizer runs %s, the governor predicts TrainSpec.of(optimizer_impl=%r): "
                "its transient memory may differ",
                impl,
                train.optim.impl,
            )
            break
