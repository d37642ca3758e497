"""The user-owned loop: the documented example as written (docs/tutorials/governor-loop.md),
rollback inside it, and the checks of the module and optimizer against what the governor
predicts for."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from memgnn.predictor.memory.analytic import AnalyticModel
from memgnn.predictor.spec.train import TrainSpec
from memgnn.serving.governor import EmulatedDevice, MemoryGovernor
from memgnn.serving.governor.demo import fixed_batches, long_tail_samples, tiny_varlen_bundle

from tests.serving.governor.governed import governor

EXAMPLE = Path(__file__).resolve().parents[3] / "docs" / "tutorials" / "governor-loop.md"
MiB = 1 << 20

pytestmark = pytest.mark.usefixtures("one_thread")


def documented_example() -> str:
    text = EXAMPLE.read_text()
    found = re.search(r"<!-- governor-loop-example -->\n```python\n(.*?)```", text, re.S)
    assert found, "the governor tutorial lost its loop example"
    return found.group(1)


def test_the_documented_loop_runs_as_written(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("MEMGNN_CACHE", str(tmp_path))
    scope: dict = {}
    exec(compile(documented_example(), str(EXAMPLE), "exec"), scope)
    gov, scaler = scope["gov"], scope["scaler"]
    assert [r.samples for r in gov.records] == [16, 16, 16, 16]
    assert gov.totals["ooms"] == 0 and scaler.get_scale() > 0
    assert all(r.measured_allocated_bytes and r.bound_bytes <= r.limit_bytes for r in gov.records)
    assert any(r.grad_accum > 1 for r in gov.records)  # the long batches were split
    assert capsys.readouterr().out.count("step ") == 4


def user_loop(gov, batches, *, fail_at=None, clip=1.0):
    """The documented loop with a ledger of the sample ids each optimizer step saw; raises an
    OOM in the forward of the `fail_at`-th micro-batch (counted over the whole run)."""
    model, opt, bundle = gov.model, gov.optimizer, gov.bundle
    calls, steps, plans = 0, [], []
    for batch in batches:
        for plan in gov.plan(batch):
            plans.append(plan)
            with plan:
                seen = []
                for mb in plan.micro_batches:
                    calls += 1
                    if calls == fail_at:
                        raise torch.OutOfMemoryError("injected OOM")
                    seen += mb.batch["sample_id"].tolist()
                    with plan.autocast():
                        loss = bundle.loss(model, mb.batch)
                    (loss * mb.weight).backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
                opt.step()
                opt.zero_grad(set_to_none=True)
                steps.append(sorted(seen))
    return steps, plans


def test_an_oom_in_the_users_loop_rolls_back_to_a_smaller_plan(cache):
    gov = governor(cache, max_batch=8)
    batches = list(fixed_batches(long_tail_samples(48, hi=96), 16))
    steps, plans = user_loop(gov, batches, fail_at=2)
    assert steps == [sorted(b["sample_id"].tolist()) for b in batches]  # each sample once
    assert gov.totals["ooms"] == 1 and gov.totals["rollbacks"] == 1
    assert plans[0].failure == "injected OOM" and plans[1].attempt == 1
    assert plans[1].micro_batch < plans[0].micro_batch
    assert plans[1].record is not None and plans[1].record.oom_retries == 1
    assert plans[0].micro_batches == []  # the failed attempt's batches were let go


def test_an_oom_after_the_optimizer_step_began_is_raised(cache):
    gov = governor(cache)

    def failing_step(*args, **kwargs):
        raise torch.OutOfMemoryError("OOM inside optimizer.step")

    gov.optimizer.register_step_post_hook(lambda *a: failing_step())
    batch = next(fixed_batches(long_tail_samples(8, hi=64), 8))
    with pytest.raises(torch.OutOfMemoryError, match="optimizer.step"):
        user_loop(gov, [batch])
    assert gov.totals["rollbacks"] == 0


def test_a_plan_used_without_with_is_an_error(cache):
    gov = governor(cache)
    batch = next(fixed_batches(long_tail_samples(8, hi=64), 8))
    with pytest.raises(RuntimeError, match="context manager"):
        for _plan in gov.plan(batch):
            pass


def build(bundle, device):
    torch.manual_seed(0)
    with device:
        return bundle.build()


def governed(model, optimizer, bundle=None, train=None):
    return MemoryGovernor(
        model,
        train or TrainSpec.of(optimizer="adamw", optimizer_impl="foreach"),
        bundle=bundle or tiny_varlen_bundle(),
        device=EmulatedDevice(256 * MiB),
        optimizer=optimizer,
        predictor=AnalyticModel(),
    )


def test_the_optimizer_must_be_the_one_predicted_for(cache, monkeypatch, caplog):
    monkeypatch.setenv("MEMGNN_CACHE", str(cache))
    bundle = tiny_varlen_bundle()
    model = build(bundle, EmulatedDevice(256 * MiB))
    with pytest.raises(ValueError, match="SGD, but the governor predicts for .*adamw"):
        governed(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    with pytest.raises(ValueError, match="amsgrad"):
        governed(model, torch.optim.AdamW(model.parameters(), amsgrad=True))
    with pytest.raises(ValueError, match="without momentum"):
        sgd = TrainSpec.of(optimizer="sgd", optimizer_impl="foreach")
        governed(model, torch.optim.SGD(model.parameters(), lr=0.1), train=sgd)
    head_only = torch.optim.AdamW(model.head.parameters())
    held = len(list(model.head.parameters()))
    with pytest.raises(ValueError, match=f"holds {held} parameter tensors, {held} of the"):
        governed(model, head_only)
    with caplog.at_level("WARNING"):
        governed(model, torch.optim.AdamW(model.parameters(), foreach=False))
    assert "transient memory may differ" in caplog.text
    gov = governed(model, torch.optim.AdamW(model.parameters(), foreach=True))
    assert gov.optimizer is not None


def test_adamw8bit_must_be_bitsandbytes_own(cache, monkeypatch):
    """predictor.emulate.optim8bit's AdamW8bit models memory only (its update is no AdamW): the
    governor, which trains, takes bitsandbytes' class and refuses the stand-in."""
    from memgnn.predictor.emulate.optim8bit import AdamW8bit

    monkeypatch.setenv("MEMGNN_CACHE", str(cache))
    model = build(tiny_varlen_bundle(), EmulatedDevice(256 * MiB))
    train = TrainSpec.of(optimizer="adamw8bit")
    with pytest.raises(ValueError, match="AdamW8bit, but the governor predicts for .*bitsandbytes"):
        governed(model, AdamW8bit(model.parameters()), train=train)


