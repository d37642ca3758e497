"""`memgnn capture` and `graph-info`: a captured file round trip, and bad input."""

import json

import pytest

from memgnn.cli import main
from tests.memgnn.cli.clirun import run_cli


def test_capture_and_graph_info_roundtrip(tmp_path, capsys):
    out = tmp_path / "mlp.json.gz"
    code, text, _ = run_cli(capsys, "capture", "--model", "mlp", "--batch", "4", "-o", str(out))
    assert code == 0 and out.exists() and "graph id" in text
    code, text, _ = run_cli(capsys, "graph-info", str(out), "--json")
    info = json.loads(text)
    assert code == 0 and info["paths"][0]["nodes"] > 10
    assert "B" in info["paths"][0]["bytes_by_category"]["activation"]
    code, text, _ = run_cli(capsys, "graph-info", str(out))
    assert code == 0 and "optimizer_state" in text


@pytest.mark.parametrize(
    "argv, message",
    [
        (["capture", "--model", "nosuchmodel", "-o", "x"], "nosuchmodel"),
        (
            ["capture", "--model", "hf:/nonexistent/config.json", "--task", "causal-lm", "-o", "x"],
            "/nonexistent/config.json",
        ),
        (["capture", "--model", "mlp", "--batch", "-3", "-o", "x"], "size B must be >= 1"),
        (["capture", "--model", "mlp", "--seq", "128", "-o", "x"], "'S' is not an input dim"),
        (["capture", "--model", "mlp", "--dim", "Q=3", "-o", "x"], "'Q' is not an input dim"),
        (["profile", "--model", "mlp", "--batch", "0"], "size B must be >= 1"),
        (
            ["profile", "--model", "mlp", "--device", "v100-16gb", "--precision", "amp-bf16"],
            "no bfloat16",
        ),
        (["profile", "--model", "mlp", "--device", "tpu-v9"], "unknown device profile"),
        (["graph-info", "/nonexistent.json.gz"], "not found"),
        (["predict", "--model", "mlp", "--quantize-base", "nf4"], "needs --peft lora"),
        (["predict", "--model", "mlp", "--bnb-version", "0.42.0"], "applies to --quantize-base"),
        (
            ["profile", "--model", "mlp", "--peft", "lora", "--lora-targets", "linear"]
            + ["--quantize-base", "nf4", "--backend", "cpu"],
            "--quantize-base nf4 (QLoRA) models bitsandbytes' CUDA kernels",
        ),
        (
            ["predict", "--model", "mlp", "--optimizer", "adamw8bit", "--device", "cpu"],
            "--optimizer adamw8bit models bitsandbytes' CUDA kernel",
        ),
    ],
)
def test_bad_input_exits_nonzero_with_one_line(capsys, argv, message):
    code, _, err = run_cli(capsys, *argv)
    assert code == 2
    lines = [ln for ln in err.strip().splitlines() if ln.startswith("memgnn")]
    assert len(lines) == 1 and message in lines[0], err


def test_unknown_optimizer_is_rejected_naming_the_close_ones(capsys):
    # --optimizer takes any torch.optim class by name: the spec refuses what is unknown
    assert main(["profile", "--model", "mlp", "--optimizer", "lion"]) == 2
    err = capsys.readouterr().err
    assert "unknown optimizer 'lion' (did you mean bnb.Lion or lion_pytorch.Lion?)" in err
