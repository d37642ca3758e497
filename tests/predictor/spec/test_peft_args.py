"""--peft-arg NAME=VALUE and --peft-config FILE: parsed, checked against peft's config
classes, kept as one canonical JSON text, a saved config resolved into method + args."""

from __future__ import annotations

import argparse
import json

import pytest
from memgnn.predictor.spec import peft_args
from memgnn.predictor.spec.train import TrainSpec

from memgnn.cli.options import add_train_args, option_flags, train_spec

peft = pytest.importorskip("peft")


def _parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_train_args(p)
    return p.parse_args(list(argv))


def test_pairs_read_their_values_as_json_else_as_strings():
    got = peft_args.parse_pairs(
        ["num_virtual_tokens=20", "use_rslora=true", 'target_modules=["q_proj"]', "bias=none"]
    )
    assert got == {
        "num_virtual_tokens": 20, "use_rslora": True, "target_modules": ["q_proj"],
        "bias": "none",
    }  # fmt: skip
    with pytest.raises(ValueError, match="NAME=VALUE"):
        peft_args.parse_pairs(["num_virtual_tokens"])
    with pytest.raises(ValueError, match="given twice"):
        peft_args.parse_pairs(["a=1", "a=2"])


def test_args_are_one_canonical_json_text_whatever_the_spelling():
    spellings = [
        ["init_weights=false", "num_virtual_tokens=20"],
        '{"num_virtual_tokens": 20, "init_weights": false}',
        {"init_weights": False, "num_virtual_tokens": 20},
        "num_virtual_tokens=20,init_weights=false".split(","),
    ]
    texts = {peft_args.args_text(s) for s in spellings}
    assert texts == {'{"init_weights":false,"num_virtual_tokens":20}'}
    assert peft_args.args_text("") == peft_args.args_text({}) == ""
    with pytest.raises(ValueError, match="finite"):
        peft_args.args_text({"x": float("nan")})


def test_the_command_line_takes_repeated_peft_args_and_gives_them_back():
    args = _parse("--peft", "prefix_tuning", "--peft-arg", "num_virtual_tokens=20",
                  "--peft-arg", "prefix_projection=true")  # fmt: skip
    spec = train_spec(args)
    assert spec.adapter.args == '{"num_virtual_tokens":20,"prefix_projection":true}'
    assert train_spec(_parse(*option_flags(spec.flat()))) == spec
    assert TrainSpec.from_dict(spec.flat()) == spec
    assert TrainSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec


def test_lora_options_and_their_peft_args_make_one_spec():
    """--lora-r 16 and --peft-arg r=16 are one setting: one spec, one cache key."""
    assert TrainSpec.of(peft="dora", lora_r=16) == TrainSpec.of(peft="dora", peft_args=["r=16"])
    loha = TrainSpec.of(peft="loha", peft_args=["alpha=4", "r=4"])
    assert (loha.adapter.r, loha.adapter.alpha, loha.adapter.args) == (4, 4.0, "")
    assert loha.adapter.config_fields() == {"r": 4, "alpha": 4.0}
    # at memgnn's default on a method whose own default differs: kept as the arg says
    vera = TrainSpec.of(peft="vera", peft_args=["r=8"])
    assert vera.adapter.config_fields() == {"r": 8}
    assert TrainSpec.of(peft="vera").adapter.config_fields() == {}  # VeraConfig's r=256
    targets = TrainSpec.of(peft="ia3", peft_args=['target_modules=["k_proj","v_proj"]'])
    assert targets.adapter.targets == "k_proj,v_proj"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"peft": "ia3", "peft_args": ["rank=4"]}, r"--peft-arg rank: IA3Config has no such "
         r"field; its fields: .*target_modules.*feedforward_modules"),
        ({"peft": "ia3", "lora_r": 16}, "--lora-r 16: --peft ia3 has no such field"),
        ({"peft": "lora", "lora_r": 4, "peft_args": ["r=16"]}, "--lora-r 4 and r=16"),
        ({"peft_args": ["r=16"]}, "--peft-arg needs --peft METHOD"),
        ({"peft": "dora", "peft_args": ["r=0"]}, "--peft-arg r must be an integer >= 1"),
        ({"peft": "adalora"}, "total_step"),
        ({"peft": "prefix_tuning", "peft_args": ["num_virtual_tokens=x"]},
         r"num_virtual_tokens=\"x\": expected an integer"),
        ({"peft": "xlora"}, "--peft xlora is not modelled: X-LoRA"),
        ({"peft": "bone"}, "use --peft miss"),
        ({"peft": "ia3", "quantize_base": "nf4"}, "ia3 is not modelled: peft runs it over "
         "bitsandbytes layers"),
        ({"peft": "vera", "quantize_base": "nf4"}, "peft has no bitsandbytes layer"),
        ({"quantize_base": "nf4"}, "needs --peft lora"),
    ],
)  # fmt: skip
def test_bad_peft_settings_name_the_flag(options, message):
    with pytest.raises(ValueError, match=message):
        TrainSpec.of(**options)


