"""`FitConfig`: the training loop's settings, apart from the loop (`training.fit`).

A module of its own so that the `memgnn train` argument parser, which every `memgnn`
command builds, does not import torch-geometric (`training.fit` batches with it).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FitConfig"]


@dataclass(kw_only=True, slots=True)
class FitConfig:
    max_epochs: int = 30  # joint (encoder + head) epochs
    patience: int = 8
    head_epochs: int = 300  # then head-only epochs over the frozen encoder's embeddings
    head_patience: int = 40
    lr: float = 2e-3
    weight_decay: float = 1e-4
    graphs_per_batch: int = 8
    seed: int = 0
    target_miss: float = 0.01  # bound calibration: wanted miss rate on validation data
    threads: int = 0  # torch intra-op threads; 0: torch's default
    calibration_epochs: int = 60  # head epochs per fold of `calibrate.cross_fit`

    def __post_init__(self) -> None:
        if self.head_epochs < 0 or self.head_patience < 1 or self.threads < 0:
            raise ValueError("head_epochs and threads must be >= 0, head_patience >= 1")
        if self.max_epochs < 1 or self.patience < 1 or self.graphs_per_batch < 1:
            raise ValueError("max_epochs, patience and graphs_per_batch must be >= 1")
        if not self.lr > 0 or self.weight_decay < 0:
            raise ValueError("lr must be > 0 and weight_decay >= 0")
        if not 0.0 < self.target_miss < 0.5:
            raise ValueError(f"target_miss must be in (0, 0.5), got {self.target_miss}")