def test_the_module_must_be_the_bundles_model(cache, monkeypatch):
    monkeypatch.setenv("MEMGNN_CACHE", str(cache))
    other = tiny_varlen_bundle(hidden=48)
    model = build(other, EmulatedDevice(256 * MiB))
    with pytest.raises(ValueError, match="not the model the governor predicts for"):
        governed(model, torch.optim.AdamW(model.parameters(), foreach=True))


def test_an_oom_after_unscale_rolls_back_and_the_scaler_can_unscale_again(cache):
    scaler = torch.amp.GradScaler("cpu")
    gov = governor(cache, scaler=scaler)
    model, opt, bundle = gov.model, gov.optimizer, gov.bundle
    batch = next(fixed_batches(long_tail_samples(8, hi=64), 8))
    failed = []
    for plan in gov.plan(batch):
        with plan:
            for mb in plan.micro_batches:
                scaler.scale(bundle.loss(model, mb.batch) * mb.weight).backward()
            scaler.unscale_(opt)
            if not failed:  # e.g. clipping's norm buffers do not fit, once
                failed.append(plan.attempt)
                raise torch.OutOfMemoryError("injected OOM after unscale_")
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(opt)
            scaler.update()
            opt.zero_grad(set_to_none=True)
    assert failed == [0] and plan.attempt == 1 and plan.record.oom_retries == 1
    assert gov.totals["steps"] == 1 and gov.totals["rollbacks"] == 1
