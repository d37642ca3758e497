"""The nested training spec: flat options in and out, the groups' checks, the cross rules."""

from __future__ import annotations

import dataclasses

import pytest
from memgnn.predictor.spec.train import BY_NAME, OPTIONS, ParallelSpec, TrainSpec


def test_flat_options_land_in_their_groups_and_come_back():
    spec = TrainSpec.of(precision="bf16", peft="lora", lora_r=16, gpus=4, sharding="fsdp")
    assert spec.numerics.precision == "bf16"
    assert (spec.adapter.method, spec.adapter.r) == ("lora", 16)
    assert (spec.parallel.gpus, spec.parallel.sharding) == (4, "fsdp")
    assert spec.changed() == {
        "precision": "bf16", "peft": "lora", "lora_r": 16, "gpus": 4, "sharding": "fsdp"
    }  # fmt: skip
    assert list(spec.flat()) == [o.name for o in OPTIONS]


def test_nested_and_flat_dicts_read_back_to_the_same_spec():
    spec = TrainSpec.of(precision="amp-bf16", checkpointing="blocks:2", grad_accum=4)
    assert TrainSpec.from_dict(spec.to_dict()) == spec
    assert TrainSpec.from_dict(spec.flat()) == spec
    assert spec.to_dict()["activations"] == {"checkpointing": "blocks:2"}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"precision": "fp8"}, "unknown precision 'fp8'"),
        ({"lora_rank": 8}, "unknown training option 'lora_rank'"),
        ({"lora_r": 0}, "--lora-r must be >= 1"),
        ({"gpus": 2}, "--gpus 2 needs --sharding"),
        ({"optimizer": "adamw8bit", "optimizer_impl": "fused"}, "bitsandbytes' own kernel"),
        ({"quantize_base": "nf4"}, "needs --peft lora"),
        ({"quantize_base": "int8", "peft": "lora", "gpus": 2, "sharding": "fsdp"}, "not modelled"),
        ({"quantize_base": "nf4", "peft": "lora", "gpus": 2, "sharding": "fsdp1"}, "float storage"),
        ({"bnb_quant_storage": "bf16"}, "applies to --quantize-base nf4"),
        ({"bnb_version": "0.42.0"}, "applies to --quantize-base"),
    ],
)
def test_a_bad_option_is_refused_naming_it(options, message):
    with pytest.raises(ValueError, match=message):
        TrainSpec.of(**options)


def test_from_dict_names_an_unknown_nested_field():
    with pytest.raises(ValueError, match="unknown training option adapter.rank"):
        TrainSpec.from_dict({"adapter": {"rank": 8}})


def test_with_options_checks_the_whole_spec_again():
    spec = TrainSpec.of(gpus=4, sharding="fsdp")
    assert spec.with_options(grad_accum=2).loop.grad_accum == 2
    with pytest.raises(ValueError, match="needs --sharding"):
        spec.with_options(sharding="none")


def test_a_group_in_the_wrong_slot_is_refused():
    with pytest.raises(ValueError, match="TrainSpec.parallel must be a ParallelSpec"):
        TrainSpec(parallel=dataclasses.replace(TrainSpec().loop))  # type: ignore[arg-type]
    assert TrainSpec(parallel=ParallelSpec(gpus=2, sharding="ddp")).parallel.shard_group_size == 1


def test_derived_properties_live_in_their_groups():
    spec = TrainSpec.of(precision="amp-fp16", checkpointing="full", gpus=16, sharding="hsdp")
    assert spec.numerics.uses_grad_scaler and spec.activations.checkpoint_blocks == -1
    assert spec.parallel.shard_group_size == 8  # inside an 8-GPU node, 2 replicas
    old = TrainSpec.of(peft="lora", quantize_base="nf4", bnb_version="0.42.0")
    assert (
        old.quant.keeps_input
        and not TrainSpec.of(peft="lora", quantize_base="nf4").quant.keeps_input
    )


def test_every_option_name_is_unique_and_has_help():
    assert len(BY_NAME) == len(OPTIONS)
    assert all(o.help for o in OPTIONS)


@pytest.mark.parametrize(
    ("options", "refused"),
    [
        ({"compile": "blocks", "gpus": 2, "tp": 2, "optimizer_impl": "for-loop"}, "--tp 2"),
        ({"float8": "rowwise", "gpus": 2, "tp": 2, "optimizer_impl": "for-loop"}, "--tp 2"),
        ({"compile": "blocks", "float8": "rowwise", "precision": "bf16"}, "--float8 rowwise"),
    ],
)
def test_techniques_not_modelled_together_are_refused(options, refused):
    """--compile, --float8 and --tp landed separately; a combination none of them runs is
    refused naming it, not answered as if one were off."""
    with pytest.raises(ValueError, match=refused):
        TrainSpec.of(**options)
