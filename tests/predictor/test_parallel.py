"""Data/model parallel options: TrainSpec validation, CLI flags, HTTP schema fields."""

from __future__ import annotations

import argparse

import pytest
from memgnn.predictor.spec import TrainSpec
from memgnn.predictor.vocab import SHARDINGS

from memgnn.args import add_train_args, train_spec


def test_defaults_are_one_unsharded_gpu():
    t = TrainSpec()
    assert (t.gpus, t.sharding, t.fsdp_reshard_after_forward) == (1, "none", True)
    assert t.shard_group_size == 1
    assert SHARDINGS == ("none", "ddp", "fsdp", "hsdp", "zero1", "zero2", "zero3")


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"gpus": 0}, "--gpus must be an integer >= 1"),
        ({"gpus": 1, "sharding": "zero3"}, "--sharding zero3 needs --gpus >= 2"),
        ({"gpus": 1, "sharding": "ddp"}, "--sharding ddp needs --gpus >= 2"),
        ({"gpus": 4}, "--gpus 4 needs --sharding"),
        ({"gpus": 2, "sharding": "tp"}, "unknown --sharding 'tp'"),
        ({"gpus": 4, "sharding": "hsdp"}, None),
        ({"gpus": 2, "sharding": "hsdp"}, "--sharding hsdp needs --gpus split"),
        ({"gpus": 6, "sharding": "hsdp", "hsdp_shard_size": 4}, "--hsdp-shard-size dividing"),
        ({"gpus": 4, "sharding": "fsdp", "hsdp_shard_size": 2}, "--hsdp-shard-size applies"),
        (
            {"gpus": 2, "sharding": "zero3", "fsdp_reshard_after_forward": False},
            "--fsdp-reshard-after-forward false applies to --sharding fsdp or hsdp",
        ),
        ({"gpus": 2, "sharding": "fsdp", "fsdp_reshard_after_forward": False}, None),
    ],
)
def test_bad_combinations_name_the_option(kwargs, needle):
    if needle is None:
        TrainSpec(**kwargs)
        return
    with pytest.raises(ValueError, match=needle.replace("(", r"\(")):
        TrainSpec(**kwargs)


def test_shard_group_sizes():
    assert TrainSpec(gpus=8, sharding="fsdp").shard_group_size == 8
    assert TrainSpec(gpus=8, sharding="ddp").shard_group_size == 1
    assert TrainSpec(gpus=4, sharding="hsdp").shard_group_size == 2
    assert TrainSpec(gpus=16, sharding="hsdp").shard_group_size == 8
    assert TrainSpec(gpus=32, sharding="hsdp", hsdp_shard_size=4).shard_group_size == 4


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_train_args(p)
    return p.parse_args(argv)


def test_cli_flags_reach_the_spec():
    args = _parse(["--gpus", "8", "--sharding", "fsdp", "--fsdp-reshard-after-forward", "false"])
    t = train_spec(args)
    assert (t.gpus, t.sharding, t.fsdp_reshard_after_forward) == (8, "fsdp", False)
    assert train_spec(_parse([])) == TrainSpec()
    with pytest.raises(SystemExit):
        _parse(["--fsdp-reshard-after-forward", "maybe"])


def test_http_schema_fields():
    from memgnn.serving.schemas import PlanRequest, PredictRequest, TrainIn
    from pydantic import ValidationError

    t = TrainIn(gpus=4, sharding="zero2").to_spec()
    assert (t.gpus, t.sharding) == (4, "zero2")
    with pytest.raises(ValidationError, match="--sharding zero3 needs --gpus >= 2"):
        TrainIn(sharding="zero3")
    req = PredictRequest.model_validate(
        {"model": {"spec": "mlp", "train": {"gpus": 2, "sharding": "ddp"}}, "configs": [{}]}
    )
    assert req.model.train.to_spec().sharding == "ddp"
    plan = PlanRequest.model_validate(
        {
            "model": {"spec": "mlp", "train": {"gpus": 2, "sharding": "fsdp",
                                               "fsdp_reshard_after_forward": False}},
            "budget_bytes": 1 << 30,
        }
    )  # fmt: skip
    assert plan.model.train.to_spec().fsdp_reshard_after_forward is False
