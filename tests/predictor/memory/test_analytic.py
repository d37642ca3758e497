import numpy as np
from memgnn.predictor.ir.graph import PathGraph, StepGraph
from memgnn.predictor.ir.vocab import CATEGORIES, PHASES
from memgnn.predictor.memory.analytic import round_bytes, sweep


def _graph():
    """param(100) alive; n0 makes a(8B) ; n1 makes b(4B*S), frees a ; n2 makes c(2), frees b."""
    cat = CATEGORIES.index
    path = PathGraph(
        conditions=[],
        nodes={
            "op": ["mm.default", "relu.default", "sum.default"],
            "phase": [PHASES.index("forward")] * 2 + [PHASES.index("backward")],
            "step": [0, 0, 1],
            "micro": [0, 0, 0],
            "module": ["", "", ""],
            "inputs": [[0], [1], [2]],
            "outputs": [[1], [2], [3]],
            "scratch": [4, 4, 4],
        },
        storages={
            "nbytes": [0, 1, 2, 3],
            "dtype": ["float32"] * 4,
            "category": [cat("parameter"), cat("activation"), cat("temporary"), cat("temporary")],
            "alloc": [-1, 0, 1, 2],
            "free": [-1, 1, 2, -1],
        },
    )
    return StepGraph(
        model={"name": "hand"},
        train={},
        symbols={"B": 1, "S": 1},
        data_symbols={},
        guards=[],
        exprs=["100", "8*B", "4*S", "2", "0"],
        paths=[path],
    )


def test_sweep_on_hand_built_schedule():
    g = _graph()
    g.validate()
    r = sweep(g, {"B": 1, "S": 10})
    # n0: 100+8=108 ; n1: 108+40=148 (a freed after) ; n2: 100+40+2=142
    assert r.peak_bytes == 148
    assert r.best.peak_node == 1 and r.best.peak_op == "relu.default"
    assert r.best.breakdown["parameter"] == 100
    assert r.best.breakdown["activation"] == 8 and r.best.breakdown["temporary"] == 40
    assert r.best.step_peaks == {"first": 148, "steady": 142}
    assert r.best.phase_peaks == {"forward": 148, "backward": 142}
    # at large B the first node dominates
    assert sweep(g, {"B": 100, "S": 1}).peak_bytes == 100 + 800 + 4


def test_round_bytes_to_blocks():
    assert list(round_bytes(np.array([0, 1, 512, 513]), 512)) == [0, 512, 512, 1024]


def test_kernel_scratch_counts_at_its_node_only():
    g = _graph()
    g.exprs.append("1000")
    g.paths[0].nodes["scratch"][2] = 5
    g._table = None
    r = sweep(g, {"B": 1, "S": 10})
    assert r.peak_bytes == 142 + 1000 and r.best.peak_node == 2
