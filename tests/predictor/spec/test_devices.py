import pytest
from memgnn.predictor.spec.devices import (
    DEFAULT_CUSTOM_SM,
    PROFILES,
    cublas_workspace_bytes,
    custom_profile,
    get_profile,
)

REQUIRED = [
    "cpu",
    "v100-16gb",
    "t4-16gb",
    "a10g-24gb",
    "l4-24gb",
    "rtx4090-24gb",
    "a100-40gb",
    "a100-80gb",
    "h100-80gb",
    "h200-141gb",
]


def test_required_profiles_exist_with_terms():
    for name in REQUIRED:
        p = get_profile(name)
        if p.is_gpu:
            assert p.total_bytes > 10 * 2**30 and p.context_bytes > 0
            assert p.cublas_workspace_bytes == (33_554_432 if p.sm >= 90 else 8_519_680)
    assert get_profile("cpu").total_bytes is None


def test_unknown_profile_lists_known_ones():
    with pytest.raises(ValueError, match="h100-80gb"):
        get_profile("h1000")


def test_bf16_needs_ampere():
    get_profile("a100-80gb").check_precision("amp-bf16")
    with pytest.raises(ValueError, match="bfloat16"):
        get_profile("t4-16gb").check_precision("bf16")
    assert len(PROFILES) >= len(REQUIRED)


# The profiles as they were before the 2026 additions: golden answers name them, so their
# names and figures must not move.
OLD = {
    "v100-16gb": (16160, 70),
    "v100-32gb": (32510, 70),
    "t4-16gb": (15360, 75),
    "a10g-24gb": (23028, 86),
    "l4-24gb": (23034, 89),
    "rtx4090-24gb": (24564, 89),
    "a100-40gb": (40960, 80),
    "a100-80gb": (81920, 80),
    "h100-80gb": (81559, 90),
    "h200-141gb": (143771, 90),
}

# name: (nvidia-smi MiB total, compute capability x10, cuBLAS workspace bytes)
NEW = {
    "a10-24gb": (23028, 86, 8_519_680),
    "rtx3090-24gb": (24576, 86, 8_519_680),
    "rtx5090-32gb": (32607, 120, 33_554_432),
    "l40s-48gb": (46068, 89, 8_519_680),
    "rtxa6000-48gb": (49140, 86, 8_519_680),
    "h100-pcie-80gb": (81559, 90, 33_554_432),
    "h100-sxm-80gb": (81559, 90, 33_554_432),
    "b200-180gb": (183359, 100, 33_554_432),
}


def test_existing_profiles_keep_their_names_and_figures():
    for name, (mib, sm) in OLD.items():
        p = get_profile(name)
        assert (p.total_bytes, p.sm, p.context_bytes) == (mib * 2**20, sm, 287 * 2**20)


@pytest.mark.parametrize("name", sorted(NEW))
def test_added_profiles_have_their_board_total_arch_and_source(name):
    mib, sm, workspace = NEW[name]
    p = get_profile(name)
    assert p.total_bytes == mib * 2**20 and p.sm == sm
    assert p.cublas_workspace_bytes == workspace
    assert p.bf16 and p.flash_attention  # every added board is sm80 or newer
    assert f"{mib}MiB" in p.source and f"sm{sm}" in p.source


def test_cublas_workspace_is_32mib_on_hopper_and_blackwell_only():
    """torch 2.13's parseChosenWorkspaceSize: 32 MiB for compute capability majors 9, 10,
    11 and 12 (sm100 B200, sm120 RTX 5090 included), :4096:2:16:8 before Hopper."""
    for sm in (70, 75, 80, 86, 87, 89):
        assert cublas_workspace_bytes(sm) == 4096 * 1024 * 2 + 16 * 1024 * 8
    for sm in (90, 100, 103, 110, 120, 121):
        assert cublas_workspace_bytes(sm) == 32 * 2**20


@pytest.mark.parametrize(
    ("memory", "sm", "name", "total"),
    [
        ("48GiB", 89, "custom-48gib-sm89", 48 * 2**30),
        ("80GB", 90, "custom-80gb-sm90", 80 * 10**9),
        ("24 GiB", 86, "custom-24gib-sm86", 24 * 2**30),
        ("49140MiB", 86, "custom-49140mib-sm86", 49140 * 2**20),
        ("51539607552", 120, "custom-48gib-sm120", 51_539_607_552),
        ("1.5TiB", 100, "custom-1536gib-sm100", 1536 * 2**30),
    ],
)
def test_custom_profile_reads_a_size_with_its_unit(memory, sm, name, total):
    p = custom_profile(memory, sm)
    assert (p.name, p.total_bytes, p.sm, p.kind) == (name, total, sm, "cuda")
    assert p.cublas_workspace_bytes == cublas_workspace_bytes(sm)
    assert p.context_bytes == PROFILES["h100-80gb"].context_bytes
    again = get_profile(name)  # the name alone gives the same profile back
    assert (again.total_bytes, again.sm, again.cublas_workspace_bytes) == (
        total,
        sm,
        p.cublas_workspace_bytes,
    )


def test_custom_profile_without_compute_capability_assumes_sm80_and_says_so():
    p = custom_profile("40GB")
    assert p.sm == DEFAULT_CUSTOM_SM == 80 and p.name == "custom-40gb-sm80"
    assert p.bf16 and p.cublas_workspace_bytes == 8_519_680
    assert "sm80 assumed" in p.source
    assert "assumed" not in custom_profile("40GB", 80).source


def test_custom_profile_before_ampere_has_no_bf16():
    p = custom_profile("16GiB", 75)
    assert not p.bf16 and not p.flash_attention
    with pytest.raises(ValueError, match="bfloat16"):
        p.check_precision("bf16")


@pytest.mark.parametrize(
    ("memory", "sm", "match"),
    [
        ("48 gigs", 89, "cannot read a device memory size"),
        ("48XB", 89, "cannot read a device memory size"),
        ("100MiB", 89, "under 1 GiB"),
        ("512MiB", 89, "under 1 GiB"),
        ("0.5", 89, "whole number of bytes"),
        ("48GiB", 8, "compute capability"),
        ("48GiB", 130, "compute capability"),
        ("48GiB", True, "compute capability"),
        ("48GiB", "89", "compute capability"),
    ],
)
def test_custom_profile_names_bad_input(memory, sm, match):
    with pytest.raises(ValueError, match=match):
        custom_profile(memory, sm)


def test_get_profile_refuses_a_custom_name_without_compute_capability():
    with pytest.raises(ValueError, match="custom-<memory>-sm<cc>"):
        get_profile("custom-48gib")
