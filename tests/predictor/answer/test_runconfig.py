"""A framework's config file as the request's model, training spec and sizes."""

from __future__ import annotations

import pytest
from memgnn.predictor.answer.runconfig import RunConfig, apply_run_config
from memgnn.predictor.answer.types import ModelRef
from memgnn.predictor.errors import UserError
from memgnn.predictor.spec.train import TrainSpec

AXOLOTL = """\
base_model: meta-llama/Llama-3.2-1B
adapter: lora
lora_r: 16
lora_alpha: 32
lora_dropout: 0.05
lora_target_modules: [q_proj, v_proj]
micro_batch_size: 2
gradient_accumulation_steps: 4
sequence_len: 1024
bf16: true
gradient_checkpointing: false
torch_compile: true
"""


def _read(text=AXOLOTL, **kw):
    rc = RunConfig(text=text, name="qlora.yml")
    defaults = {"model": None, "train": TrainSpec(), "explicit": frozenset(), "sizes": [{}]}
    return apply_run_config(rc, **(defaults | kw))


def test_the_file_states_the_model_the_options_and_the_sizes():
    model, spec, (sizes,), report = _read()
    assert model == ModelRef(spec="hf:meta-llama/Llama-3.2-1B")
    assert spec.changed() == {
        "precision": "bf16", "peft": "lora", "lora_r": 16, "lora_alpha": 32.0,
        "lora_dropout": 0.05, "lora_targets": "q_proj,v_proj", "grad_accum": 4,
        "optimizer_impl": "fused",  # axolotl's default optimizer: adamw_torch_fused
        "compile": "full",  # torch_compile: true (predictor.emulate.compile)
    }  # fmt: skip
    assert sizes == {"B": 2, "S": 1024}
    assert report.path == "qlora.yml" and report.format == "axolotl"
    assert {k["key"] for k in report.keys} >= {"base_model", "micro_batch_size", "lora_r"}
    assert not any(w.startswith("torch_compile") for w in report.warnings)  # now modelled


def test_explicit_choices_override_the_file_and_say_so():
    given = TrainSpec.of(grad_accum=8, precision="bf16", lora_r=4, peft="lora")
    model, spec, (sizes,), report = _read(
        model=ModelRef(spec="hf:meta-llama/Llama-3.2-3B"), train=given,
        explicit=frozenset({"grad_accum", "lora_r"}), sizes=[{"B": 1}],
    )  # fmt: skip
    assert (spec.loop.grad_accum, spec.adapter.r, spec.adapter.alpha) == (8, 4, 32.0)
    assert sizes == {"B": 1, "S": 1024} and model.spec == "hf:meta-llama/Llama-3.2-3B"
    joined = "\n".join(report.overrides)
    assert "--grad-accum 8 overrides the file's gradient_accumulation_steps: 4" in joined
    assert "--batch 1 overrides" in joined and "--model hf:meta-llama/Llama-3.2-3B" in joined


def test_a_file_without_a_model_needs_one_and_a_bad_file_is_named():
    with pytest.raises(UserError, match="names no model"):
        _read(text="micro_batch_size: 2\nsequence_len: 64\n")
    with pytest.raises(UserError, match="^qlora.yml: not valid YAML: line 2"):
        _read(text="base_model: [\n")
    with pytest.raises(UserError, match="a file name"):
        RunConfig(text="x: 1", name="../etc/passwd")
    with pytest.raises(UserError, match="path or a text"):
        RunConfig()