def _saved(tmp_path, config) -> str:
    config.save_pretrained(str(tmp_path))
    return str(tmp_path / "adapter_config.json")


def test_a_saved_dora_config_becomes_method_and_options(tmp_path):
    path = _saved(tmp_path, peft.LoraConfig(
        r=16, lora_alpha=32, use_dora=True, target_modules=["v_proj", "q_proj"],
        use_rslora=True, base_model_name_or_path="meta-llama/Llama-3.1-8B", inference_mode=True,
    ))  # fmt: skip
    spec = TrainSpec.of(peft_config=path)
    a = spec.adapter
    assert (a.method, a.r, a.alpha, a.targets) == ("dora", 16, 32.0, "q_proj,v_proj")
    assert a.args == '{"use_rslora":true}'  # inference_mode and the base model dropped
    assert a.config == "" and spec.flat()["peft_config"] == ""
    assert TrainSpec.of(peft_config=str(tmp_path)) == spec  # the folder reads the same
    assert peft_args.saved_base_model(path) == "meta-llama/Llama-3.1-8B"
    # a --peft-arg overrides the file's field; a different --peft is refused
    assert TrainSpec.of(peft_config=path, peft_args=["use_rslora=false"]).adapter.args == (
        '{"use_rslora":false}'
    )
    with pytest.raises(ValueError, match="--peft ia3 but --peft-config .* is a dora config"):
        TrainSpec.of(peft="ia3", peft_config=path)


def test_a_saved_prefix_config_and_its_contents_decide_the_spec(tmp_path):
    path = _saved(tmp_path, peft.PrefixTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=20))
    spec = TrainSpec.of(peft_config=path)
    assert spec.adapter.method == "prefix_tuning"
    assert spec.adapter.args == '{"num_virtual_tokens":20,"task_type":"CAUSAL_LM"}'
    _saved(tmp_path, peft.PrefixTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=30))
    assert TrainSpec.of(peft_config=path) != spec  # the spec (and the cache key) follow it


def test_a_saved_config_as_a_mapping_reads_as_its_file(tmp_path):
    """What predictor.frameworks' adapter reader hands on: the loaded JSON."""
    path = _saved(tmp_path, peft.IA3Config(target_modules=["k_proj", "down_proj"],
                                           feedforward_modules=["down_proj"]))  # fmt: skip
    raw = json.loads((tmp_path / "adapter_config.json").read_text())
    assert TrainSpec.of(peft_config=raw) == TrainSpec.of(peft_config=path)
    assert TrainSpec.of(peft_config=raw).adapter.method == "ia3"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{}", "no peft_type"),
        ('{"peft_type": "NOPE"}', "peft_type 'NOPE' is no method of peft"),
        ("not json", "not a JSON file"),
    ],
)
def test_bad_saved_configs_name_the_file(tmp_path, text, message):
    path = tmp_path / "adapter_config.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=f"--peft-config .*{message}"):
        TrainSpec.of(peft_config=str(path))
    with pytest.raises(ValueError, match="no such file"):
        TrainSpec.of(peft_config=str(tmp_path / "missing.json"))


def test_the_http_schema_takes_args_but_no_config_path():
    from memgnn.serving.schemas import TrainIn

    body = {"peft": "prefix_tuning", "peft_args": '{"num_virtual_tokens": 20}'}
    spec = TrainIn.model_validate(body).to_spec()
    assert spec == TrainSpec.of(peft="prefix_tuning", peft_args=["num_virtual_tokens=20"])
    with pytest.raises(ValueError, match="pattern"):
        TrainIn.model_validate({"peft_config": "/etc/passwd"})


def test_what_the_framework_readers_make_of_an_adapter_config_is_a_spec(tmp_path):
    """predictor.frameworks reads an adapter_config.json into peft=<type> (lora for DoRA),
    the --lora-* options it knows and peft_config=<the raw JSON>: a TrainSpec of it
    models the method (DoRA too)."""
    from memgnn.predictor.frameworks import read_config
    from memgnn.predictor.frameworks.base import spec_options

    _saved(tmp_path, peft.LoraConfig(r=4, use_dora=True, target_modules=["q_proj"]))
    train = tmp_path / "a.json"
    train.write_text('{"per_device_train_batch_size": 2}')
    reading = read_config(str(train), adapter_config=str(tmp_path / "adapter_config.json"))
    kept, _ = spec_options(reading.options)
    spec = TrainSpec.of(**kept)
    assert (spec.adapter.method, spec.adapter.r, spec.adapter.targets) == ("dora", 4, "q_proj")


def test_dora_runs_over_a_quantised_base():
    """QDoRA: peft's bnb LoRA layers take use_dora (predictor/emulate/quant_lora.py)."""
    spec = TrainSpec.of(peft="dora", quantize_base="nf4", precision="bf16")
    assert (spec.adapter.method, spec.quant.base) == ("dora", "nf4")
