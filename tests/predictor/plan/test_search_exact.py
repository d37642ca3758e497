"""plan with an exact model: near the limit the exact answer decides, so a plan never
refuses a batch whose exact answer fits and never admits one whose answer does not."""

import pytest
from memgnn.predictor.memory.base import Prediction
from memgnn.predictor.plan.search import PlanConfig, plan
from memgnn.predictor.plan.space import SearchSpace


class Formula:
    """bytes = 10,000 + 1,000 * B, estimate x `scale`, bound x `bound_scale`."""

    def __init__(self, scale=1.0, bound_scale=1.0, method="gnn"):
        self.scale, self.bound_scale, self.method = scale, bound_scale, method
        self.version = f"formula-{scale}-{bound_scale}"
        self.calls = 0

    def predict(self, graph, queries):
        self.calls += len(queries)
        out = []
        for q in queries:
            v = 10_000 + 1_000 * q.sizes["B"]
            out.append(
                Prediction(
                    predicted_peak_bytes=int(v * self.scale),
                    upper_bound_bytes=int(v * self.scale * self.bound_scale),
                    metric="reserved",
                    breakdown={},
                    model_version=self.version,
                    method=self.method,
                )
            )
        return out


def truth(limit: int, max_batch: int, power_of_two: bool) -> int:
    fit = [b for b in range(1, max_batch + 1) if 10_000 + 1_000 * b <= limit]
    if power_of_two:
        fit = [b for b in fit if b & (b - 1) == 0]
    return max(fit, default=0)


def run(learned, limit, exact=None, power_of_two=False):
    space = SearchSpace(checkpointing=["none"], max_batch=500, power_of_two=power_of_two)
    cfg = PlanConfig(budget_bytes=limit)
    res = plan(learned, lambda train: "graph", _base(), space, cfg, exact=exact)
    return res.best.batch_size if res.best else 0, res


def _base():
    from memgnn.predictor.spec.train import TrainSpec

    return TrainSpec()


@pytest.mark.parametrize(
    ("scale", "bound_scale"),
    [(1.0, 1.25), (0.95, 1.0), (0.9, 1.05), (1.08, 1.0), (1.3, 1.0), (0.7, 1.0)],
    ids=["loose-bound", "under", "under-bound", "over", "far-over", "far-under"],
)
@pytest.mark.parametrize("power_of_two", [False, True])
def test_exact_decides_near_the_limit(scale, bound_scale, power_of_two):
    for limit in (40_000, 75_500, 137_000, 200_000):
        exact = Formula(method="replay")
        got, res = run(Formula(scale, bound_scale), limit, exact, power_of_two)
        assert got == truth(limit, 500, power_of_two), (limit, got)
        if got:
            assert res.best.prediction["method"] == "replay"
            assert res.best.bound_bytes <= limit
        assert exact.calls <= res.queries


def test_without_exact_the_learned_bound_decides():
    """The failure the exact path removes: a loose bound refuses, a low one admits."""
    assert run(Formula(1.0, 1.25), 137_000)[0] < truth(137_000, 500, False)
    assert run(Formula(0.9, 1.05), 137_000)[0] > truth(137_000, 500, False)


def test_exact_is_only_asked_near_the_limit():
    exact = Formula(method="replay")
    _, res = run(Formula(1.0, 1.02), 137_000, exact)
    # <= 6 near the limit, + 1 at B = 1 for the answer's decision (its per-sample slope)
    assert 0 < exact.calls <= 7 < res.queries
