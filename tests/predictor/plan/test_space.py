import pytest
from memgnn.predictor.capture.capture import CaptureConfig, capture
from memgnn.predictor.memory.analytic import AnalyticModel
from memgnn.predictor.plan.search import PlanConfig, plan
from memgnn.predictor.plan.space import (
    SearchSpace,
    capture_spec,
    cost,
    layouts,
    pp_cost,
    tp_cost,
    variants,
    work_share,
)
from memgnn.predictor.spec.train import TrainSpec
from tiny_models import tiny_mlp_bundle


def test_variants_span_the_space_and_pair_one_gpu_with_no_sharding():
    space = SearchSpace(
        checkpointing=["none"],
        grad_accum=[1, 2],
        optimizer_impl=["foreach", "fused"],
        gpus=[1, 4],
        sharding=["ddp", "fsdp"],
    )
    got = {
        (t.optim.impl, t.parallel.gpus, t.parallel.sharding, t.loop.grad_accum)
        for t in variants(TrainSpec(), space)
    }
    parallel = {(1, "none"), (4, "ddp"), (4, "fsdp")}
    assert got == {(i, n, s, g) for i in ("foreach", "fused") for n, s in parallel for g in (1, 2)}


def test_invalid_combinations_are_left_out_and_none_valid_is_an_error():
    # hsdp needs >= 2 shard groups of >= 2 ranks: not on 2 GPUs, fine on 4
    space = SearchSpace(checkpointing=["none"], gpus=[2, 4], sharding=["hsdp"])
    assert {t.parallel.gpus for t in variants(TrainSpec(), space)} == {4}
    with pytest.raises(ValueError, match="no valid configuration.*hsdp"):
        variants(TrainSpec(), SearchSpace(checkpointing=["none"], gpus=[2], sharding=["hsdp"]))
    with pytest.raises(ValueError, match="adafactor has no fused"):
        variants(TrainSpec.of(optimizer="adafactor"), SearchSpace(optimizer_impl=["fused"]))


def test_bad_choices_are_named():
    with pytest.raises(ValueError, match="optimizer implementation 'turbo'"):
        SearchSpace(optimizer_impl=["turbo"])
    with pytest.raises(ValueError, match="sharding 'zero4'"):
        SearchSpace(sharding=["zero4"])
    with pytest.raises(ValueError, match="gpus choices"):
        SearchSpace(gpus=[0])


def test_accumulation_past_two_shares_the_graph_of_two():
    assert capture_spec(TrainSpec.of(grad_accum=8)) == TrainSpec.of(grad_accum=2)
    assert capture_spec(TrainSpec.of(grad_accum=1)) == TrainSpec.of(grad_accum=1)


def test_cost_ranks_implementations_and_communication():
    assert cost(TrainSpec.of(optimizer_impl="fused")) < cost(TrainSpec()) == 1.0
    assert cost(TrainSpec.of(optimizer_impl="for-loop")) > 1.0
    ddp = cost(TrainSpec.of(gpus=4, sharding="ddp"))
    fsdp = cost(TrainSpec.of(gpus=4, sharding="fsdp"))
    keep = cost(TrainSpec.of(gpus=4, sharding="fsdp", fsdp_reshard_after_forward=False))
    assert 1.0 < ddp == keep < fsdp  # ZeRO-3 / FSDP move 1.5x DDP's volume


class Counting:
    def __init__(self):
        self.asked: list[TrainSpec] = []
        self.graphs = {}

    def __call__(self, train):
        self.asked.append(train)
        key = repr(train.flat())
        if key not in self.graphs:
            self.graphs[key] = capture(tiny_mlp_bundle(), train, CaptureConfig(target="cpu"))
        return self.graphs[key]


@pytest.fixture(scope="module")
def counting():
    return Counting()


