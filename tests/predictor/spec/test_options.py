"""Each option is declared once: the CLI flags and the HTTP schema are made from it."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import pytest
from memgnn.predictor.spec.options import Option, group_options, opt
from memgnn.predictor.spec.train import OPTIONS, TrainSpec
from memgnn.serving.schemas import TrainIn

from memgnn.cli.options import add_train_args, explicit_train_options, option_flags, train_spec


def _parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_train_args(p)
    return p.parse_args(list(argv))


def test_every_option_with_a_flag_is_on_the_command_line():
    p = argparse.ArgumentParser()
    add_train_args(p)
    flags = {a for action in p._actions for a in action.option_strings}
    assert {o.flag for o in OPTIONS if o.cli != "none"} <= flags


def test_flags_given_are_told_apart_from_defaults():
    args = _parse("--precision", "bf16", "--zero-grad", "zero", "--hold-outputs")
    assert explicit_train_options(args) == {
        "precision": "bf16", "set_to_none": False, "hold_outputs": True
    }  # fmt: skip
    assert explicit_train_options(_parse()) == {}
    assert train_spec(_parse()) == TrainSpec()


def test_option_flags_are_the_inverse_of_parsing():
    spec = TrainSpec.of(
        precision="bf16", peft="lora", lora_r=4, set_to_none=False, hold_outputs=True,
        gpus=2, sharding="fsdp", fsdp_reshard_after_forward=False,
    )  # fmt: skip
    assert train_spec(_parse(*option_flags(spec.flat()))) == spec
    assert option_flags(TrainSpec().flat()) == []


def test_the_http_schema_takes_nested_and_flat_bodies_with_the_options_bounds():
    nested = TrainIn.model_validate({"adapter": {"method": "lora", "r": 4}})
    flat = TrainIn.model_validate({"peft": "lora", "lora_r": 4})
    assert nested.to_spec() == flat.to_spec() == TrainSpec.of(peft="lora", lora_r=4)
    with pytest.raises(ValueError, match="less than or equal to 65536"):
        TrainIn.model_validate({"lora_r": 70_000})
    with pytest.raises(ValueError, match="finite number"):
        TrainIn.model_validate({"lora_alpha": float("nan")})
    with pytest.raises(ValueError, match="Extra inputs"):
        TrainIn.model_validate({"adapter": {"rank": 4}})


def test_a_group_field_must_be_declared_with_opt():
    @dataclass(kw_only=True, slots=True)
    class Good:
        width: int = opt(4, name="width", help="how wide", lo=1)

    (o,) = group_options("toy", Good)
    assert isinstance(o, Option) and (o.flag, o.dest, o.type, o.lo) == ("--width", "width", int, 1)

    @dataclass
    class Bad:
        width: int = 4

    with pytest.raises(AssertionError, match="not declared with opt"):
        list(group_options("toy", Bad))


def test_an_option_needs_a_flag_unless_it_has_none():
    with pytest.raises(ValueError, match="a flag starts with --"):
        Option(name="x", group="g", field="x", default=1, type=int, help="h", flag="x")
    assert Option(name="x", group="g", field="x", default=1, type=int, help="h", cli="none")
