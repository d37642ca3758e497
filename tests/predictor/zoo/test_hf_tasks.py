"""The task a Hugging Face config trains as, and the class for it."""

from __future__ import annotations

import pytest

transformers = pytest.importorskip("transformers")

from memgnn.predictor.zoo.hf_tasks import infer_task, model_class  # noqa: E402


def test_the_architecture_names_the_task_and_the_class():
    llama = transformers.LlamaConfig(architectures=["LlamaForCausalLM"])
    assert infer_task(llama) == "causal-lm"
    assert model_class(llama, "causal-lm") is transformers.LlamaForCausalLM
    t5 = transformers.T5Config(architectures=["T5ForConditionalGeneration"])
    assert infer_task(t5) == "seq2seq"
    assert infer_task(transformers.BertConfig(architectures=["BertForMaskedLM"])) == "masked-lm"


def test_a_task_the_config_has_no_class_for_names_the_tasks_it_has():
    with pytest.raises(ValueError, match="tasks it supports: .*causal-lm"):
        model_class(transformers.LlamaConfig(), "image-cls")
