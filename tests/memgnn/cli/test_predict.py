"""`memgnn predict`: the answer document, local and through the service."""

import json

from tests.memgnn.cli.clirun import run_cli


def test_predict_prints_the_same_document_with_and_without_url(tmp_path, capsys):
    """One answer layer: the service's answer is the document the CLI prints locally, key
    for key and byte for byte (but the seconds it took and the route's cost estimate)."""
    from memgnn.serving.client import local_server
    from memgnn.serving.config import ServeConfig

    argv = ["predict", "--model", "mlp", "--batch", "8", "--device", "a100-80gb"]
    argv += ["--precision", "bf16", "--method", "analytic", "--threshold", "0.5", "--json"]
    with local_server(ServeConfig(model="analytic", state_dir=tmp_path)) as url:
        code, text, err = run_cli(capsys, *argv, "--url", url)
    assert code == 0, err
    remote = json.loads(text)
    code, text, err = run_cli(capsys, *argv)
    assert code == 0, err
    local = json.loads(text)
    assert sorted(remote) == sorted(local)
    for doc in (remote, local):
        del doc["predict_seconds"], doc["breakdown"]["route"]
    assert remote == local
    assert local["train"]["numerics"]["precision"] == "bf16" and local["verdict"]["fits"]


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
    assert (
        json.loads(text)["train"]["adapter"]["dtype"] == "fp32"
    )  # the answer says what it assumed
    code, text, _ = run_cli(capsys, *argv, "--lora-dtype", "model", "--hold-outputs")
    assert code == 0
    model = json.loads(text)["breakdown"]["categories"]
    assert model["parameter"] < fp32["parameter"]  # bf16 adapters, not fp32
    assumed = json.loads(text)["train"]
    assert assumed["adapter"]["dtype"] == "model" and assumed["loop"]["hold_outputs"] is True
    code, _, err = run_cli(capsys, "predict", "--model", "mlp", "--lora-dtype", "model")
    assert code == 2 and "--lora-dtype model applies to --peft lora" in err
    code, text, _ = run_cli(capsys, *argv[:-1])
    assert code == 0 and "loop: outputs freed with the forward" in text
    code, text, _ = run_cli(capsys, *argv[:-1], "--hold-outputs")
    assert code == 0 and "loop: keeps each step's outputs" in text


def test_a_framework_config_file_is_the_run_with_and_without_url(tmp_path, capsys):
    """`--config FILE` (an axolotl YAML naming a local model): the answer lists what each
    key became, a flag given overrides the file and says so, and the service gives the
    same document from the file's text."""
    from memgnn.serving.client import local_server
    from memgnn.serving.config import ServeConfig
    from tiny_models import tiny_hf_llama_bundle

    tiny_hf_llama_bundle(tmp_path)  # writes tmp_path/config.json
    cfg = tmp_path / "lora.yml"
    cfg.write_text(
        f"base_model: {tmp_path}/config.json\nadapter: lora\nlora_r: 4\nlora_alpha: 8\n"
        "lora_target_modules: [q_proj, v_proj]\nmicro_batch_size: 2\nsequence_len: 32\n"
        "gradient_accumulation_steps: 4\nwandb_project: demo\n"
    )
    argv = ["predict", "--config", str(cfg), "--grad-accum", "2", "--device", "a100-80gb"]
    argv += ["--method", "analytic", "--json"]
    code, text, err = run_cli(capsys, *argv)
    assert code == 0, err
    local = json.loads(text)
    assert local["sizes"] == {"B": 2, "S": 32} and local["model"]["spec"].endswith("config.json")
    assert local["train"]["adapter"] == local["train"]["adapter"] | {"method": "lora", "r": 4}
    assert local["train"]["loop"]["grad_accum"] == 2  # the flag, over the file's 4
    assert any("--grad-accum 2 overrides" in o for o in local["config"]["overrides"])
    became = {k["key"]: k["became"] for k in local["config"]["keys"]}
    assert became["lora_r"] == "--lora-r 4" and became["wandb_project"].startswith("no memory")
    server = ServeConfig(model="analytic", state_dir=tmp_path / "state", allow_local_specs=True)
    with local_server(server) as url:
        code, text, err = run_cli(capsys, *argv, "--url", url)
    assert code == 0, err
    remote = json.loads(text)
    for doc in (remote, local):
        del doc["predict_seconds"], doc["breakdown"]["route"]
    assert remote == local


def test_a_gpu_not_in_the_profiles_by_its_size(capsys):
    argv = ["predict", "--model", "mlp", "--batch", "8", "--method", "analytic", "--json"]
    code, text, err = run_cli(capsys, *argv, "--device-memory", "48GiB",
                              "--compute-capability", "8.9")  # fmt: skip
    assert code == 0, err
    out = json.loads(text)
    assert out["device"] == "custom-48gib-sm89" and out["metric"] == "reserved"
    code, _, err = run_cli(capsys, *argv, "--compute-capability", "8.9")
    assert code == 2 and "--compute-capability goes with --device-memory" in err


def test_the_rank_line_names_tensor_parallelism():
    from memgnn.cli.predict import _ranks

    assert _ranks({"sharding": "fsdp"}) == "fsdp"
    assert _ranks({"sharding": "none", "tp": 2, "dp": 1}) == "tp 2"
    assert _ranks({"sharding": "fsdp", "tp": 2, "dp": 4}) == "fsdp dp 4 x tp 2"


def test_fp32_by_default_over_a_bf16_checkpoint_warns_and_a_chosen_precision_does_not(
    tmp_path, capsys
):
    """transformers 5 loads a checkpoint's dtype by default: fp32 weights of a bf16
    checkpoint, never chosen, are named with the two precisions that mean otherwise."""
    from tiny_models import write_tiny_gpt2_config

    path = write_tiny_gpt2_config(tmp_path / "cfg" / "config.json")
    path.write_text(json.dumps(json.loads(path.read_text()) | {"dtype": "bfloat16"}))
    base = ["predict", "--model", f"hf:{path}", "--batch", "2", "--seq", "16", "--json"]
    base += ["--method", "analytic", "--device", "a100-80gb"]
    said = {}
    for extra in ([], ["--precision", "fp32"], ["--precision", "bf16"]):
        code, text, err = run_cli(capsys, *base, *extra)
        assert code == 0, err
        said[" ".join(extra)] = [w for w in json.loads(text)["warnings"] if "stored in" in w]
    assert said["--precision fp32"] == said["--precision bf16"] == []
    (warning,) = said[""]
    assert "--precision bf16" in warning and "amp-bf16" in warning
