import pytest
from memgnn.predictor.spec.devices import PROFILES, get_profile

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
