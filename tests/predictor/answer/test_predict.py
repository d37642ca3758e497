"""`predict(PredictRequest, backend)`: one answer per config, routed, with what it assumed."""

from __future__ import annotations

import pytest
from memgnn.predictor.answer.backend import LocalBackend
from memgnn.predictor.answer.predict import autocast_gather_warnings, predict
from memgnn.predictor.answer.types import Correction, ModelRef, PredictRequest, QueryConfig
from memgnn.predictor.errors import UserError
from memgnn.predictor.memory.analytic import AnalyticModel
from memgnn.predictor.sim.simulate import simulate
from memgnn.predictor.spec.devices import get_profile
from memgnn.predictor.spec.train import TrainSpec

from tests.gloo_ranks import spawn_ranks


@pytest.fixture(scope="module")
def backend():
    return LocalBackend(learned=AnalyticModel())


def _req(*configs: QueryConfig, **kw) -> PredictRequest:
    return PredictRequest(model=ModelRef(spec="mlp"), configs=list(configs), **kw)


def test_replay_answers_are_the_simulators_bytes_for_every_config(backend):
    a100 = "a100-80gb"
    req = _req(QueryConfig(sizes={"B": 8}, device=a100, metric="allocated"),
               QueryConfig(sizes={"B": 8192}, device=a100, metric="allocated"),
               method="replay")  # fmt: skip
    answer = predict(req, backend)
    small, big = answer.predictions
    graph = backend.entry(small.graph_id).graph
    for a, b in ((small, 8), (big, 8192)):
        assert a.method == "replay" and a.breakdown["route"]["asked"] == "replay"
        sim = simulate(graph, {"B": b}, get_profile(a100))
        assert a.predicted_peak_bytes == a.upper_bound_bytes == sim.peak_allocated_bytes
    assert big.predicted_peak_bytes > small.predicted_peak_bytes
    assert small.train == TrainSpec().to_dict() and small.model["spec"] == "mlp"
    assert small.correction == Correction().to_dict()  # never corrected
    assert (small.correction["peak_scale"], small.correction["samples"]) == (1.0, 0)


def test_the_example_dims_fill_the_sizes_and_a_limit_gives_a_verdict(backend):
    answer = predict(_req(QueryConfig(device="a100-80gb"), threshold=0.5), backend)
    (a,) = answer.predictions
    assert a.sizes["B"] >= 1 and a.verdict["fits"] and a.verdict["source"] == "threshold"
    assert a.method == "replay"  # `auto`: one replay of a tiny graph fits the budget
    assert a.breakdown["route"]["asked"] == "auto"


def test_a_bad_config_is_a_user_error_naming_it(backend):
    with pytest.raises(UserError) as err:
        predict(_req(QueryConfig(sizes={"B": 2}), QueryConfig(sizes={"B": 0})), backend)
    assert err.value.loc == ("configs", 1, "sizes")
    with pytest.raises(UserError) as err:
        predict(_req(QueryConfig(device="cpu", metric="reserved")), backend)
    assert err.value.loc == ("configs", 0, "metric")
    bf16 = PredictRequest(model=ModelRef(spec="mlp"), train=TrainSpec.of(precision="bf16"),
                          configs=[QueryConfig(device="v100-16gb")])  # fmt: skip
    with pytest.raises(UserError, match="bfloat16") as err:
        predict(bf16, backend)
    assert err.value.loc == ("configs", 0, "device")


def test_an_uploaded_graph_is_answered_by_its_own_train_spec(backend):
    first = predict(_req(QueryConfig(sizes={"B": 4}, device="cpu")), backend).predictions[0]
    graph = backend.entry(first.graph_id).graph
    again = predict(PredictRequest(graph=graph, configs=[QueryConfig(sizes={"B": 4},
                    device="cpu")]), backend).predictions[0]  # fmt: skip
    assert again.predicted_peak_bytes == first.predicted_peak_bytes
    assert again.train == first.train and again.graph_id == first.graph_id


def _autocast_rank(rank: int, port: int, out: str) -> None:
    """A real 1-rank FSDP2 step's forward under bf16 autocast, checkpointed per layer: the
    bytes live at the forward's end with autocast's weight-cast cache on and off."""
    import json
    import os
    from pathlib import Path

    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from torch.utils.checkpoint import checkpoint

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=1)
    live = {}
    for cache in (True, False):
        layers = torch.nn.ModuleList(torch.nn.Linear(1024, 1024, bias=False) for _ in range(4))
        for layer in layers:
            fully_shard(layer)
        x = torch.randn(8, 1024, requires_grad=True)
        acts = [torch.profiler.ProfilerActivity.CPU]
        with torch.profiler.profile(activities=acts, profile_memory=True) as prof:
            with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=cache):
                with torch.profiler.record_function("fwd"):
                    y = x
                    for layer in layers:
                        y = checkpoint(layer, y, use_reentrant=False)
            y.float().sum().backward()
        events = prof.profiler.kineto_results.events()
        end = next(e.end_ns() for e in events if e.name() == "fwd")
        live[str(cache)] = sum(
            e.nbytes() for e in events if e.name() == "[memory]" and e.start_ns() <= end
        )
    dist.destroy_process_group()
    Path(out, f"rank{rank}.json").write_text(json.dumps(live))


def test_autocast_keeps_every_fsdp2_gathered_cast_and_the_answer_says_so(tmp_path):
    """The PyTorch fact `autocast_gather_warnings` states, on a real CPU step: with the
    cache, each of the 4 layers' bf16 cast (1024 x 1024 x 2 B) is alive at the forward's end."""
    (live,) = spawn_ranks(_autocast_rank, tmp_path, world=1)
    cast = 1024 * 1024 * 2  # (the CPU run's own few KiB of bookkeeping vary run to run)
    assert 4 * cast <= live["True"] - live["False"] < 5 * cast
    amp = TrainSpec.of(precision="amp-bf16", gpus=2, sharding="fsdp")
    (text,) = autocast_gather_warnings(amp, {"parameters": 10})
    assert "--fsdp-param-dtype bf16" in text and "20 B" in text
    policy = amp.with_options(fsdp_param_dtype="bf16", fsdp_reduce_dtype="fp32")
    assert autocast_gather_warnings(policy, None) == []
    assert autocast_gather_warnings(amp.with_options(precision="bf16"), None) == []
    assert autocast_gather_warnings(TrainSpec.of(precision="amp-bf16"), None) == []