def test_plan_asks_for_one_graph_per_distinct_capture(counting):
    space = SearchSpace(
        checkpointing=["none"], grad_accum=[1, 2, 4, 8], optimizer_impl=["foreach", "fused"],
        max_batch=64,
    )  # fmt: skip
    res = plan(
        AnalyticModel(),
        counting,
        TrainSpec(),
        space,
        PlanConfig(budget_bytes=1 << 20, device="cpu"),
    )
    assert res.variants == 8 and res.graphs == 4  # {G=1, G>=2} x {foreach, fused}
    assert len(counting.asked) == 4 and {t.loop.grad_accum for t in counting.asked} == {1, 2}
    best = res.best
    assert best.grad_accum == 8 and best.optimizer_impl == "fused"  # B*G / cost
    assert best.decision["state_bytes"] == 30816


@pytest.mark.parametrize(
    "limit, fitting",
    [
        # peaks at B=1 on the cpu target: fused 31,184; foreach 38,520 (a temporary of the
        # whole parameter group); for-loop 43,104 (two temporaries of the largest tensor)
        (35_000, {"fused"}),
        (40_000, {"fused", "foreach"}),
        (44_000, {"fused", "foreach", "for-loop"}),
    ],
)
def test_optimizer_implementation_decides_what_fits(counting, limit, fitting):
    space = SearchSpace(
        checkpointing=["none"], optimizer_impl=["foreach", "for-loop", "fused"], max_batch=1
    )
    res = plan(
        AnalyticModel(), counting, TrainSpec(), space, PlanConfig(budget_bytes=limit, device="cpu")
    )
    got = {c.optimizer_impl for c in [res.best, *res.runners_up]}
    assert got == fitting
    assert res.best.optimizer_impl == "fused"


def test_offload_cost_is_copy_time_over_compute_time():
    from memgnn.predictor.plan.space import offload_cost

    # 1e9 parameters x 4096 tokens: 6 x 1e9 x 4096 FLOPs at 0.4 x 312 TFLOP/s = 0.197 s;
    # 1 GB offloaded: 2 x 1e9 B at 25 GB/s = 0.08 s, i.e. 0.406 of the compute
    ratio = (2 * 1e9 / 25e9) / (6 * 1e9 * 4096 / (0.4 * 312e12))
    assert offload_cost("save_on_cpu", 10**9, 10**9, 4096) == pytest.approx(1 + ratio)
    assert offload_cost("torchtune", 10**9, 10**9, 4096) == 1.0  # hidden behind compute
    assert offload_cost("torchtune", 4 * 10**9, 10**9, 4096) == pytest.approx(4 * ratio)
    assert offload_cost("none", 10**9, 10**9, 4096) == 1.0
    assert offload_cost("save_on_cpu", 0, 10**9, 4096) == 1.0


def test_variants_offer_activation_offloading_and_bad_kinds_are_named():
    space = SearchSpace(checkpointing=["none", "full"], offload_activations=["none", "torchtune"])
    got = {
        (t.activations.checkpointing, t.offload.activations) for t in variants(TrainSpec(), space)
    }
    assert got == {(c, o) for c in ("none", "full") for o in ("none", "torchtune")}
    with pytest.raises(ValueError, match="activation offloading 'disk'"):
        SearchSpace(offload_activations=["disk"])


def test_variants_keep_tensor_parallelism_alone_and_2d():
    """--tp 2: on 2 GPUs TP alone (sharding none), on 4 the 2-D fsdp; ddp with TP is left out."""
    space = SearchSpace(checkpointing=["none"], gpus=[2, 4], sharding=["none", "ddp", "fsdp"])
    got = {
        (t.parallel.gpus, t.parallel.sharding) for t in variants(TrainSpec.of(gpus=2, tp=2), space)
    }
    assert got == {(2, "none"), (4, "fsdp")}
    assert {t.parallel.tp for t in variants(TrainSpec.of(gpus=2, tp=2), space)} == {2}


