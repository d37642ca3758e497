import json

import pytest
from clirun import run_cli

from memgnn.cli import main


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


def test_profile_json_has_contract_fields(capsys):
    code, text, _ = run_cli(
        capsys, "profile", "--model", "mlp", "--batch", "8", "--device", "a100-80gb", "--json"
    )
    rec = json.loads(text)
    assert code == 0
    for key in (
        "peak_allocated_bytes",
        "peak_reserved_bytes",
        "device_total_bytes",
        "breakdown",
        "backend",
        "device",
    ):
        assert key in rec
    assert rec["peak_reserved_bytes"] >= rec["peak_allocated_bytes"] > 0
    assert rec["device_total_bytes"] > rec["peak_reserved_bytes"]
    code, text, _ = run_cli(capsys, "profile", "--model", "mlp", "--backend", "cpu", "--json")
    rec = json.loads(text)
    assert rec["peak_reserved_bytes"] is None and rec["device"] == "cpu"


def test_predict_through_a_running_service(tmp_path, capsys):
    from memgnn.serving.client import local_server
    from memgnn.serving.config import ServeConfig

    cfg = ServeConfig(model="analytic", state_dir=tmp_path)
    with local_server(cfg) as url:
        code, text, err = run_cli(
            capsys,
            "predict",
            "--url",
            url,
            "--model",
            "mlp",
            "--batch",
            "8",
            "--device",
            "a100-80gb",
        )
    assert code == 0, err
    remote = json.loads(text)
    code, text, _ = run_cli(
        capsys, "predict", "--model", "mlp", "--batch", "8", "--device", "a100-80gb", "--json"
    )
    local = json.loads(text)
    assert remote["metric"] == local["metric"] == "reserved"
    assert remote["predicted_peak_bytes"] > 0


def test_models_lists_catalog_counts_and_checks_them(capsys):
    pytest.importorskip("transformers")
    assert main(["models", "opt-125m", "pythia-70m", "--check", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert set(rows) == {"facebook/opt-125m", "EleutherAI/pythia-70m"}
    assert rows["facebook/opt-125m"]["params"] == 125_239_296
    assert rows["facebook/opt-125m"]["class"] == "OPTForCausalLM"
    assert all(r["params_match"] for r in rows.values())
    assert main(["models", "no-such-model"]) == 2
    assert "no catalog model matches" in capsys.readouterr().err


def test_predict_qlora_with_8bit_adamw(capsys):
    argv = ["predict", "--model", "mlp", "--peft", "lora", "--lora-targets", "linear"]
    argv += ["--optimizer", "adamw8bit", "--device", "a10g-24gb", "--json"]
    code, text, _ = run_cli(capsys, *argv, "--quantize-base", "nf4")
    assert code == 0
    nf4 = json.loads(text)
    code, text, _ = run_cli(capsys, *argv)
    plain = json.loads(text)
    assert nf4["model"]["module_class"] == "MLP + LoRA r=8 on nf4"
    assert nf4["model"]["parameters"] == plain["model"]["parameters"]
    cats = nf4["breakdown"]["categories"], plain["breakdown"]["categories"]
    assert cats[0]["parameter"] < cats[1]["parameter"]  # 4-bit base weights
    assert cats[0]["optimizer_state"] == cats[1]["optimizer_state"]  # same adapters


def test_one_shot_predict_replays_through_a_cached_jit_load(capsys, monkeypatch):
    """A CLI answer pays the compiled core's load from numba's cache (it is one answer per
    process); the server's per-request 250 ms does not, and a compile does not either."""
    import memgnn.predictor.answer.exact as exact

    argv = ["predict", "--model", "mlp", "--batch", "8", "--device", "a100-80gb", "--json"]
    for state, budget, method in [
        ("cached", [], "replay"),
        ("cached", ["--replay-budget-ms", "250"], "gnn"),
        ("cold", [], "gnn"),
    ]:
        monkeypatch.setattr(exact, "jit_state", lambda state=state: state)
        code, out, err = run_cli(capsys, *argv, *budget)
        assert code == 0, err
        route = json.loads(out)["breakdown"]["route"]
        assert route["method"] == method and route["jit"] == state, route


def test_predict_lora_dtype_model_keeps_adapters_in_the_model_dtype(capsys):
    argv = ["predict", "--model", "mlp", "--peft", "lora", "--lora-targets", "linear"]
    argv += ["--precision", "bf16", "--device", "cpu", "--json"]
    code, text, _ = run_cli(capsys, *argv)
    assert code == 0
    fp32 = json.loads(text)["breakdown"]["categories"]
    assert json.loads(text)["train"]["lora_dtype"] == "fp32"  # the answer says what it assumed
    code, text, _ = run_cli(capsys, *argv, "--lora-dtype", "model", "--hold-outputs")
    assert code == 0
    model = json.loads(text)["breakdown"]["categories"]
    assert model["parameter"] < fp32["parameter"]  # bf16 adapters, not fp32
    assumed = json.loads(text)["train"]
    assert assumed["lora_dtype"] == "model" and assumed["hold_outputs"] is True
    code, _, err = run_cli(capsys, "predict", "--model", "mlp", "--lora-dtype", "model")
    assert code == 2 and "--lora-dtype model applies to --peft lora" in err
    code, text, _ = run_cli(capsys, *argv[:-1])
    assert code == 0 and "loop: outputs freed with the forward" in text
    code, text, _ = run_cli(capsys, *argv[:-1], "--hold-outputs")
    assert code == 0 and "loop: keeps each step's outputs" in text


def test_model_line_says_when_blocks_were_replicated():
    from memgnn.display import model_line

    info = {"spec": "hf:x", "module_class": "LlamaForCausalLM", "layers": 32,
            "parameters": 10, "param_dtype": "bfloat16", "precision": "bf16"}  # fmt: skip
    assert "repeated blocks" not in model_line(info)
    how = {"mode": "blocks", "captured_blocks": 4, "blocks": 32}
    assert "repeated blocks (32 replicated from a 4-block capture)" in model_line(
        info | {"capture": how}
    )
    assert "repeated" not in model_line(info | {"capture": {"mode": "full", "why": "x"}})
