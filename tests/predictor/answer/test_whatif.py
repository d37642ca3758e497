"""Which what-ifs apply to a run, and how one is answered (`predictor.answer.whatif`)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from memgnn.predictor.answer.types import Answer, ModelRef, PredictRequest, QueryConfig
from memgnn.predictor.answer.whatif import WHATIFS, _candidates, run_whatifs
from memgnn.predictor.errors import UserError
from memgnn.predictor.spec.train import TrainSpec


def _names(train: TrainSpec, sizes: dict, attention: str | None = "sdpa") -> dict:
    return {c[0]: c for c in _candidates(train, sizes, WHATIFS, attention)}


def test_a_plain_run_gets_every_change():
    got = _names(TrainSpec(), {"B": 8, "S": 512})
    assert got["checkpointing"][2] == {"checkpointing": "full"}
    assert got["accumulation"][2:4] == ({"grad_accum": 2}, {"B": 4, "S": 512})
    assert got["optimizer_8bit"][2] == {"optimizer": "adamw8bit"}
    # the kernel the run resolved to (sdpa) is not a change
    assert {"attention:eager", "attention:flash"} <= set(got) and "attention:sdpa" not in got
    assert got["expandable_segments"][4] == "expandable_segments:True"
    assert {"offload_activations:save_on_cpu", "offload_activations:torchtune"} <= set(got)
    assert got["offload_optimizer"][2] == {"offload_optimizer": "torchao"}


def test_changes_already_made_are_said_not_to_apply():
    train = TrainSpec.of(checkpointing="full", optimizer="sgd", offload_optimizer="torchao",
                         grad_accum=4)  # fmt: skip
    got = _names(train, {"B": 3})
    assert len(got["checkpointing"]) == 2 and "already full" in got["checkpointing"][1]
    assert len(got["optimizer_8bit"]) == 2 and "sgd" in got["optimizer_8bit"][1]
    assert len(got["offload_optimizer"]) == 2
    assert len(got["accumulation"]) == 2 and "B=3" in got["accumulation"][1]
    assert _names(TrainSpec.of(grad_accum=4), {"B": 6})["accumulation"][2] == {"grad_accum": 8}


def test_an_unknown_whatif_is_a_user_error():
    with pytest.raises(UserError):
        _candidates(TrainSpec(), {}, ("bigger_gpu",), None)


def _answer(peak: int, **kw) -> Answer:
    fields = dict(
        predicted_peak_bytes=peak, upper_bound_bytes=peak, metric="reserved", method="replay",
        model_version="replay", breakdown={}, paths=[], sizes={"B": 8, "S": 16},
        device="h100-80gb", scenario="worst", graph_id="g", model={"blocks": 2},
        train=None, warnings=[], verdict=None, correction={}, uncorrected_peak_bytes=peak,
        uncorrected_upper_bound_bytes=peak, unknown_ops=[], predict_seconds=0.0,
    )  # fmt: skip
    return Answer(**(fields | kw))


def test_whatifs_are_answered_by_predict_ranked_and_failures_kept():
    base_req = PredictRequest(model=ModelRef(spec="m"), configs=[QueryConfig(sizes={"B": 8})],
                              method="replay")  # fmt: skip
    asked = []

    def fake_predict(req: PredictRequest) -> Answer:
        asked.append(req)
        t = req.train
        if t.optim.name == "adamw8bit":
            raise UserError("bitsandbytes is not installed")
        if t.activations.checkpointing == "full":
            return _answer(600, graph_id="ck")
        return _answer(900 if t.loop.grad_accum == 2 else 1000)

    names = ("accumulation", "optimizer_8bit", "checkpointing")
    done, skipped = run_whatifs(base_req, _answer(1000), None, fake_predict, names=names)
    assert [w.name for w in done] == ["checkpointing", "accumulation"]
    assert [w.saved_bytes for w in done] == [400, 100]
    assert done[0].graph_id == "ck" and done[0].cost == pytest.approx(4 / 3, abs=1e-4)
    assert skipped == [{"name": "optimizer_8bit", "why": "bitsandbytes is not installed"}]
    acc = next(r for r in asked if r.train.loop.grad_accum == 2)
    assert acc.configs[0].sizes == {"B": 4, "S": 16} and acc.method == "replay"
    assert replace(base_req).train == TrainSpec()  # the base request is not changed


def test_a_request_that_is_over_stops_the_whatifs():
    class Over(UserError):
        status = 503

    def cancelled(req: PredictRequest) -> Answer:
        raise Over("request cancelled")

    base_req = PredictRequest(model=ModelRef(spec="m"), configs=[QueryConfig(sizes={"B": 8})])
    with pytest.raises(Over):
        run_whatifs(base_req, _answer(1000), None, cancelled, names=("checkpointing",))


def test_an_allocator_whatif_on_a_step_that_does_not_fit_is_what_it_needs(one_thread):
    """A step over the device: the expandable_segments what-if is what the step needs with
    the setting (no device limit, as the answer's own figure), never the bytes reached
    when the replay ran out (a 'saving' the setting does not give)."""
    from memgnn.predictor.answer.whatif import _allocator_value
    from memgnn.predictor.capture.capture import CaptureConfig, capture
    from memgnn.predictor.sim.allocator import AllocatorConfig
    from memgnn.predictor.sim.simulate import simulate
    from memgnn.predictor.spec.devices import get_profile
    from tiny_models import tiny_gpt_bundle

    graph = capture(tiny_gpt_bundle(), TrainSpec(), CaptureConfig(target="cuda"))
    sizes = {"B": 256, "S": 1024}
    need = AllocatorConfig(expandable_segments=True).unlimited()
    big = simulate(graph, sizes, get_profile("h100-80gb"), scenario="worst", allocator=need)
    small = "custom-1gib-sm90"  # under the step's allocated peak
    device = get_profile(small)
    assert device.total_bytes < big.peak_allocated_bytes
    base = _answer(big.peak_reserved_bytes * 2, sizes=sizes, device=small)
    got = _allocator_value(graph, base, QueryConfig(sizes=sizes, scenario="worst"),
                           "expandable_segments:True")  # fmt: skip
    assert got == big.peak_reserved_bytes >= big.peak_allocated_bytes > device.total_bytes


def test_fsdp_mixed_precision_applies_to_autocast_over_fsdp2_only():
    amp = TrainSpec.of(precision="amp-bf16", gpus=2, sharding="fsdp")
    got = _names(amp, {"B": 8})["fsdp_mixed_precision"]
    assert got[2] == {"fsdp_param_dtype": "bf16", "fsdp_reduce_dtype": "fp32"}
    amp.with_options(**got[2])  # a valid run
    assert _names(TrainSpec(), {"B": 8})["fsdp_mixed_precision"][1].startswith("not FSDP2")
    done = amp.with_options(fsdp_param_dtype="bf16")
    assert "already" in _names(done, {"B": 8})["fsdp_mixed_precision"][1]
