"""A model whose capture takes as long as asked (`py:slow_models:slow_bundle`), for the
service's capture timeouts, cancellation and shutdown tests. Its forward touches `marker`
(when given) as the capture starts, then sleeps."""

from __future__ import annotations

import time
from pathlib import Path

import torch
import torch.nn.functional as F
from memgnn.predictor.spec.bundle import ModelBundle
from torch import nn


class Sleepy(nn.Module):
    def __init__(self, seconds: float, marker: str):
        super().__init__()
        self.lin = nn.Linear(8, 4)
        self.seconds, self.marker = seconds, marker

    def forward(self, x):
        if self.marker:
            Path(self.marker).write_text("capturing")
        time.sleep(self.seconds)
        return self.lin(x)


def slow_bundle(seconds: str = "60", marker: str = "") -> ModelBundle:
    def make(sizes, device, dtype):
        return {
            "x": torch.randn(sizes["B"], 8, device=device, dtype=dtype),
            "y": torch.randint(0, 4, (sizes["B"],), device=device),
        }

    return ModelBundle(
        name="slow",
        family="mlp",
        build=lambda: Sleepy(float(seconds), marker),
        make_inputs=make,
        loss=lambda m, i: F.cross_entropy(m(i["x"]), i["y"]),
        dims={"B": 4},
        hparams={"seconds": seconds, "marker": marker},
    )
