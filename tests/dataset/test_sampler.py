"""The corpus config sampler: deterministic, stratified, within caps, skips with reasons."""

from __future__ import annotations

from collections import Counter

import pytest
from memgnn.dataset.sampler import (
    DEFAULT_SIM_DEVICES,
    SamplerConfig,
    canonical_id,
    sample_jobs,
    skip_reason,
)
from memgnn.predictor.spec.train import TrainSpec
from memgnn.predictor.zoo import FAMILIES, get_family

CHEAP = ["mlp", "resnet", "lstm", "unet"]


def test_same_seed_same_jobs_and_ids_are_content_hashes():
    cfg = dict(size=24, seed=3, families=CHEAP)
    a, b = sample_jobs(SamplerConfig(**cfg)), sample_jobs(SamplerConfig(**cfg))
    assert a == b
    assert len({j.job_id for j in a}) == 24
    job = a[0]
    config = {
        "model": job.model,
        "hparams": job.hparams,
        "train": job.train,
        "backend": job.backend,
        "device": job.device,
    }
    assert job.job_id == canonical_id(config | {"sizes": job.sizes})
    assert job.group == canonical_id(config)
    other = sample_jobs(SamplerConfig(**cfg | {"seed": 4}))
    assert {j.job_id for j in other} != {j.job_id for j in a}


def test_a_larger_size_keeps_the_smaller_sample():
    small = sample_jobs(SamplerConfig(size=10, seed=1, families=CHEAP))
    big = sample_jobs(SamplerConfig(size=30, seed=1, families=CHEAP))
    assert big[:10] == small


def test_stratified_round_robin_over_families():
    cfg = SamplerConfig(size=60, seed=0, families=CHEAP, sizes_per_config=3)
    jobs = sample_jobs(cfg)
    per_family = Counter(j.model for j in jobs)
    assert set(per_family) == set(CHEAP)
    assert max(per_family.values()) - min(per_family.values()) <= cfg.sizes_per_config
    assert [j.family for j in jobs if j.model == "lstm"][0] == get_family("lstm").family


def test_every_job_fits_the_caps_and_ranges():
    cfg = SamplerConfig(size=40, seed=2, backend="cpu", families=["gpt2", "resnet", "t5", "vit"])
    assert cfg.devices == ["cpu"]
    for job in sample_jobs(cfg):
        family = FAMILIES[job.model]
        for key, choices in family.ranges.items():
            assert job.hparams[key] in choices
        tokens = sum(v for k, v in job.sizes.items() if k != "B") or 1
        assert job.sizes["B"] <= cfg.max_batch
        assert job.sizes["B"] * tokens <= cfg.max_tokens
        assert job.hparams.get("image", 0) <= cfg.max_image
        assert set(job.sizes) == set(family.dims)
        TrainSpec.of(**job.train)  # a valid TrainSpec


def test_layer_cap():
    cfg = SamplerConfig(size=20, families=["gpt2", "moe", "mlp"], max_layers=2)
    assert {j.hparams["layers"] for j in sample_jobs(cfg)} == {2}


def test_pinned_hparams():
    cfg = SamplerConfig(size=8, families=["gpt2"], hparams={"gpt2": {"layers": 2, "hidden": 96}})
    assert {(j.hparams["layers"], j.hparams["hidden"]) for j in sample_jobs(cfg)} == {(2, 96)}


def test_configs_that_cannot_run_are_skipped_with_a_reason():
    assert "bfloat16" in skip_reason(TrainSpec.of(precision="bf16"), 2, "v100-16gb")
    assert "bfloat16" in skip_reason(TrainSpec.of(precision="amp-bf16"), 2, "v100-16gb")
    assert skip_reason(TrainSpec.of(precision="bf16"), 2, "a100-80gb") is None
    assert "has none" in skip_reason(TrainSpec.of(checkpointing="full"), 0, "cpu")
    assert "has 2" in skip_reason(TrainSpec.of(checkpointing="blocks:3"), 2, "h100-80gb")
    assert skip_reason(TrainSpec.of(optimizer_impl="fused"), 2, "cpu") is None  # torch >= 2.4
    fp16 = TrainSpec.of(precision="amp-fp16")
    assert "slow reference kernel" in skip_reason(fp16, 2, "cpu", conv=True)
    assert (
        skip_reason(fp16, 2, "cpu") is None and skip_reason(fp16, 2, "a10g-24gb", conv=True) is None
    )
    # the sampler draws only configs that can run: no bf16 on a V100
    jobs = sample_jobs(SamplerConfig(size=40, families=["mlp"], devices=["v100-16gb"]))
    assert len(jobs) == 40 and all(j.skip is None for j in jobs)
    assert not any("bf16" in j.train["precision"] for j in jobs)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_small_draw_is_all_valid_and_spread_over_the_devices(seed):
    # `dataset build --size 20` skipped 12 of 20 jobs (bf16 on a V100), all on one device
    jobs = sample_jobs(SamplerConfig(size=20, seed=seed))
    assert len(jobs) == 20 and [j.skip for j in jobs if j.skip] == []
    per_device = Counter({j.group: j.device for j in jobs}.values())  # configs per device
    assert set(per_device) == set(DEFAULT_SIM_DEVICES)  # 5 configs over 4 devices
    assert max(per_device.values()) - min(per_device.values()) <= 1


def test_each_family_is_spread_over_the_devices():
    jobs = sample_jobs(SamplerConfig(size=96, seed=0, families=["mlp", "lstm"], sizes_per_config=3))
    for family in ("mlp", "lstm"):  # 16 configs each over 4 devices
        per_device = Counter({j.group: j.device for j in jobs if j.model == family}.values())
        assert set(per_device) == set(DEFAULT_SIM_DEVICES)
        assert max(per_device.values()) - min(per_device.values()) <= 1
    bf16 = {j.device for j in jobs if "bf16" in j.train["precision"]}
    assert bf16 and "v100-16gb" not in bf16


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(size=-1), "size"),
        (dict(size=1, backend="tpu"), "backend"),
        (dict(size=1, families=["nope"]), "unknown families"),
        (dict(size=1, families=[]), "families"),
        (dict(size=1, backend="cpu", devices=["a100-80gb"]), "does not fit"),
        (dict(size=1, devices=["cpu"]), "does not fit"),
        (dict(size=1, devices=["tpu-v5"]), "unknown device"),
        (dict(size=1, sizes_per_config=0), "sizes_per_config"),
        (dict(size=1, max_tokens=0), "max_tokens"),
        (dict(size=1, hparams={"mlp": {"nope": 1}}), "unknown hparam"),
    ],
)
def test_config_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplerConfig(**kwargs)


def test_job_ids_ignore_training_fields_added_later_at_their_defaults():
    from memgnn.dataset.sampler import canonical_id
    from memgnn.predictor.spec.train import TrainSpec

    train = TrainSpec().flat()
    old = {k: v for k, v in train.items() if k not in ("attention", "quantize_base", "gpus")}
    base = {"model": "gpt2", "train": old, "sizes": {"B": 2}}
    assert canonical_id(base | {"train": train}) == canonical_id(base)  # resumes keep ids
    changed = train | {"attention": "eager"}
    assert canonical_id(base | {"train": changed}) != canonical_id(base)
