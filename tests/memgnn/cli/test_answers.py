"""Every answer names the model it is about; no command builds real weights to answer."""

from __future__ import annotations

import json
import textwrap

import pytest
from tiny_models import tiny_gpt2_config

from tests.memgnn.cli.clirun import run_cli

GUARDED = """
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor

from memgnn.predictor.spec.bundle import ModelBundle


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        return x + self.fc(x).relu()


def _build():
    probe = torch.empty(1)
    if not isinstance(probe, FakeTensor) and probe.device.type != "meta":
        raise RuntimeError("real weights built: this model's weights would not fit in RAM")
    return nn.Sequential(*(Block() for _ in range(3)))


def _inputs(sizes, device, dtype):
    return {"x": torch.randn(sizes["B"], 16, device=device, dtype=dtype)}


def factory():
    return ModelBundle(
        name="py:guarded_model:factory", family="guarded", build=_build, make_inputs=_inputs,
        loss=lambda model, inputs: model(inputs["x"]).sum(), dims={"B": 4},
    )
"""
PARAMS = 3 * (16 * 16 + 16)


@pytest.fixture
def guarded(tmp_path, monkeypatch):
    (tmp_path / "guarded_model.py").write_text(textwrap.dedent(GUARDED))
    monkeypatch.syspath_prepend(str(tmp_path))
    return "py:guarded_model:factory"


@pytest.mark.parametrize(
    "argv",
    [
        ["plan", "--budget", "1GiB", "--checkpointing-choices", "none,blocks:2"],
        ["predict", "--batch", "8"],
        ["profile", "--backend", "sim", "--batch", "8"],
    ],
)
def test_answers_never_build_real_weights_and_name_the_model(capsys, monkeypatch, guarded, argv):
    import memgnn.predictor.memory.analytic
    import memgnn.predictor.memory.onnx_model

    # the baseline answers: this is about what gets built, not the GNN's numbers
    monkeypatch.setattr(
        memgnn.predictor.memory.onnx_model,
        "load_default_model",
        memgnn.predictor.memory.analytic.AnalyticModel,
    )
    code, out, err = run_cli(capsys, *argv, "--model", guarded, "--device", "a100-80gb", "--json")
    assert code == 0, err
    model = json.loads(out)["model"]
    assert model["spec"] == guarded and model["module_class"] == "Sequential"
    assert model["parameters"] == PARAMS and model["param_dtype"] == "float32"
    assert model["blocks"] == 3 and model["kind"] == "py"
    code, out, err = run_cli(capsys, *argv, "--model", guarded, "--device", "a100-80gb")
    assert code == 0, err
    assert f"{PARAMS:,}" in out and "Sequential" in out and "float32" in out


def test_zoo_answer_says_it_is_a_small_zoo_config(capsys):
    code, out, _ = run_cli(capsys, "predict", "--model", "gpt2", "--batch", "2", "--seq", "16")
    assert code == 0
    assert "zoo config" in out and "2 layers" in out and "hidden 64" in out


def test_hub_config_dtype_does_not_decide_master_weights(capsys, tmp_path):
    pytest.importorskip("transformers")
    folder = tmp_path / "hub"
    config = tiny_gpt2_config(vocab=64, positions=32, torch_dtype="float16")
    config.save_pretrained(str(folder))
    assert "float16" in (folder / "config.json").read_text()
    argv = ["predict", "--model", f"hf:{folder}", "--batch", "2", "--seq", "16", "--json"]
    code, out, err = run_cli(capsys, *argv, "--precision", "amp-bf16", "--no-cache")
    assert code == 0, err
    answer = json.loads(out)
    model = answer["model"]
    assert model["param_dtype"] == "float32" and model["compute_dtype"] == "bfloat16"
    assert model["parameter_bytes"] == 4 * model["parameters"]
    code, out, err = run_cli(capsys, *argv, "--precision", "bf16", "--no-cache")
    assert json.loads(out)["model"]["param_dtype"] == "bfloat16"
