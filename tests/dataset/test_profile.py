import pytest
import torch
from memgnn.dataset.profile import ProfileConfig, profile, profile_many
from memgnn.predictor.spec.bundle import ModelBundle
from memgnn.predictor.spec.train import TrainSpec

CONFIGS = [
    TrainSpec(),
    TrainSpec.of(optimizer="sgd", grad_accum=3),
    TrainSpec.of(precision="amp-bf16", optimizer="adam"),
    TrainSpec.of(checkpointing="full", optimizer="adafactor"),
    TrainSpec.of(steps="steady", set_to_none=False),
]


@pytest.mark.parametrize("train", CONFIGS)
def test_sim_matches_real_cpu_run(tiny_gpt, train):
    sizes = {"B": 3, "S": 24}
    real = profile(tiny_gpt, train, sizes, ProfileConfig(backend="cpu"))
    sim = profile(tiny_gpt, train, sizes, ProfileConfig(backend="sim", device="cpu"))
    assert real.peak_reserved_bytes is None and real.device_total_bytes is None
    assert abs(sim.peak_allocated_bytes - real.peak_allocated_bytes) <= (
        0.01 * real.peak_allocated_bytes
    )
    # the profiler sees allocator events too: at least every live tensor byte
    assert real.stats["profiler_peak_bytes"] >= 0.99 * real.peak_allocated_bytes


def test_gpu_sim_reports_all_metrics_and_phases(tiny_gpt):
    rec = profile(
        tiny_gpt, TrainSpec(), {"B": 4, "S": 32}, ProfileConfig(backend="sim", device="a100-80gb")
    )
    assert rec.backend == "sim" and rec.device == "a100-80gb"
    assert rec.device_total_bytes > rec.peak_reserved_bytes >= rec.peak_allocated_bytes
    b = rec.breakdown
    assert max(b["first_step"]["reserved"], b["steady_state"]["reserved"]) == (
        rec.peak_reserved_bytes
    )
    assert {"forward", "backward", "optimizer"} <= set(b["phases"])
    # two cuBLAS workspaces (forward thread and autograd thread) stay allocated
    assert rec.peak_allocated_bytes >= 2 * 8_519_680
    assert rec.stats["would_oom"] is False and 0 < rec.stats["fragmentation_at_peak"] <= 1


def test_sim_flags_oom_on_a_small_device(tiny_gpt):
    from memgnn.predictor.sim.allocator import AllocatorConfig

    rec = profile(
        tiny_gpt,
        TrainSpec(),
        {"B": 4, "S": 32},
        ProfileConfig(
            backend="sim",
            device="a100-80gb",
            allocator=AllocatorConfig(capacity_bytes=16 * 2**20),  # < one 20 MiB segment
        ),
    )
    assert rec.stats["would_oom"] is True and "Tried to allocate" in rec.stats["oom_message"]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"sizes": {"B": 0, "S": 4}}, "size B must be >= 1"),
        ({"device": "v100-16gb", "precision": "amp-bf16"}, "no bfloat16"),
        ({"backend": "tpu"}, "unknown backend"),
    ],
)
def test_invalid_configs_are_named(tiny_gpt, kwargs, message):
    with pytest.raises(ValueError, match=message):
        cfg = ProfileConfig(backend=kwargs.get("backend", "sim"), device=kwargs.get("device"))
        train = TrainSpec.of(precision=kwargs.get("precision", "fp32"))
        profile(tiny_gpt, train, kwargs.get("sizes", {"B": 2, "S": 4}), cfg)
    with pytest.raises(ValueError, match="unknown optimizer"):
        TrainSpec.of(optimizer="lion")


def test_batch_continues_past_a_model_that_raises(tiny_mlp):
    class Boom(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(2, 2)

        def forward(self, x):
            raise RuntimeError("exploded mid-step")

    bad = ModelBundle(
        name="boom",
        family="boom",
        build=Boom,
        make_inputs=lambda s, d, t: {"x": torch.randn(s["B"], 2, device=d)},
        loss=lambda m, i: m(i["x"]).sum(),
        dims={"B": 2},
    )
    jobs = [(bad, TrainSpec(), {"B": 2}), (tiny_mlp, TrainSpec(), {"B": 8})]
    for backend in ("sim", "cpu"):
        recs = list(profile_many(jobs, ProfileConfig(backend=backend)))
        assert len(recs) == 2
        assert "exploded mid-step" in recs[0].error and recs[0].sizes == {"B": 2}
        assert recs[0].train["optimizer"] == "adamw"
        assert recs[1].error is None and recs[1].peak_allocated_bytes > 0


@pytest.mark.parametrize("capacity", [None, 16 * 2**20])
@pytest.mark.parametrize(
    "train", [TrainSpec(), TrainSpec.of(precision="amp-fp16", checkpointing="full", grad_accum=2)]
)
def test_compiled_replay_gives_the_python_simulators_record(tiny_gpt, train, capacity):
    from memgnn.predictor.sim.allocator import AllocatorConfig

    records = {}
    for replay in ("compiled", "python"):
        config = ProfileConfig(
            backend="sim",
            device="a100-80gb",
            replay=replay,
            allocator=AllocatorConfig(capacity_bytes=capacity) if capacity else None,
        )
        rec = profile(tiny_gpt, train, {"B": 4, "S": 32}, config).model_dump()
        rec.pop("seconds")
        records[replay] = rec
    assert records["compiled"] == records["python"]  # labels, breakdown, stats, OOM verdict
    assert records["compiled"]["stats"]["would_oom"] is (capacity is not None)


def test_unknown_replay_is_named():
    with pytest.raises(ValueError, match="unknown replay 'numba'"):
        ProfileConfig(backend="sim", replay="numba")
