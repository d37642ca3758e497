"""The governor's decision rule, rule by rule, against a stub predictor with a known formula.

The stub says a step at micro-batch B, length S needs BASE + PER_TOKEN[C] x B x S bytes
(checkpointing `full` keeps a quarter of the activations); the device has CAPACITY bytes and
the policy's threshold is 0.5, so the limit is 50,000 and the largest B that fits at S = 10
is exactly (50,000 - 10,000) / (PER_TOKEN x 10): 40 without checkpointing, 160 with.
"""

from __future__ import annotations

import pytest
from memgnn.predictor.spec.train import TrainSpec
from memgnn.serving.governor.correction import GovernedPredictor
from memgnn.serving.governor.policy import Policy, PolicyConfig

from tests.serving.governor.stub_policy import BASE, StubGraph, StubModel, stub_policy

CAPACITY = 100_000
S = 10


def policy(**cfg) -> Policy:
    cfg.setdefault("threshold", 0.5)
    cfg.setdefault("checkpointing", ["none"])
    if cfg.get("mode") != "binsearch":  # the rules below with power-of-two sizes, unless told
        cfg.setdefault("mode", "power")
        cfg.setdefault("power_of_two", True)
    return stub_policy(CAPACITY, PolicyConfig(**cfg))


def test_limit_is_threshold_times_capacity():
    assert policy().limit == 50_000


def test_a_new_bucket_gets_the_largest_power_of_two_that_fits():
    d = policy().decide(S, None, 0)
    assert (d.micro, d.grad_accum, d.checkpointing) == (32, 1, "none")  # 64 needs 74,000
    assert d.bound_bytes == BASE + 100 * 32 * S and d.fits


def test_binsearch_without_power_of_two_finds_the_exact_largest():
    d = policy(mode="binsearch", power_of_two=False).decide(S, None, 0)
    assert d.micro == 40 and d.bound_bytes == 50_000  # exactly at the limit


def test_the_default_is_doubling_then_bisection():
    cfg = PolicyConfig()
    assert (cfg.mode, cfg.power_of_two) == ("binsearch", False)
    pol = policy(mode=cfg.mode, power_of_two=cfg.power_of_two)
    assert pol.decide(S, None, 0).micro == 40


def test_a_batch_that_fits_whole_runs_whole():
    d = policy().decide(S, 24, 0)
    assert (d.micro, d.grad_accum) == (24, 1)


def test_a_batch_that_does_not_fit_is_split_into_even_accumulation():
    d = policy().decide(S, 100, 0)
    assert d.grad_accum == 4 and d.micro == 25  # ceil(100 / 32) pieces, evened out: 4 x 25
    assert d.bound_bytes <= 50_000


def test_the_cheapest_fitting_checkpointing_wins():
    pol = policy(checkpointing=["none", "full"])
    assert pol.decide(S, 24, 0).checkpointing == "none"  # fits whole without recompute
    # S=500: without checkpointing not even B=1 fits (60,000); with it, 2 x 2
    d = pol.decide(500, 4, 0)
    assert (d.micro, d.grad_accum, d.checkpointing) == (2, 2, "full") and d.fits


def test_a_fixed_batch_trades_accumulation_steps_against_recompute():
    # 120 samples at S=40 fit no config at once: 15 x 8 plain or 4 x 30 checkpointed.
    # Without a per-micro-batch cost the plain one is less work...
    d = policy(checkpointing=["none", "full"], overhead_tokens=0).decide(40, 120, 0)
    assert (d.micro, d.grad_accum, d.checkpointing) == (8, 15, "none")
    # ...with 256 tokens' worth per micro-batch, 15 of them cost more than the recompute:
    # 320 / (256 + 320) = 0.56 vs 1200 / (256 + 1600) = 0.65
    d = policy(checkpointing=["none", "full"], overhead_tokens=256).decide(40, 120, 0)
    assert (d.micro, d.grad_accum, d.checkpointing) == (30, 4, "full")


def test_shrinks_at_once_when_the_correction_rises():
    pol = policy(stability_window=10)
    assert pol.decide(S, None, 0).micro == 32
    for _ in range(30):
        pol.predictor.corrector.update(100, 160)  # the device measures 60% more
    d = pol.decide(S, None, 1)  # inside the stability window, still shrinks
    assert d.micro < 32 and d.bound_bytes <= pol.limit


def test_grows_only_after_the_stability_window_and_by_at_most_the_growth_factor():
    pol = policy(stability_window=5, max_batch=64)
    pol.predictor.corrector.floor = 2.0  # bound x 2: B <= 15 fits, the power of two is 8
    assert pol.decide(S, None, 0).micro == 8
    pol.predictor.corrector.floor = 0.0  # back to x 1: 32 fits again
    assert [pol.decide(S, None, step).micro for step in range(1, 5)] == [8] * 4
    assert pol.decide(S, None, 5).micro == 16  # window passed: one doubling, not to 32


