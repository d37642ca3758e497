"""The reading, its builder's accounting and the command line's overrides
(predictor/frameworks/base.py)."""

from __future__ import annotations

import pytest
from memgnn.predictor.frameworks import (
    ConfigReading,
    merge_options,
    merge_sizes,
    read_config,
    spec_options,
)
from memgnn.predictor.frameworks.base import Builder, flag_text, is_off


def test_an_explicit_flag_overrides_the_file_and_says_so(write):
    r = read_config(write("args.json", '{"gradient_accumulation_steps": 8, "bf16": true}'))
    options, notes = merge_options(r, {"grad_accum": 4, "precision": "amp-bf16"})
    assert options["grad_accum"] == 4 and options["precision"] == "amp-bf16"
    assert notes == ["--grad-accum 4 overrides the file's gradient_accumulation_steps: 8"]


def test_sharding_waits_for_the_gpu_count():
    r = ConfigReading(
        format="hf",
        path="a.json",
        options={"sharding": "fsdp", "fsdp_reshard_after_forward": False, "precision": "bf16"},
        sources={"sharding": "fsdp: full_shard"},
    )
    one, notes = merge_options(r, {})
    assert one == {"precision": "bf16"}
    assert notes and "the file's fsdp: full_shard shards over several GPUs" in notes[0]
    eight, notes = merge_options(r, {"gpus": 8})
    assert eight["sharding"] == "fsdp" and eight["gpus"] == 8 and notes == []


def test_sizes_from_the_command_line_override_the_file():
    r = ConfigReading(
        format="axolotl",
        path="a.yml",
        sizes={"B": 2, "S": 4096},
        sources={"B": "micro_batch_size: 2"},
    )
    sizes, notes = merge_sizes(r, {"B": 8})
    assert sizes == {"B": 8, "S": 4096}
    assert notes == ["--batch 8 overrides the file's micro_batch_size: 2"]


def test_spec_options_names_what_trainspec_has_no_field_for():
    raw = {"peft_type": "IA3"}  # a saved adapter config is an option (AdapterSpec.config)
    kept, rest = spec_options({"precision": "bf16", "peft_config": raw, "no_such": 1})
    assert kept == {"precision": "bf16", "peft_config": raw} and rest == ["no_such"]


def test_a_reader_cannot_leave_a_key_unaccounted():
    b = Builder("hf", "a.json", {"x": 1, "y": 2})
    b.read("x", "no memory effect: test")
    with pytest.raises(AssertionError, match=r"unaccounted for: \['y'\]"):
        b.result()
    b.unknown("y")
    assert b.result().warnings == [
        "unknown key y: not read; the answer does not know whether it changes memory"
    ]


def test_a_feature_off_is_read_and_on_is_warned():
    b = Builder("hf", "a.json", {"on": True, "off": False})
    b.feature("on", "torch.compile", "the answer is the eager step's")
    b.feature("off", "torch.compile", "the eager step")
    r = b.result()
    assert r.warnings == [
        "on: true: torch.compile is not modelled yet; the answer is the eager step's"
    ]
    assert r.key("off").became == "off (as the answer assumes): torch.compile"


@pytest.mark.parametrize(
    ("dest", "value", "text"),
    [
        ("grad_accum", 4, "--grad-accum 4"),
        ("set_to_none", False, "--zero-grad zero"),
        ("hold_outputs", True, "--hold-outputs"),
        ("fsdp_reshard_after_forward", False, "--fsdp-reshard-after-forward false"),
    ],
)
def test_flag_text(dest, value, text):
    assert flag_text(dest, value) == text


def test_is_off():
    assert all(is_off(v) for v in (None, False, 0, "", "none", "False", [], {}))
    assert not any(is_off(v) for v in (True, 1, "auto", ["x"], 0.5))


def test_a_number_of_the_wrong_kind_names_the_key(write):
    with pytest.raises(ValueError, match="gradient_accumulation_steps must be an integer, got 2.5"):
        read_config(write("a.json", '{"gradient_accumulation_steps": 2.5}'))
