"""The governor on the emulated device: rollback, correction, decisions, batching."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch
from memgnn.predictor.memory.analytic import AnalyticModel
from memgnn.predictor.spec.train import TrainSpec
from memgnn.serving.governor import EmulatedDevice, MemoryGovernor
from memgnn.serving.governor.batching import LengthBuckets, even_chunks, split
from memgnn.serving.governor.correction import ResidualCorrector
from memgnn.serving.governor.demo import fixed_batches, long_tail_samples, tiny_varlen_bundle

from tests.serving.governor.governed import config, governor

pytestmark = pytest.mark.usefixtures("one_thread")


class Ledger:
    """Which sample ids each optimizer step's gradients hold: ids seen by `step_fn` since
    the last zero_grad; a zero_grad without an optimizer step (rollback) discards them."""

    def __init__(self, gov: MemoryGovernor) -> None:
        self.pending: list[int] = []
        self.steps: list[list[int]] = []
        opt = gov.optimizer
        step, zero = opt.step, opt.zero_grad

        def counted_step(*a, **k):
            self.steps.append(sorted(self.pending))
            self.pending = []
            return step(*a, **k)

        def counted_zero(*a, **k):
            self.pending = []
            return zero(*a, **k)

        opt.step, opt.zero_grad = counted_step, counted_zero


class Under(AnalyticModel):
    """A predictor that says 1/k of the truth."""

    def __init__(self, k: int = 4) -> None:
        self.k = k
        self.version = f"under-{k}"

    def predict(self, graph, queries):
        return [
            replace(p, predicted_peak_bytes=p.predicted_peak_bytes // self.k,
                    upper_bound_bytes=p.upper_bound_bytes // self.k)
            for p in super().predict(graph, queries)
        ]  # fmt: skip


def test_injected_oom_rolls_back_without_losing_or_repeating_samples(cache):
    gov = governor(cache, max_batch=8)
    ledger = Ledger(gov)
    bundle = gov.bundle
    inject = {"left": 1, "calls": 0}

    def step_fn(model, batch):
        inject["calls"] += 1
        if inject["left"] and inject["calls"] == 2:  # second micro-batch of the first step
            inject["left"] -= 1
            raise torch.OutOfMemoryError("injected OOM")
        ledger.pending += batch["sample_id"].tolist()
        return bundle.loss(model, batch)

    expected = []
    for batch in fixed_batches(long_tail_samples(48, hi=96), 16):
        expected.append(sorted(batch["sample_id"].tolist()))
        gov.step(batch, step_fn)
    assert ledger.steps == expected  # every optimizer step: its batch, each sample once
    assert gov.totals["ooms"] == 1 and gov.totals["rollbacks"] == 1
    first = gov.records[0]
    assert first.oom_retries == 1 and first.micro_batch == 4 and first.grad_accum == 4
    assert any(a.kind == "oom" for a in gov.alerts.alerts)


def test_real_oom_on_the_emulated_device_rolls_back_and_learns(cache):
    gov = governor(cache, capacity_mib=256, predictor=Under())
    ledger = Ledger(gov)
    bundle = gov.bundle

    def step_fn(model, batch):
        ledger.pending += batch["sample_id"].tolist()
        return bundle.loss(model, batch)

    samples = list(long_tail_samples(160, hi=128, seed=1))
    expected = []
    for batch in gov.batches(iter(samples)):
        expected.append(sorted(batch["sample_id"].tolist()))
        gov.step(batch, step_fn)
    assert gov.totals["ooms"] >= 1  # the optimistic predictor let real OOMs happen
    assert ledger.steps == expected
    assert sorted(i for s in ledger.steps for i in s) == list(range(160))
    assert gov.predictor.corrector.floor > 1  # an OOM raised the bound factor
    assert all(r.oom_retries == 0 for r in list(gov.records)[-3:])
    assert gov.device.memory_stats()["num_ooms"] == gov.totals["ooms"]


def test_split_step_gives_the_full_batch_gradient(cache, tiny_mlp):
    train = TrainSpec.of(optimizer="sgd", lr=0.1)
    gov = governor(cache, bundle=tiny_mlp, train=train, max_batch=2)
    reference = copy.deepcopy(gov.model)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    batch = tiny_mlp.make_inputs({"B": 8}, torch.device("cpu"), torch.float32)
    record = gov.step(batch)
    assert (record.micro_batch, record.grad_accum) == (2, 4)
    tiny_mlp.loss(reference, batch).backward()
    ref_opt.step()
    for p, q in zip(gov.model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_residual_correction_moves_predictions_toward_measurements(cache):
    c = ResidualCorrector()
    assert c.factor == 1.0
    for _ in range(30):
        c.update(100, 150)
    assert c.factor == pytest.approx(1.5, rel=1e-3)
    assert c.bound_factor >= c.factor
    c.learn_oom(100, 400)
    assert c.bound_factor == pytest.approx(4.0)

    gov = governor(cache, capacity_mib=4096, predictor=Under(2))
    for batch in fixed_batches(long_tail_samples(60, lo=48, hi=48), 6):
        gov.step(batch)
    recs = list(gov.records)
    err = [abs(r.predicted_bytes - r.measured_allocated_bytes) / r.measured_allocated_bytes
           for r in recs]  # fmt: skip
    assert err[0] > 0.25  # the raw predictor is 2x low
    assert err[-1] < 0.05  # learned from the live samples
    assert gov.totals["ooms"] == 0


def test_decisions_respect_the_threshold_and_the_stability_window(cache):
    gov = governor(cache, stability_window=10, max_batch=64, mode="power", power_of_two=True)
    samples = iter(list(long_tail_samples(4000, lo=64, hi=64)))  # one bucket
    batches = gov.batches(samples)
    for _ in range(4):
        gov.step(next(batches))
    first = gov.records[-1].micro_batch
    assert all(r.bound_bytes <= r.limit_bytes for r in gov.records)
    # the device suddenly measures 60% more than predicted: shrink at once
    corrector = gov.predictor.corrector
    for _ in range(20):
        corrector.update(100, 160)
    shrunk = gov.step(next(batches))
    assert shrunk.micro_batch < first
    # measurements agree with predictions again: grow, but only after the window
    gov.predictor.corrector = ResidualCorrector()
    for _ in range(14):
        gov.step(next(batches))
    after = list(gov.records)[-14:]
    assert all(r.step - shrunk.step >= 10 for r in after if r.micro_batch > shrunk.micro_batch)
    assert after[-1].micro_batch > shrunk.micro_batch
    assert all(r.bound_bytes <= r.limit_bytes for r in gov.records)
    assert all(r.micro_batch & (r.micro_batch - 1) == 0 for r in gov.records)  # powers of 2


def test_effective_batch_stays_constant(cache):
    gov = governor(
        cache,
        capacity_mib=192,
        keep_effective_batch=True,
        effective_batch=24,
        length_buckets=[64, 256],
        checkpointing=["none", "full"],
    )
    samples = list(long_tail_samples(120, hi=256, seed=3))
    for batch in gov.batches(iter(samples)):  # token batching, 24 samples per step
        gov.step(batch)
    for batch in fixed_batches(iter(samples), 24):  # the user's own batches of 24
        gov.step(batch)
    recs = list(gov.records)
    assert sum(r.samples for r in recs) == 240
    full = [r for r in recs if r.samples == 24]
    assert len(full) >= 6
    assert all(r.micro_batch * r.grad_accum >= 24 for r in full)
    assert {r.grad_accum for r in full} != {1}  # long buckets need accumulation
    assert gov.totals["ooms"] == 0


def test_a_warm_step_asks_the_model_nothing(cache):
    """Once a length bucket has been seen, the governor's per-step decision and bound are
    cache lookups: no model call (the per-step overhead in milliseconds is measured by
    benchmarks/governor.py, not asserted here: a timed test fails on a loaded machine)."""
    gov = governor(cache)
    batches = list(fixed_batches(long_tail_samples(120, lo=32, hi=32), 8))
    for b in batches[:3]:
        gov.step(b)
    calls, cached = gov.predictor.model_calls, gov.predictor.cache_size()
    for _ in range(50):
        gov.policy.decide(32, 8, gov.step_count)
        gov.predictor.bound(gov.base_graph, {"B": 8, "S": 32})
    for b in batches[3:]:
        gov.step(b)
    assert len(batches) > 6
    assert (gov.predictor.model_calls, gov.predictor.cache_size()) == (calls, cached)
    assert all(r.overhead_ms >= 0 for r in gov.records)


def test_batching_helpers():
    buckets = LengthBuckets(max_length=100, ratio=1.5, multiple=8)
    assert buckets.bounds[0] == 8 and buckets.bounds[-1] == 100
    assert buckets(1) == 8 and buckets(9) == 16 and buckets(100) == 100
    with pytest.raises(ValueError):
        buckets(101)
    assert even_chunks(10, 4) == [4, 3, 3]
    batch = {"x": torch.arange(10).view(10, 1), "y": torch.arange(10), "k": 3}
    parts = split(batch, [4, 3, 3])
    assert [p["y"].tolist() for p in parts] == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
    assert parts[1]["k"] == 3
    with pytest.raises(ValueError):
        split(batch, [4, 4])


def test_config_is_validated():
    for bad in (
        {"threshold": 0},
        {"mode": "grid"},
        {"checkpointing": ["some"]},
        {"precision": ["bf16"]},
        {"tiers": (0.9, 0.8, 0.7)},
        {"keep_effective_batch": True},
        {"growth": 1.0},
    ):
        with pytest.raises(ValueError):
            config(**bad)


def test_defragments_before_a_new_shape_that_needs_the_cache(cache):
    gov = governor(cache, capacity_mib=256)
    released = []
    empty = gov.device.empty_cache
    gov.device.empty_cache = lambda: (released.append(gov.device.memory_reserved()), empty())
    short = fixed_batches(long_tail_samples(8, lo=40, hi=40), 8)
    long = fixed_batches(long_tail_samples(8, lo=120, hi=120), 8)
    first, second = gov.step(next(short)), gov.step(next(long))
    assert first.bucket != second.bucket
    assert gov.totals["defragmentations"] == len(released) >= 1
    assert gov.totals["ooms"] == 0
    gov.step(next(fixed_batches(long_tail_samples(8, lo=120, hi=120, seed=1), 8)))
    assert gov.totals["defragmentations"] == len(released)  # same shape again: nothing to do


def test_the_governor_decides_and_measures_the_same_on_a_fake_executing_device(cache):
    runs = {}
    for execute in ("cpu", "fake"):
        torch.manual_seed(0)
        gov = MemoryGovernor(
            tiny_varlen_bundle(),
            TrainSpec.of(optimizer_impl="foreach"),
            device=EmulatedDevice(256 << 20, byte_scale=64, execute=execute),
            config=config(cache_dir=cache, checkpointing=["none"], max_length=256),
            predictor=AnalyticModel(),
        )
        for b in fixed_batches(long_tail_samples(48, hi=96), 16):
            gov.step(b)
        runs[execute] = [
            (r.micro_batch, r.grad_accum, r.measured_allocated_bytes, r.measured_reserved_bytes)
            for r in gov.records
        ]
        assert (gov.last_loss is None) == (execute == "fake")
    assert runs["fake"] == runs["cpu"]
    assert any(g > 1 for _, g, _, _ in runs["cpu"])  # the device was tight enough to split
