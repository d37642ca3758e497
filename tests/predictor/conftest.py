"""Fixtures shared by the predictor tests."""

from __future__ import annotations

import pytest
from memgnn.predictor.capture import CaptureConfig, capture
from memgnn.predictor.graph import StepGraph
from memgnn.predictor.spec import TrainSpec


@pytest.fixture(scope="module")
def gpt_graph() -> StepGraph:
    """A tiny GPT training step captured symbolically (B, S) for a CUDA target."""
    from tests.conftest import tiny_gpt_bundle

    return capture(tiny_gpt_bundle(), TrainSpec(), CaptureConfig(target="cuda"))
