"""Fixtures shared by the predictor tests."""

from __future__ import annotations

import pytest
from memgnn.predictor.capture.capture import CaptureConfig, capture
from memgnn.predictor.ir.graph import StepGraph
from memgnn.predictor.spec.bundle import ModelBundle
from memgnn.predictor.spec.train import TrainSpec
from tiny_models import tiny_hf_llama_bundle


@pytest.fixture(scope="module")
def gpt_graph() -> StepGraph:
    """A tiny GPT training step captured symbolically (B, S) for a CUDA target."""
    from tests.conftest import tiny_gpt_bundle

    return capture(tiny_gpt_bundle(), TrainSpec(), CaptureConfig(target="cuda"))


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> ModelBundle:
    """tests/tiny_models' tiny Llama as `hf:config.json`, one per test module (needs
    transformers: the modules using it skip without)."""
    return tiny_hf_llama_bundle(tmp_path_factory.mktemp("llama"))
