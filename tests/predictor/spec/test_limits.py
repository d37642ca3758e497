import pytest
from memgnn.predictor.errors import UserError
from memgnn.predictor.spec.limits import (
    DEFAULT_THRESHOLD,
    MemoryLimit,
    default_limit,
    resolve_limit,
)

GIB = 1 << 30


def test_threshold_is_a_fraction_of_the_device_total():
    limit = resolve_limit(budget=None, threshold=0.85, device_total=80 * GIB)
    assert limit.source == "threshold" and limit.budget_bytes == 80 * GIB
    assert limit.limit_bytes == int(80 * GIB * 0.85) == 73_014_444_032


def test_budget_text_and_bytes_give_the_limit_itself():
    assert resolve_limit(budget="68GB", threshold=None, device_total=None).limit_bytes == 68 * 10**9
    assert resolve_limit(budget=4096, threshold=None, device_total=None).limit_bytes == 4096
    # a fraction in --budget is of the device, as parse_budget reads it
    assert resolve_limit(budget="50%", threshold=None, device_total=100 * GIB).limit_bytes == (
        50 * GIB
    )


def test_budget_and_threshold_are_exclusive_and_the_error_names_both():
    with pytest.raises(UserError, match="--budget and --threshold are mutually exclusive"):
        resolve_limit(budget="8GiB", threshold=0.5, device_total=80 * GIB)
    with pytest.raises(UserError, match="budget_bytes and threshold"):
        resolve_limit(
            budget=8, threshold=0.5, device_total=80 * GIB, names=("budget_bytes", "threshold")
        )


def test_neither_is_none_unless_required():
    assert resolve_limit(budget=None, threshold=None, device_total=GIB) is None
    with pytest.raises(UserError, match="--budget .* or --threshold"):
        resolve_limit(budget=None, threshold=None, device_total=GIB, required=True)


@pytest.mark.parametrize("bad", [0.0, -0.1, 1.5, float("nan"), float("inf")])
def test_threshold_outside_zero_one_is_refused(bad):
    with pytest.raises(UserError, match="--threshold must be a fraction in"):
        resolve_limit(budget=None, threshold=bad, device_total=GIB)


def test_threshold_needs_a_device_with_a_total():
    with pytest.raises(UserError, match="'cpu' has no memory total"):
        resolve_limit(budget=None, threshold=0.5, device_total=None, device="cpu")


def test_verdict_fits_and_headroom():
    limit = MemoryLimit(budget_bytes=1000, threshold=0.5, source="threshold")
    assert limit.verdict(500) | {} == {
        "budget_bytes": 1000,
        "threshold": 0.5,
        "source": "threshold",
        "limit_bytes": 500,
        "fits": True,
        "headroom_bytes": 0,
        "fits_device": True,
    }
    over = limit.verdict(501)
    assert not over["fits"] and over["headroom_bytes"] == -1 and over["fits_device"]
    assert limit.verdict(1001)["fits_device"] is False
    assert "fits_device" not in MemoryLimit(budget_bytes=1000).verdict(10)  # not a device


def test_an_answer_naming_no_limit_is_judged_against_85_percent_of_a_gpu():
    """A plain `predict` gave a number and no verdict; now the 85% line and the device."""
    limit = default_limit(80 * GIB)
    assert limit is not None and limit.source == "default"
    assert limit.threshold == DEFAULT_THRESHOLD == 0.85
    v = limit.verdict(70 * GIB)
    assert v["fits"] is False and v["fits_device"] is True and v["limit_bytes"] == int(68 * GIB)
    assert default_limit(None) is None  # the CPU: no total, no verdict