def test_layouts_span_tp_and_pp_degrees_with_the_ranks_left_sharded():
    """On 8 GPUs, --tp {1, 2, 8} x --pp {1, 8}: each (tp, pp) dividing 8 leaves 8/(tp x pp)
    data-parallel ranks, sharded (fsdp) where several, none where one; the spec's refusals
    (--pp with --tp or with sharding, not modelled) left out."""
    space = SearchSpace(checkpointing=["none"], gpus=[8], sharding=["fsdp"], tp=[1, 2, 8],
                        pp=[1, 8])  # fmt: skip
    got = {
        (t.parallel.tp, t.parallel.pp, t.parallel.sharding, t.parallel.dp)
        for t in variants(TrainSpec.of(gpus=8, sharding="fsdp"), space)
    }
    assert got == {(1, 1, "fsdp", 8), (2, 1, "fsdp", 4), (8, 1, "none", 1), (1, 8, "none", 1)}
    with pytest.raises(ValueError, match="tp choices"):
        SearchSpace(tp=[0])
    with pytest.raises(ValueError, match="pipeline schedule"):
        SearchSpace(pp_schedule=["zigzag"])


def test_pipeline_schedules_and_microbatches_are_searched_for_pp_only():
    space = SearchSpace(checkpointing=["none"], gpus=[4], pp=[1, 4], sharding=["ddp"],
                        pp_schedule=["gpipe", "1f1b"], microbatches=[4, 8])  # fmt: skip
    got = {
        (t.parallel.pp, t.parallel.pp_schedule, t.parallel.pp_microbatches)
        for t in variants(TrainSpec.of(gpus=4, sharding="ddp"), space)
    }
    assert got == {(1, "1f1b", 1), (4, "gpipe", 4), (4, "gpipe", 8), (4, "1f1b", 4), (4, "1f1b", 8)}


def test_auto_layouts_keep_tp_in_a_node_and_pp_to_the_blocks():
    assert layouts(64) == {"tp": [1, 2, 4, 8], "pp": [1, 2, 4, 8, 16]}
    assert layouts(64, blocks=6) == {"tp": [1, 2, 4, 8], "pp": [1, 2, 4]}
    assert layouts(12) == {"tp": [1, 2, 4], "pp": [1, 2, 4]}


def test_layout_costs_bubble_and_tp_traffic_and_work_share():
    assert pp_cost(1, 1, "1f1b") == 1.0
    assert pp_cost(4, 4, "1f1b") == pytest.approx(1.75)  # 3 idle slots against 4 busy
    assert pp_cost(4, 4, "interleaved1f1b") == pytest.approx(1.375)  # 2 stages a rank
    assert tp_cost(1, 8192) == 1.0
    assert tp_cost(8, 8192) == pytest.approx(1 + 7 * 0.4 * 312e12 / (4.5 * 8192 * 300e9))
    assert tp_cost(8, 1024) > tp_cost(8, 8192)  # narrow layers: traffic weighs more
    assert work_share(TrainSpec.of(gpus=8, tp=8)) == pytest.approx(1 / 8)
    pipe = TrainSpec.of(gpus=4, pp=4, microbatches=8)
    assert work_share(pipe) == pytest.approx(2.0)  # 8 micro-batches through 1/4 of it
    assert cost(pipe) == pytest.approx(pp_cost(4, 8, "1f1b") * cost(TrainSpec()))


def test_the_layouts_the_spec_refuses_are_named_once_per_reason():
    refused: dict[str, str] = {}
    space = SearchSpace(checkpointing=["none", "full"], gpus=[4], sharding=["hsdp"], pp=[1, 2])
    trains = variants(TrainSpec.of(gpus=4, sharding="hsdp"), space, refused)
    assert {t.parallel.pp for t in trains} == {1}
    ((why, where),) = refused.items()  # two checkpointing choices, one reason
    assert why.startswith("--pp 2 with --sharding hsdp is not modelled yet")
    assert where.startswith("gpus=4 tp=1 pp=2 sharding=hsdp")
