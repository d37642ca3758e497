"""`explain`: the peak of a run named, and the what-ifs replayed (`predictor.answer.explain`)."""

from __future__ import annotations

import pytest
from memgnn.predictor.answer.backend import LocalBackend
from memgnn.predictor.answer.explain import ExplainRequest, explain
from memgnn.predictor.answer.predict import predict
from memgnn.predictor.answer.types import ModelRef, PredictRequest, QueryConfig
from memgnn.predictor.errors import UserError
from memgnn.predictor.spec.train import TrainSpec
from tiny_models import tiny_gpt_bundle

CONFIG = QueryConfig(sizes={"B": 8, "S": 128})


class TinyBackend(LocalBackend):
    """The local backend with `tiny-gpt` as its only model (nothing cached on disk)."""

    def __init__(self) -> None:
        super().__init__(use_cache=False)

    def bundle(self, ref: ModelRef):
        assert ref.spec == "tiny-gpt"
        return tiny_gpt_bundle()


@pytest.fixture(scope="module")
def backend() -> TinyBackend:
    return TinyBackend()


@pytest.fixture(scope="module")
def answer(backend):
    req = ExplainRequest(model=ModelRef(spec="tiny-gpt"), config=CONFIG, top=5, whatifs=())
    return explain(req, backend)


def test_the_peak_is_the_predict_answer(answer, backend):
    pred = predict(PredictRequest(model=ModelRef(spec="tiny-gpt"), configs=[CONFIG],
                                  method="replay"), backend).predictions[0]  # fmt: skip
    assert answer.prediction.predicted_peak_bytes == pred.predicted_peak_bytes
    peak = answer.peak
    assert peak["metric"] == "reserved"
    assert peak["reserved_bytes"] == pred.predicted_peak_bytes == peak["peak_reserved_bytes"]
    assert peak["allocated_bytes"] == peak["requested_bytes"] + peak["rounding_bytes"]
    assert peak["phase"] in ("forward", "backward") and peak["module"]


def test_the_tables_add_up_and_are_cut_at_top(answer):
    total = answer.peak["requested_bytes"]
    for table in (answer.by_category, answer.by_module, answer.by_source, answer.by_op):
        assert sum(r["bytes"] for r in table) == total
    assert len(answer.by_module) <= 6 and len(answer.largest) == 5
    assert sum(r["bytes"] for r in answer.by_layer_module) == total
    cats = {r["name"] for r in answer.by_category}
    assert {"parameter", "activation", "cublas_workspace"} <= cats
    assert any(r["name"].startswith("tiny_models.py:") for r in answer.by_source)


def test_every_answer_says_what_it_assumed(answer):
    d = answer.to_dict()
    assert d["whatifs"] == [] and d["not_applicable"] == []
    assert any("what-if is a replay" in a for a in d["assumptions"])


def test_requests_are_checked():
    with pytest.raises(UserError, match="exactly one"):
        ExplainRequest(config=CONFIG)
    with pytest.raises(UserError, match="top"):
        ExplainRequest(model=ModelRef(spec="tiny-gpt"), top=0)
    with pytest.raises(UserError, match="unknown what-if"):
        ExplainRequest(model=ModelRef(spec="tiny-gpt"), whatifs=("fewer_layers",))


@pytest.mark.slow
def test_each_whatif_is_a_separate_predict_to_the_byte(backend):
    """Checkpointing and B/2 x 2 accumulation: the what-if's bytes are what `predict`
    gives for the changed run, asked separately (a fresh backend: its own captures)."""
    names = ("checkpointing", "accumulation", "expandable_segments")
    req = ExplainRequest(model=ModelRef(spec="tiny-gpt"), config=CONFIG, whatifs=names)
    out = explain(req, backend)
    got = {w["name"]: w for w in out.whatifs}
    assert set(got) == {"checkpointing", "accumulation", "expandable_segments"}
    base = out.prediction.predicted_peak_bytes
    fresh = TinyBackend()
    for name, train, sizes in (
        ("checkpointing", TrainSpec.of(checkpointing="full"), {"B": 8, "S": 128}),
        ("accumulation", TrainSpec.of(grad_accum=2), {"B": 4, "S": 128}),
    ):
        alone = predict(PredictRequest(model=ModelRef(spec="tiny-gpt"), train=train,
                                       configs=[QueryConfig(sizes=sizes)], method="replay"),
                        fresh).predictions[0]  # fmt: skip
        assert got[name]["predicted_peak_bytes"] == alone.predicted_peak_bytes
        assert got[name]["saved_bytes"] == base - alone.predicted_peak_bytes > 0
    assert got["checkpointing"]["cost"] > 1.0
    ranked = [w["saved_bytes"] for w in out.whatifs]
    assert ranked == sorted(ranked, reverse=True)
