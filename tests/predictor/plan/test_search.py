import pytest
from memgnn.predictor.capture.capture import capture
from memgnn.predictor.errors import LimitExceeded, UserError
from memgnn.predictor.memory.analytic import AnalyticModel
from memgnn.predictor.memory.base import Prediction
from memgnn.predictor.plan.search import PlanConfig, largest_batch, plan
from memgnn.predictor.plan.space import SearchSpace, cost
from memgnn.predictor.spec.train import TrainSpec


class LinearModel:
    """Bytes = 1000 + 100 * B (x2 with no checkpointing): a model with a known answer."""

    version = "linear"

    def predict(self, graph, queries):
        out = []
        for q in queries:
            per = 100 if graph == "ckpt" else 200
            v = 1000 + per * q.sizes["B"]
            out.append(
                Prediction(
                    predicted_peak_bytes=v,
                    upper_bound_bytes=v + 50,
                    metric="reserved",
                    breakdown={},
                    model_version="linear",
                )
            )
        return out


def graph_for(train):
    return "ckpt" if train.activations.checkpointing != "none" else "plain"


def test_largest_batch_power_and_binsearch():
    from memgnn.predictor.plan.search import _Prober

    space = SearchSpace(mode="binsearch", power_of_two=False)
    cfg = PlanConfig(budget_bytes=1000 + 200 * 37 + 50)
    prober = _Prober(LinearModel(), "plain", space, cfg)
    assert largest_batch(prober, 4096, "binsearch", power_of_two=False) == 37
    assert largest_batch(prober, 4096, "power", power_of_two=True) == 32
    assert prober.queries < 20  # bisection, not a scan
    tight = _Prober(LinearModel(), "plain", space, PlanConfig(budget_bytes=1100))
    assert largest_batch(tight, 4096, "power", power_of_two=True) == 0


def test_plan_trades_recompute_for_batch():
    space = SearchSpace(checkpointing=["none", "full"], power_of_two=True)
    res = plan(LinearModel(), graph_for, TrainSpec(), space, PlanConfig(budget_bytes=14_000))
    # none: B = 64 (13,850 bytes) ; full: B = 128 (13,850) but costs 4/3: 128/1.33 > 64
    assert res.best.checkpointing == "full" and res.best.batch_size == 128
    assert res.runners_up[0].checkpointing == "none" and res.runners_up[0].batch_size == 64
    assert res.best.bound_bytes <= 14_000


def test_plan_keeps_effective_batch():
    space = SearchSpace(checkpointing=["none"], effective_batch=256, power_of_two=True)
    res = plan(LinearModel(), graph_for, TrainSpec(), space, PlanConfig(budget_bytes=14_000))
    assert res.best.batch_size * res.best.grad_accum >= 256
    assert res.best.batch_size <= 64


def test_plan_reports_when_nothing_fits():
    res = plan(LinearModel(), graph_for, TrainSpec(), SearchSpace(), PlanConfig(budget_bytes=10))
    assert res.best is None and "not even batch size 1" in res.reason


def test_cost_orders_configs():
    assert cost(TrainSpec()) == 1.0
    assert cost(TrainSpec.of(checkpointing="full")) > cost(
        TrainSpec.of(checkpointing="blocks:1"), 4
    )
    assert cost(TrainSpec.of(precision="bf16")) > cost(TrainSpec.of(precision="amp-bf16"))


def test_bad_space_and_budget_are_named():
    with pytest.raises(ValueError, match="precision"):
        SearchSpace(precision=["fp8"])
    with pytest.raises(ValueError, match="budget"):
        PlanConfig(budget_bytes=0)