def test_non_power_of_two_growth_is_bounded_by_the_factor():
    pol = policy(mode="binsearch", power_of_two=False, stability_window=1, growth=1.25)
    pol.predictor.corrector.floor = 2.0
    first = pol.decide(S, None, 0).micro  # bound x 2: B <= 15
    pol.predictor.corrector.floor = 0.0
    grown = pol.decide(S, None, 1).micro
    assert first < grown <= max(int(first * 1.25), first + 1)


def test_an_oom_caps_the_bucket_below_the_failed_size_and_halves_growth():
    pol = policy()
    d = pol.decide(S, None, 0)
    pol.on_success(S, 16)  # 16 completed once
    back = pol.on_oom(S, d, 1, None)
    st = pol.states[S]
    assert st.ceiling == 16  # the power of two below 32
    assert st.growth == 1.5  # 1 + (2 - 1) / 2
    assert back.micro == 16  # the last size that completed
    assert pol.decide(S, None, 100).micro <= 16  # never above the ceiling again


def test_an_oom_without_a_safe_size_halves():
    pol = policy()
    d = pol.decide(S, None, 0)
    assert pol.on_oom(S, d, 1, None).micro == 16


def test_the_optimize_tier_replans_once_per_window_and_the_pause_tier_shrinks():
    pol = policy(stability_window=5)
    pol.decide(S, None, 0)
    pol.force(S, 2)  # inside the window: no re-plan
    assert not pol.states[S].force and pol.forced == 0
    pol.force(S, 5)
    assert pol.states[S].force and pol.forced == 1
    pol.decide(S, None, 5)
    pol.force(S, 6, shrink=True)
    assert pol.states[S].micro == 16  # one power of two down


def test_nothing_fits_gives_the_most_memory_saving_config_and_says_so():
    pol = policy(checkpointing=["none", "full"])
    d = pol.decide(5000, 8, 0)  # B=1 at S=5000: 510,000 without, 135,000 with checkpointing
    assert not d.fits and d.micro == 1 and d.checkpointing == "full"


def test_each_bucket_has_its_own_plan():
    pol = policy(mode="binsearch", power_of_two=False)
    short, long = pol.decide(S, None, 0), pol.decide(4 * S, None, 0)
    assert (short.micro, long.micro) == (40, 10)
    assert set(pol.states) == {S, 4 * S}


@pytest.mark.parametrize("bad", [{"threshold": 0}, {"mode": "grid"}, {"growth": 1.0},
                                 {"checkpointing": []}, {"precision": ["fp16"]}])  # fmt: skip
def test_policy_config_is_validated(bad):
    with pytest.raises(ValueError):
        PolicyConfig(**bad)


def test_choices_follow_the_model():
    pol = Policy(
        GovernedPredictor(StubModel(), device="cpu", metric="allocated"),
        StubGraph, TrainSpec.of(precision="amp-bf16"), PolicyConfig(),
        capacity=CAPACITY, device="cpu", metric="allocated", n_blocks=0,
    )  # fmt: skip
    assert pol.checkpointing == ["none"]  # no blocks to checkpoint
    assert pol.precisions == ["amp-bf16"]  # the TrainSpec's precision when none is given


@pytest.mark.parametrize(
    ("overhead", "expected"),
    # plain: 40 x 10 tokens; checkpointed: 160 x 10 at 4/3 the compute per token
    [(0, (40, "none")), (256, (160, "full")), (100, (40, "none"))],
)
def test_checkpointing_is_chosen_by_throughput_with_a_fixed_micro_batch_cost(overhead, expected):
    # tokens / (overhead + tokens x cost): 400 / 400 = 1.0 vs 1600 / 2133 = 0.75 at 0;
    # 400 / 656 = 0.61 vs 1600 / 2389 = 0.67 at 256; 400 / 500 = 0.8 vs 0.71 at 100
    pol = policy(mode="binsearch", checkpointing=["none", "full"], overhead_tokens=overhead)
    d = pol.decide(S, None, 0)
    assert (d.micro, d.checkpointing) == expected


def test_a_stale_search_shrinks_the_batch_rather_than_switching_to_a_costlier_config():
    pol = policy(mode="binsearch", checkpointing=["none", "full"], overhead_tokens=0)
    assert (pol.decide(S, None, 0).micro, pol.states[S].checkpointing) == (40, "none")
    pol.predictor.corrector.floor = 1.001  # none@40 is 50,050 now; the memo bin is the same
    d = pol.decide(S, None, 1)
    assert (d.micro, d.checkpointing) == (39, "none")  # not full@40
    assert d.bound_bytes <= pol.limit
