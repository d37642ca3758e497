import torch
from memgnn.predictor.capture.step import TrainingStep
from memgnn.predictor.ir.graph import StepGraph
from memgnn.predictor.ir.pathgraph import ExprInterner, path_from_recorder
from memgnn.predictor.ir.recorder import CATEGORIES, RecorderObserver, StepRecorder, register_state
from memgnn.predictor.memory.analytic import sweep
from memgnn.predictor.spec.train import TrainSpec


def test_views_and_inplace_ops_share_a_storage():
    rec = StepRecorder()
    with rec:
        a = torch.ones(4, 4)
        v = a.view(16)
        v.add_(1)
        b = a.t().contiguous()
    assert [n.op for n in rec.nodes][:4] == [
        "ones.default",
        "view.default",
        "add_.Tensor",
        "t.default",
    ]
    assert len(rec.nodes[0].new) == 1 and rec.nodes[1].new == [] and rec.nodes[2].new == []
    assert rec.nodes[2].outputs == rec.nodes[0].new
    assert len(rec.storages) == 2 and rec.storages[1].nbytes == 64
    del a, v, b


def test_frees_land_where_eager_pytorch_releases():
    rec = StepRecorder()
    with rec:
        a = torch.ones(8)
        b = a * 2
        del a
        c = b + 1
    assert rec.storages[0].free_node == 1  # a died right after node 1 (b = a * 2)
    assert rec.storages[1].free_node is None and c.numel() == 8


def test_real_step_state_matches_parameter_count(tiny_mlp):
    step = TrainingStep(tiny_mlp, TrainSpec(), device=torch.device("cpu"), target="cpu")
    rec = StepRecorder()
    register_state(rec, step.state_tensors())
    with rec:
        step.run({"B": 8}, RecorderObserver(rec))
    rec.close()
    interner = ExprInterner()
    path = path_from_recorder(rec, [], interner, {}, None)
    g = StepGraph(
        model={},
        train={},
        symbols={"B": 8},
        data_symbols={},
        guards=[],
        exprs=interner.sources,
        paths=[path],
    )
    n = sum(p.numel() for p in step.model.parameters())
    nbytes = g.storage_bytes(0, {"B": 8})
    alive_end = [u for u, f in enumerate(path.storages["free"]) if f == -1]
    by_cat = {c: 0 for c in CATEGORIES}
    for u in alive_end:
        by_cat[CATEGORIES[path.storages["category"][u]]] += int(nbytes[u])
    assert by_cat["parameter"] == 4 * n
    assert by_cat["optimizer_state"] == 2 * 4 * n + 4 * len(list(step.model.parameters()))
    assert sweep(g, {"B": 8}).peak_bytes > by_cat["parameter"] + by_cat["optimizer_state"]


def test_storages_made_under_placed_record_their_place():
    from memgnn.predictor.ir.recorder import placed

    rec = StepRecorder()
    with rec:
        a = torch.ones(16)
        with placed("pinned"):
            host = torch.empty_like(a)
            host.copy_(a)
        back = host * 2
    assert [s.place for s in rec.storages] == ["device", "pinned", "device"]
    assert rec.storages[1].nbytes == 64
    del a, host, back


def test_mark_place_reaches_a_recorder_that_sees_the_tensor_later():
    import gc

    from memgnn.predictor.ir.recorder import _MARKED, mark_place

    state = torch.zeros(8)  # made before any recorder, e.g. in an unrecorded warm-up step
    mark_place([state], "pageable")
    rec = StepRecorder()
    rec.register([state], "optimizer_state")
    assert rec.storages[0].place == "pageable"
    key = id(state.untyped_storage())
    del state
    gc.collect()
    assert key not in _MARKED  # forgotten with the storage


def test_an_unknown_place_is_refused():
    import pytest
    from memgnn.predictor.ir.recorder import mark_place, placed

    with pytest.raises(ValueError, match="unknown place 'gpu2'"):
        with placed("gpu2"):
            pass
    with pytest.raises(ValueError, match="unknown place"):
        mark_place([torch.zeros(1)], "disk")
