"""Source lines and shapes per node / storage (`predictor.ir.sources`)."""

from __future__ import annotations

import inspect
import sys

import pytest
import tiny_models
from memgnn.predictor.capture.capture import CaptureConfig, capture
from memgnn.predictor.ir.graph import StepGraph
from memgnn.predictor.ir.sources import (
    SourceFinder,
    display_path,
    node_sources,
    storage_shapes,
    store_sources,
)
from memgnn.predictor.spec.train import TrainSpec
from tiny_models import tiny_gpt_bundle


@pytest.fixture(scope="module")
def graphs() -> tuple[StepGraph, StepGraph]:
    bundle = tiny_gpt_bundle()
    on = capture(bundle, TrainSpec(), CaptureConfig(target="cuda"))
    off = capture(bundle, TrainSpec(), CaptureConfig(target="cuda", sources=False))
    return on, off


def _line(fn, text: str) -> int:
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(lines) if text in line)


def test_the_lines_do_not_change_the_graph_or_its_id(graphs):
    on, off = graphs
    assert on.graph_id == off.graph_id
    assert on.content() == off.content()
    assert "sources" in on.meta and "sources" not in off.meta
    assert node_sources(off, 0) is None and storage_shapes(off, 0) is None


def test_forward_ops_are_named_by_the_model_line_that_ran_them(graphs):
    g = graphs[0]
    p = g.paths[0]
    src = node_sources(g, 0)
    assert len(src) == p.num_nodes
    gelu_line = _line(tiny_models.Block.forward, "F.gelu(self.fc1(x))")
    gelu = [i for i, op in enumerate(p.nodes["op"]) if op.startswith("gelu.")]
    assert gelu and all(src[i] == f"tiny_models.py:{gelu_line}" for i in gelu)
    head_line = _line(tiny_models.TinyGPT.forward, "return self.head(x)")
    assert any(s == f"tiny_models.py:{head_line}" for s in src)
    # nothing inside torch or memgnn's own machinery is named
    assert not any(s.startswith(("torch/", "memgnn/predictor/ir/")) for s in src)


def test_backward_ops_are_named_by_the_loop_line_that_ran_backward(graphs):
    g = graphs[0]
    p = g.paths[0]
    src = node_sources(g, 0)
    back = [i for i, ph in enumerate(p.nodes["phase"]) if ph == 3]  # PHASES: backward
    assert back
    assert {src[i] for i in back} <= {s for s in src if "capture/step.py:" in s}


def test_shapes_are_size_formulas_of_the_graph_symbols(graphs):
    g = graphs[0]
    shapes = storage_shapes(g, 0)
    assert len(shapes) == g.paths[0].num_storages
    assert "B,S,32" in shapes  # the residual stream (d = 32)
    assert "50,32" in shapes  # the embedding table


def test_store_sources_moves_both_columns_and_reads_back():
    from memgnn.predictor.ir.graph import PathGraph

    p = PathGraph(conditions=[], nodes={"op": ["a", "b"], "source": ["f.py:1", "f.py:1"]},
                  storages={"nbytes": [0], "shape": ["B,4"]})  # fmt: skip
    g = StepGraph(model={}, train={}, symbols={}, data_symbols={}, guards=[], exprs=["0"],
                  paths=[p])  # fmt: skip
    store_sources(g)
    assert "source" not in p.nodes and "shape" not in p.storages
    assert g.meta["sources"] == {"table": ["f.py:1"], "paths": [[0, 0]]}
    assert node_sources(g, 0) == ["f.py:1", "f.py:1"]
    assert storage_shapes(g, 0) == ["B,4"]
    g.meta["sources"]["paths"][0].append(0)  # a column of the wrong length: ignored
    assert node_sources(g, 0) is None


def test_finder_skips_torch_and_names_the_caller():
    finder = SourceFinder()
    here = finder.find(sys._getframe())
    assert here.endswith(f"test_sources.py:{sys._getframe().f_lineno - 1}")


def test_display_path_is_relative_to_its_import_root():
    import torch

    assert display_path(torch.__file__) == "torch/__init__.py"
    assert display_path("/nowhere/x.py") == "/nowhere/x.py"


@pytest.mark.slow
def test_replicated_blocks_carry_the_lines_of_a_full_capture():
    bundle = tiny_gpt_bundle(6, depth_knob=True)
    fast = capture(bundle, TrainSpec(), CaptureConfig(target="cuda"))
    full = capture(bundle, TrainSpec(), CaptureConfig(target="cuda", mode="full"))
    assert fast.meta["capture"]["mode"] == "blocks"
    assert fast.graph_id == full.graph_id
    assert node_sources(fast, 0) == node_sources(full, 0)
    assert storage_shapes(fast, 0) == storage_shapes(full, 0)
