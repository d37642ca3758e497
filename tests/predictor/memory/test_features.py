"""Node features: shapes, determinism, unknown ops."""

from __future__ import annotations

import numpy as np
import pytest
from memgnn.predictor.ir.graph import StepGraph
from memgnn.predictor.memory.features import (
    HASH_BUCKETS,
    NUM_NODE_FEATURES,
    NUM_QUERY_FEATURES,
    OP_VOCAB,
    graph_inputs,
    op_id,
)
from memgnn.predictor.memory.query_features import PathContext


def test_graph_inputs_shapes_and_edges(gpt_graph):
    full = graph_inputs(gpt_graph, compact=False)
    assert full.x.shape == (gpt_graph.paths[0].num_nodes, NUM_NODE_FEATURES)
    assert np.array_equal(full.edge_index, gpt_graph.paths[0].edges())
    gi = graph_inputs(gpt_graph)  # inert nodes (views, detach, ...) dropped
    n = gi.num_nodes
    assert n < full.num_nodes and gi.x.shape == (n, NUM_NODE_FEATURES)
    assert gi.x.dtype == np.float32 and gi.edge_index.max() < n
    assert np.isfinite(gi.x).all()
    src, dst = gi.edge_index
    assert (np.diff(dst) >= 0).all() and (src < dst).all()
    in_src, in_ptr, out_dst, out_ptr = gi.csr()
    assert in_ptr[-1] == out_ptr[-1] == len(src) and len(in_ptr) == n + 1
    # node i's in-neighbours are the sources of the edges ending at i
    i = int(dst[len(dst) // 2])
    assert sorted(in_src[in_ptr[i] : in_ptr[i + 1]]) == sorted(src[dst == i])
    assert sorted(out_dst[out_ptr[i] : out_ptr[i + 1]]) == sorted(dst[src == i])


def test_features_are_deterministic(gpt_graph, tmp_path):
    a = graph_inputs(gpt_graph)
    gpt_graph.save(tmp_path / "g.json.gz")
    b = graph_inputs(StepGraph.load(tmp_path / "g.json.gz"))
    assert np.array_equal(a.x, b.x) and np.array_equal(a.edge_index, b.edge_index)
    from memgnn.predictor.spec.devices import get_profile

    q1 = PathContext(gpt_graph).query({"B": 8, "S": 64}, get_profile("a100-80gb"))
    q2 = PathContext(gpt_graph).query({"B": 8, "S": 64}, get_profile("a100-80gb"))
    assert q1.features.shape == (NUM_QUERY_FEATURES,) and np.array_equal(q1.features, q2.features)


def test_unknown_ops_are_hashed_and_flagged(gpt_graph):
    assert op_id("mm.default") == (OP_VOCAB.index("mm"), False)
    assert op_id("_foreach_add_.Scalar") == (OP_VOCAB.index("_foreach_add_"), False)
    k, unknown = op_id("mylib.custom_thing.default")
    assert unknown and len(OP_VOCAB) <= k < len(OP_VOCAB) + HASH_BUCKETS
    assert op_id("mylib.custom_thing.default") == (k, True)  # stable across calls
    data = gpt_graph.content() | {"meta": gpt_graph.meta}
    data["paths"][0]["nodes"]["op"][3] = "mylib.custom_thing.default"
    graph = StepGraph.from_dict(data)
    gi = graph_inputs(graph, compact=False)
    assert gi.unknown_ops == ["mylib.custom_thing.default"]
    assert gi.x[3, 0] == k and gi.x[3, 1] == 1.0 and gi.x[:, 1].sum() == 1.0


def test_alias_is_in_the_vocabulary(gpt_graph):
    """Open slices are captured as `alias` (`predictor.emulate.kernels.eager_hooks`; HF causal LMs
    have them): graphs with it must not be reported as having unknown ops."""
    assert op_id("alias.default") == (OP_VOCAB.index("alias"), False)
    data = gpt_graph.content() | {"meta": gpt_graph.meta}
    data["paths"][0]["nodes"]["op"][3] = "alias.default"
    assert graph_inputs(StepGraph.from_dict(data), compact=False).unknown_ops == []


def _config_columns(train: dict, target: str = "cuda") -> dict[str, float]:
    from memgnn.predictor.memory.features import QUERY_COLUMNS, config_features

    values = config_features(train, target)
    start = QUERY_COLUMNS.index("prec_fp32")
    return dict(zip(QUERY_COLUMNS[start : start + len(values)], values.tolist()))


def test_config_columns_line_up_with_the_query_columns():
    from memgnn.predictor.memory.features import QUERY_COLUMNS

    cols = _config_columns({})
    names = list(cols)
    assert names[-1] == "attn_flash"  # the static graph columns come right after
    assert QUERY_COLUMNS[QUERY_COLUMNS.index("attn_flash") + 1] == "log_nodes"
    assert cols["opt_adamw"] == 1.0 and cols["impl_foreach"] == 1.0 and cols["attn_auto"] == 1.0
    assert sum(v for k, v in cols.items() if k.startswith(("peft", "lora", "quant"))) == 0.0


def test_config_columns_tell_fine_tuning_apart():
    """LoRA / QLoRA / the attention kernel / 8-bit AdamW each change the query features,
    so the head can tell a LoRA run from a full fine-tune of the same graph shape."""
    full = _config_columns({})
    lora8 = _config_columns({"peft": "lora", "lora_r": 8, "lora_dropout": 0.1})
    lora64 = _config_columns({"peft": "lora", "lora_r": 64})
    assert full["peft_lora"] == 0.0 and lora8["peft_lora"] == 1.0
    assert 0.0 < lora8["log_lora_r"] < lora64["log_lora_r"]
    assert lora8["lora_dropout"] == pytest.approx(0.1) and lora64["lora_dropout"] == 0.0
    for quant in ("nf4", "nf4-dq", "int8"):
        cols = _config_columns({"peft": "lora", "quantize_base": quant})
        assert [k for k in cols if k.startswith("quant_") and cols[k]] == [f"quant_{quant}"]
    for kernel in ("eager", "sdpa", "flash"):
        cols = _config_columns({"attention": kernel})
        assert [k for k in cols if k.startswith("attn_") and cols[k]] == [f"attn_{kernel}"]
    cols = _config_columns({"optimizer": "adamw8bit"})
    assert cols["opt_adamw8bit"] == 1.0 and cols["opt_adamw"] == 0.0
    # the rank of a config without LoRA says nothing: TrainSpec's default r is not a feature
    assert _config_columns({"lora_r": 64}) == full


def test_query_features_carry_the_fine_tuning_columns(gpt_graph):
    from memgnn.predictor.memory.features import QUERY_COLUMNS
    from memgnn.predictor.spec.devices import get_profile

    data = gpt_graph.content() | {"meta": gpt_graph.meta}
    data["train"] = dict(data["train"]) | {"peft": "lora", "lora_r": 16}
    lora = StepGraph.from_dict(data)
    dev = get_profile("a100-80gb")
    a = PathContext(gpt_graph).query({"B": 8, "S": 64}, dev).features
    b = PathContext(lora).query({"B": 8, "S": 64}, dev).features
    k = QUERY_COLUMNS.index("peft_lora")
    assert a[k] == 0.0 and b[k] == 1.0
    assert np.flatnonzero(a != b).tolist() == [k, k + 1]  # peft_lora, log_lora_r
