import pytest
from memgnn.predictor.capture.branches import CaptureError
from memgnn.predictor.capture.capture import CaptureConfig, capture
from memgnn.predictor.memory.analytic import sweep
from memgnn.predictor.spec.train import TrainSpec


def test_python_branch_is_enumerated_as_paths(early_exit):
    g = capture(early_exit, TrainSpec())
    assert len(g.paths) == 2
    assert [p.conditions[0]["value"] for p in g.paths] == [False, True]
    assert all(p.conditions[0]["kind"] == "bool" for p in g.paths)
    r = sweep(g, {"B": 4, "S": 9})
    exit_early, full = r.paths[1], r.paths[0]
    assert full.peak_bytes > exit_early.peak_bytes  # the full path runs one block more
    assert r.peak_bytes == full.peak_bytes


def test_torch_cond_is_enumerated_with_its_kind(cond_model):
    g = capture(cond_model, TrainSpec.of(steps="first"))
    assert len(g.paths) == 2
    assert {p.conditions[0]["kind"] for p in g.paths} == {"torch.cond"}
    r = sweep(g, {"B": 4, "S": 9})
    big = next(p for p in r.paths if p.conditions[0]["value"])
    small = next(p for p in r.paths if not p.conditions[0]["value"])
    assert big.peak_bytes > small.peak_bytes


def test_too_many_paths_fails_with_module_name(early_exit):
    with pytest.raises(CaptureError, match="more than 1 control-flow paths"):
        capture(early_exit, TrainSpec(), CaptureConfig(max_paths=1))


def test_moe_tokens_per_expert_get_bounded_symbols(tiny_moe):
    g = capture(tiny_moe, TrainSpec())
    assert len(g.data_symbols) == 4  # one per expert
    d = g.data_symbols["nz0"]
    sizes = {"B": 4, "S": 8}
    lo, bal, hi = (g.resolve_sizes(sizes, sc)["nz0"] for sc in ("min", "balanced", "worst"))
    assert (lo, bal, hi) == (0, 4 * 8 * 2 // 4, 4 * 8 * 2)
    assert d["op"] == "nonzero"
    peaks = [sweep(g, sizes, scenario=sc).peak_bytes for sc in ("min", "balanced", "worst")]
    assert peaks[0] < peaks[1] < peaks[2]


@pytest.mark.parametrize("scenario", ["min", "balanced", "worst"])
def test_moe_symbolic_matches_concrete_per_scenario(tiny_moe, scenario):
    sym = capture(tiny_moe, TrainSpec.of(steps="first"))
    sizes = {"B": 5, "S": 7}
    conc = capture(
        tiny_moe,
        TrainSpec.of(steps="first"),
        CaptureConfig(symbolic=False, sizes=sizes, scenario=scenario),
    )
    a = sym.storage_bytes(0, sym.resolve_sizes(sizes, scenario))
    b = conc.storage_bytes(0, conc.resolve_sizes(sizes, scenario))
    assert sym.paths[0].nodes["op"] == conc.paths[0].nodes["op"]
    assert list(a) == list(b)
