"""Who holds the peak: names, categories and reasons of the live blocks
(`predictor.answer.attribute`) on the tiny GPT's captured step."""

from __future__ import annotations

import inspect

import pytest
import tiny_models
from memgnn.predictor.answer.attribute import blocks_at, group, layer_pattern, node_modules
from memgnn.predictor.sim.live import peak_moment
from memgnn.predictor.spec.devices import get_profile

SIZES = {"B": 16, "S": 256}


@pytest.fixture(scope="module")
def blocks(gpt_graph):
    m = peak_moment(gpt_graph, SIZES, get_profile("h100-80gb"), metric="allocated")
    return m, blocks_at(gpt_graph, m)


def test_every_live_byte_is_named_once(blocks):
    m, bs = blocks
    assert sum(b.bytes for b in bs) == m.requested_bytes
    assert [b.bytes for b in bs] == sorted((b.bytes for b in bs), reverse=True)
    for key in ("module", "source", "op", "category"):
        assert sum(r["bytes"] for r in group(bs, key)) == m.requested_bytes


def test_saved_activations_are_named_by_layer_module_and_line(blocks, gpt_graph):
    _, bs = blocks
    lines, first = inspect.getsourcelines(tiny_models.Block.forward)
    gelu_line = first + next(i for i, t in enumerate(lines) if "F.gelu(self.fc1(x))" in t)
    gelu = [b for b in bs if b.op.startswith("gelu.")]
    # one per block (the backward of block 0 has not yet run at the backward peak)
    assert gelu and {b.category for b in gelu} == {"activation"}
    assert {b.module for b in gelu} <= {"blocks.0", "blocks.1"}
    assert {b.source for b in gelu} == {f"tiny_models.py:{gelu_line}"}
    assert all(b.shape == [16, 256, 128] and b.dtype == "float32" for b in gelu)
    assert all(b.why.startswith("saved for backward: output of gelu.default") for b in gelu)
    fc1 = [b for b in bs if b.module.endswith(".fc1") and b.category == "activation"]
    assert fc1 and all(b.shape == [16 * 256, 128] for b in fc1)  # addmm: flattened rows


def test_parameters_are_named_by_their_module(blocks):
    _, bs = blocks
    params = {b.module for b in bs if b.category == "parameter"}
    assert {"emb", "head", "blocks.0.qkv", "blocks.1.fc2"} <= params
    assert all(
        b.why == "a parameter (alive for the whole run)" for b in bs if b.category == "parameter"
    )


def test_the_cublas_workspaces_are_blocks_of_their_own(blocks):
    _, bs = blocks
    ws = [b for b in bs if b.category == "cublas_workspace"]
    assert len(ws) == 2 and all(b.bytes == get_profile("h100-80gb").cublas_workspace_bytes
                                for b in ws)  # fmt: skip
    assert group(bs, "module")[0]["name"] in ("(cublas_workspace)",) or ws


def test_backward_ops_take_the_module_that_saved_their_inputs(gpt_graph):
    p = gpt_graph.paths[0]
    mods, smod = node_modules(p)
    back = [i for i, ph in enumerate(p.nodes["phase"]) if ph == 3]
    assert all(p.nodes["module"][i] == "" for i in back)  # recorded outside any forward
    # gelu's backward reads fc1's output, saved by gelu (run in the block's own forward)
    gb = [i for i in back if p.nodes["op"][i].startswith("gelu_backward")]
    assert gb and {mods[i] for i in gb} == {"blocks.0", "blocks.1"}
    # the matmul just before it reads gelu's output, saved by fc2's addmm: fc2's backward
    before = [max(j for j in back if j < i and p.nodes["op"][j] == "mm.default") for i in gb]
    assert {mods[j] for j in before} == {"blocks.0.fc2", "blocks.1.fc2"}
    # the weight gradient of the head: the head's own mm in backward
    grads = [u for u in range(p.num_storages) if p.storages["category"][u] == 1]
    assert "head" in {smod[u] for u in grads}


def test_group_folds_the_tail_into_one_row(blocks):
    _, bs = blocks
    rows = group(bs, "op", top=2)
    assert len(rows) == 3 and rows[2]["name"].startswith("(other: ")
    assert sum(r["blocks"] for r in rows) == len(bs)


def test_modules_fold_across_layers(blocks):
    _, bs = blocks
    assert layer_pattern("model.layers.12.mlp.down_proj") == "model.layers.*.mlp.down_proj"
    assert layer_pattern("blocks.1") == "blocks.*" and layer_pattern("head") == "head"
    rows = {r["name"]: r for r in group(bs, "layers")}
    per = [r for r in group(bs, "module") if r["name"] in ("blocks.0.fc1", "blocks.1.fc1")]
    assert rows["blocks.*.fc1"]["bytes"] == sum(r["bytes"] for r in per)


def test_each_gradient_is_named_by_the_module_of_its_parameter(gpt_graph):
    """A gradient is made in backward (no module runs there): its name comes from what
    its op reads. Each must be the module holding a parameter of its shape; the first
    layer's (whose input is the batch, not a saved activation) included."""
    from memgnn.predictor.ir.sources import storage_shapes

    p = gpt_graph.paths[0]
    _, smod = node_modules(p)
    shapes = storage_shapes(gpt_graph, 0)
    cat = p.storages["category"]

    def numel(u: int) -> int:  # a gradient may be made transposed or with a leading 1
        n = 1
        for d in shapes[u].split(","):
            n *= int(d)
        return n

    params = {(smod[u], numel(u)) for u in range(p.num_storages) if cat[u] == 0}
    grads = {(smod[u], numel(u)) for u in range(p.num_storages) if cat[u] == 1}
    assert len(params) > 10 and grads <= params
    assert {m for m, _ in grads} == {m for m, _ in params}
