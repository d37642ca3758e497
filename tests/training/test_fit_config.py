"""FitConfig validation."""

from __future__ import annotations

import pytest
from memgnn.training.fit_config import FitConfig


@pytest.mark.parametrize(
    "bad",
    [{"max_epochs": 0}, {"patience": 0}, {"graphs_per_batch": 0}, {"head_epochs": -1},
     {"head_patience": 0}, {"threads": -1}, {"lr": 0.0}, {"weight_decay": -1.0},
     {"target_miss": 0.5}],
)  # fmt: skip
def test_bad_settings_are_refused(bad):
    with pytest.raises(ValueError):
        FitConfig(**bad)


def test_defaults_are_valid():
    assert FitConfig().graphs_per_batch == 8