def test_plan_with_analytic_model_on_real_graphs(tiny_gpt):
    graphs = {}

    def real_graph_for(train):
        key = (train.numerics.precision, train.activations.checkpointing, train.loop.grad_accum > 1)
        if key not in graphs:
            graphs[key] = capture(tiny_gpt, train)
        return graphs[key]

    space = SearchSpace(sizes={"S": 64}, checkpointing=["none", "full"], max_batch=512)
    cfg = PlanConfig(budget_bytes=60 * 2**20, device="a100-80gb")
    res = plan(AnalyticModel(), real_graph_for, TrainSpec(), space, cfg)
    assert res.best is not None and res.best.bound_bytes <= cfg.limit
    assert res.best.prediction["metric"] == "reserved"


def test_a_plan_that_fits_nothing_lists_no_runner_up_and_names_the_closest_apart():
    """The closest config (B=1, over the limit) is not a candidate: a caller that takes
    best-or-first-runner-up must not be handed a config that does not fit."""
    space = SearchSpace(checkpointing=["none", "full"], power_of_two=True)
    res = plan(LinearModel(), graph_for, TrainSpec(), space, PlanConfig(budget_bytes=1100))
    assert res.best is None and res.runners_up == []
    assert res.closest is not None and res.closest.batch_size == 1
    assert res.closest.bound_bytes > 1100  # 1000 + 100 + 50 with checkpointing
    assert res.to_dict()["closest"]["batch_size"] == 1 and "B=1" in res.reason


def test_plan_offloads_activations_only_when_nothing_else_fits(tiny_gpt):
    from memgnn.predictor.capture.capture import CaptureConfig
    from memgnn.predictor.memory.base import Query

    graphs = {}

    def graphs_for(train):
        key = repr(train.flat())
        if key not in graphs:
            graphs[key] = capture(tiny_gpt, train, CaptureConfig(target="cuda"))
        return graphs[key]

    space = SearchSpace(
        checkpointing=["none"], offload_activations=["none", "save_on_cpu"], sizes={"S": 256},
        max_batch=64,
    )  # fmt: skip
    model = AnalyticModel()

    def bound(offload: str, b: int) -> int:
        graph = graphs_for(TrainSpec.of(offload_activations=offload))
        query = Query(sizes={"B": b, "S": 256}, device="a100-80gb")
        return model.predict(graph, [query])[0].upper_bound_bytes

    assert bound("save_on_cpu", 1) < bound("none", 1)
    tight = PlanConfig(budget_bytes=bound("save_on_cpu", 1), device="a100-80gb")
    res = plan(model, graphs_for, TrainSpec(), space, tight)
    assert res.best.offload_activations == "save_on_cpu" and res.best.batch_size == 1
    # with room for both, the copies over PCIe cost more than the batch they free
    roomy = PlanConfig(budget_bytes=bound("none", 8), device="a100-80gb")
    res = plan(model, graphs_for, TrainSpec(), space, roomy)
    assert res.best.offload_activations == "none"
    assert res.runners_up[0].offload_activations == "save_on_cpu"
    assert res.runners_up[0].batch_size > res.best.batch_size


def test_a_layout_the_capture_refuses_is_left_out_with_why():
    """A configuration whose capture refuses (e.g. --pp stages that do not split the blocks)
    is left out and named; where every one is refused, the first refusal is the answer."""

    def refusing(train):
        if train.activations.checkpointing != "none":
            raise UserError("the blocks do not split evenly")
        return "plain"

    space = SearchSpace(checkpointing=["none", "full"])
    res = plan(LinearModel(), refusing, TrainSpec(), space, PlanConfig(budget_bytes=14_000))
    assert res.best is not None and res.best.checkpointing == "none"
    assert res.left_out == ["checkpointing=full: the blocks do not split evenly"]
    with pytest.raises(UserError, match="split evenly"):
        plan(LinearModel(), refusing, TrainSpec(), SearchSpace(checkpointing=["full"]),
             PlanConfig(budget_bytes=14_000))  # fmt: skip

    def over(train):
        raise LimitExceeded("too many captures")

    with pytest.raises(LimitExceeded):  # a server's limit is never a left-out layout
        plan(LinearModel(), over, TrainSpec(), space, PlanConfig(budget_bytes=14_000))
