"""`GNNConfig`: the learned model's hyperparameters, apart from the model.

A module of its own so that what only needs the configuration (the `memgnn train`
argument parser, which every `memgnn` command builds) does not import torch-geometric,
which `predictor.memory.gnn` needs for its layers and which takes seconds to import.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["GNNConfig"]


@dataclass(kw_only=True, slots=True)
class GNNConfig:
    hidden: int = 32
    layers: int = 3
    op_dim: int = 8
    head_hidden: int = 128
    head_layers: int = 2
    dropout: float = 0.0
    quantile: float = 0.95
    use_graph: bool = True  # False: the head ignores the embedding (ablation)

    def __post_init__(self) -> None:
        for name in ("hidden", "op_dim", "head_hidden", "head_layers"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.layers < 0:
            raise ValueError(f"layers must be >= 0, got {self.layers}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if not 0.5 <= self.quantile < 1.0:
            raise ValueError(f"quantile must be in [0.5, 1), got {self.quantile}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
