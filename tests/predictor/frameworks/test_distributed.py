"""DeepSpeed and FSDP settings -> --sharding (predictor/frameworks/distributed.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from memgnn.predictor.frameworks.base import Builder
from memgnn.predictor.frameworks.distributed import read_deepspeed, read_fsdp


def _fsdp(flat: dict, *, config_enables: bool = False):
    b = Builder("hf", "a.json", flat)
    on = read_fsdp(b, "fsdp", "fsdp_config.", config_enables=config_enables)
    return on, b.result()


@pytest.mark.parametrize(
    ("words", "options"),
    [
        ("full_shard auto_wrap", {"sharding": "fsdp"}),
        (["shard_grad_op"], {"sharding": "fsdp", "fsdp_reshard_after_forward": False}),
        ("hybrid_shard", {"sharding": "hsdp"}),
        ("hybrid_shard_zero2", {"sharding": "hsdp", "fsdp_reshard_after_forward": False}),
        ("no_shard", {"sharding": "ddp"}),
    ],
)
def test_fsdp_strategies(words, options):
    on, r = _fsdp({"fsdp": words})
    assert on and r.options == options
    assert any("FSDP1's flat parameters" in w for w in r.warnings)  # no version: FSDP1


def test_an_accelerate_style_fsdp1_config_names_its_strategy():
    on, r = _fsdp(
        {
            "fsdp_config.fsdp_sharding_strategy": "SHARD_GRAD_OP",
            "fsdp_config.fsdp_offload_params": True,
            "fsdp_config.fsdp_forward_prefetch": False,
        },
        config_enables=True,
    )
    assert on and r.options == {
        "sharding": "fsdp",
        "fsdp_reshard_after_forward": False,
        "fsdp_cpu_offload": True,
    }
    assert r.key("fsdp_config.fsdp_offload_params").became == "--fsdp-cpu-offload true"
    assert not any("offload" in w for w in r.warnings)
    assert r.key("fsdp_config.fsdp_forward_prefetch").became.startswith("off")


def test_cpu_offload_without_full_sharding_is_warned():
    on, r = _fsdp({"fsdp": "no_shard offload"})
    assert on and r.options == {"sharding": "ddp"}
    assert any(
        w.startswith("fsdp: offload: FSDP's CPU offload with --sharding ddp") for w in r.warnings
    )


def test_an_fsdp_config_without_fsdp_is_off_for_the_trainer():
    on, r = _fsdp({"fsdp": "", "fsdp_config.fsdp_version": 2})
    assert not on and r.options == {}
    assert r.key("fsdp_config.fsdp_version").became.startswith("no memory effect: FSDP is off")


@pytest.mark.parametrize(
    ("stage", "sharding"), [(0, "ddp"), (1, "zero1"), (2, "zero2"), (3, "zero3")]
)
def test_deepspeed_stages_inline(stage, sharding):
    b = Builder(
        "hf",
        "a.json",
        {"deepspeed.zero_optimization.stage": stage, "deepspeed.steps_per_print": 10},
    )
    ds = read_deepspeed(b, "deepspeed", Path("."))
    r = b.result()
    assert ds.stage == stage and r.options == {"sharding": sharding}
    assert r.key("deepspeed.steps_per_print").became == "no memory effect: logging"


def test_a_deepspeed_stage_that_does_not_exist_is_refused():
    b = Builder("hf", "a.json", {"deepspeed.zero_optimization.stage": 4})
    with pytest.raises(ValueError, match="is no ZeRO stage"):
        read_deepspeed(b, "deepspeed", Path("."))


def test_deepspeed_keys_nobody_knows_are_unknown():
    b = Builder("hf", "a.json", {"deepspeed.zero_optimization.stage": 2, "deepspeed.warp": 1})
    read_deepspeed(b, "deepspeed", Path("."))
    assert b.result().warnings == [
        "unknown key deepspeed.warp: not read; the answer does not know whether it changes memory"
    ]
