"""The GNN: the PyG layer against a hand computation, shapes, PyG vs prefix-sum (CSR)
aggregation, PyG vs onnxruntime on captured graphs (a fresh export and the shipped model),
config checks, and that it learns."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import torch
from memgnn.predictor.capture.capture import CaptureConfig, capture
from memgnn.predictor.memory.features import NUM_QUERY_FEATURES, graph_inputs
from memgnn.predictor.memory.gnn import DirConv, GNNConfig, MemoryGNN, memory_loss
from memgnn.predictor.memory.onnx_model import DEFAULT_MODEL_DIR, OnnxMemoryModel
from memgnn.predictor.spec.train import TrainSpec
from onnx import numpy_helper
from torch_geometric.data import Batch, Data
from torch_geometric.nn import MessagePassing

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors (tests/conftest.py)


@pytest.fixture(scope="module")
def captured():
    """Three zoo-style models captured for CUDA: an MLP, a 1-layer GPT, a two-path model."""
    from tests.conftest import CondModel, _seq_bundle, tiny_gpt_bundle, tiny_mlp_bundle

    cfg = CaptureConfig(target="cuda")
    bundles = (tiny_mlp_bundle(), tiny_gpt_bundle(layers=1), _seq_bundle("cond", CondModel))
    return [capture(b, TrainSpec(), cfg) for b in bundles]


@pytest.fixture(scope="module")
def inputs(captured):
    return [graph_inputs(g) for g in captured[:2]]


def _batch(inputs):
    """A PyG Batch of GraphInputs: (x, edge_index, batch)."""
    data = [Data(x=torch.from_numpy(gi.x), edge_index=torch.from_numpy(gi.edge_index))
            for gi in inputs]  # fmt: skip
    b = Batch.from_data_list(data)
    return b.x, b.edge_index, b.batch


def test_dirconv_is_a_pyg_layer_equal_to_a_hand_computation():
    # 4 nodes, edges 0->1, 0->2, 1->2, 2->3 (node 0 has no producers, node 3 no consumers)
    conv = DirConv(2)
    assert isinstance(conv, MessagePassing)
    with torch.no_grad():
        conv.lin_self.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 2.0]]))
        conv.lin_self.bias.copy_(torch.tensor([0.5, -0.5]))
        conv.lin_in.weight.copy_(torch.tensor([[0.0, 1.0], [1.0, 0.0]]))
        conv.lin_out.weight.copy_(torch.tensor([[-1.0, 0.0], [0.0, 0.5]]))
    x = torch.tensor([[1.0, 2.0], [3.0, 0.0], [0.0, -1.0], [2.0, 2.0]])
    edge_index = torch.tensor([[0, 0, 1, 2], [1, 2, 2, 3]])
    mean_in = [[0, 0], [1, 2], [2, 1], [0, -1]]  # means over producers, by hand
    mean_out = [[1.5, -0.5], [0, -1], [2, 2], [0, 0]]  # means over consumers
    expect = []
    for i, (a, b) in enumerate(x.tolist()):
        s = a + 0.5 + mean_in[i][1] - mean_out[i][0]  # W_s h + b_s + W_in m_in + W_out m_out
        t = 2 * b - 0.5 + mean_in[i][0] + 0.5 * mean_out[i][1]
        r = [a + s / (1 + np.exp(-s)), b + t / (1 + np.exp(-t))]  # residual + SiLU
        mu, var = np.mean(r), np.var(r)
        expect.append([(v - mu) / np.sqrt(var + 1e-5) for v in r])  # LayerNorm (weight 1)
    with torch.no_grad():
        got = conv(x, edge_index)
    np.testing.assert_allclose(got.numpy(), np.array(expect), rtol=1e-5, atol=1e-6)
    # the CSR entry (precomputed means) is the same function
    means = (
        torch.tensor(mean_in, dtype=torch.float32),
        torch.tensor(mean_out, dtype=torch.float32),
    )
    with torch.no_grad():
        torch.testing.assert_close(conv(x, None, means), got)
    with pytest.raises(ValueError, match="edge_index"):
        conv(x, None)


def test_state_dict_layout_is_the_pre_pyg_one():
    # the shipped model's weights (exported before the encoder used PyG) keep their names
    state = MemoryGNN(GNNConfig(hidden=4, layers=2, op_dim=3)).encoder.state_dict()
    conv = {k.removeprefix("convs.1.") for k in state if k.startswith("convs.1.")}
    assert conv == {"lin_self.weight", "lin_self.bias", "lin_in.weight", "lin_out.weight",
                    "norm.weight", "norm.bias"}  # fmt: skip
    assert {k for k in state if not k.startswith("convs.")} == {
        "op_emb.weight",
        "inp.weight",
        "inp.bias",
    }


def test_forward_shapes_and_bounds(inputs):
    torch.manual_seed(0)
    model = MemoryGNN(GNNConfig(hidden=16, layers=2, head_hidden=32))
    x, ei, batch = _batch(inputs)
    emb = model.encoder(x, ei, batch)
    assert emb.shape == (2, model.encoder.out_dim)
    q = torch.randn(5, NUM_QUERY_FEATURES)
    out = model(x, ei, batch, q, torch.tensor([0, 1, 1, 0, 1]))
    assert out.shape == (5, 6) and torch.isfinite(out).all()
    assert (out[:, 3:] >= out[:, :3]).all()  # upper bound >= correction


def test_csr_encoder_equals_pyg_encoder(inputs):
    torch.manual_seed(1)
    enc = MemoryGNN(GNNConfig(hidden=16, layers=3)).encoder.eval()
    x, ei, batch = _batch(inputs)
    with torch.no_grad():
        both = enc(x, ei, batch)
        for j, gi in enumerate(inputs):
            csr = [torch.from_numpy(a) for a in gi.csr()]
            one = enc.forward_csr(torch.from_numpy(gi.x), *csr)
            torch.testing.assert_close(one[0], both[j], rtol=1e-5, atol=1e-5)


def test_reset_parameters_is_seeded():
    torch.manual_seed(3)
    a = MemoryGNN(GNNConfig(hidden=8))
    torch.manual_seed(3)
    b = MemoryGNN(GNNConfig(hidden=8))
    for (_, p), (_, r) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(p, r)
    before = a.encoder.inp.weight.clone()
    torch.manual_seed(4)
    a.reset_parameters()
    assert not torch.equal(before, a.encoder.inp.weight)
    torch.manual_seed(4)
    b.reset_parameters()
    for (_, p), (_, r) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(p, r)


def test_it_overfits_a_tiny_set(inputs):
    torch.manual_seed(0)
    model = MemoryGNN(GNNConfig(hidden=16, layers=2, head_hidden=32))
    x, ei, batch = _batch(inputs)
    rng = np.random.default_rng(0)
    q = torch.from_numpy(rng.normal(size=(12, NUM_QUERY_FEATURES)).astype(np.float32))
    graph_of = torch.from_numpy(np.arange(12) % 2)
    y = torch.from_numpy(rng.uniform(0.0, 0.3, size=(12, 3)).astype(np.float32))
    mask = torch.ones(12, 3, dtype=torch.bool)
    mask[::3, 1:] = False  # cpu-like rows: allocated only
    model.head.set_normalization(q)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(150):
        loss, fit = memory_loss(model(x, ei, batch, q, graph_of), y, mask, 0.9)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(fit.item())
    assert losses[-1] < 0.1 * losses[0]


def _pyg_outputs(model: MemoryGNN, graph, q: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Per path of `graph`: PyG embeddings [paths, dim] and head outputs [paths, Q, 6]."""
    data = [graph_inputs(graph, k) for k in range(len(graph.paths))]
    x, ei, batch = _batch(data)
    with torch.no_grad():
        emb = model.encoder(x, ei, batch)
        out = [model(x, ei, batch, q, torch.full((len(q),), k)) for k in range(len(data))]
    return emb.numpy(), torch.stack(out).numpy()


def _onnx_outputs(onnx_model: OnnxMemoryModel, graph, q: np.ndarray):
    emb = onnx_model.encode(graph)
    return emb, np.stack([onnx_model.head(np.repeat(e[None], len(q), 0), q) for e in emb])


def test_pyg_model_agrees_with_its_onnx_export(captured, tmp_path):
    from memgnn.training.export import export_onnx, write_card

    torch.manual_seed(0)
    model = MemoryGNN(GNNConfig(hidden=16, layers=3, head_hidden=32)).eval()
    rng = np.random.default_rng(0)
    q = rng.normal(size=(6, NUM_QUERY_FEATURES)).astype(np.float32)
    model.head.set_normalization(torch.from_numpy(q))
    with torch.no_grad():  # a non-trivial correction and spread
        model.head.out.weight.normal_(std=0.05)
    info = export_onnx(model, graph_inputs(captured[0]), tmp_path)
    write_card(tmp_path, {"model_version": "gnn-test", "onnx": info, "metrics": {}})
    onnx_model = OnnxMemoryModel.load(tmp_path)
    for graph in captured:  # 1, 1 and 2 paths
        emb, out = _pyg_outputs(model, graph, torch.from_numpy(q))
        ort_emb, ort_out = _onnx_outputs(onnx_model, graph, q)
        np.testing.assert_allclose(ort_emb, emb, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(ort_out, out, rtol=1e-5, atol=1e-5)


def shipped_state_dict() -> tuple[GNNConfig, dict[str, torch.Tensor]]:
    """The shipped ONNX model's weights as a MemoryGNN state_dict. The exporter keeps
    parameter names, but for the bias-free lin_in/lin_out it stores W^T under a generated
    name; those are found by the MatMul node that reads them (`/convs.K/lin_in/MatMul`)."""
    card = json.loads((DEFAULT_MODEL_DIR / "model_card.json").read_text())
    state: dict[str, torch.Tensor] = {}
    for part in ("encoder", "head"):
        graph = onnx.load(str(DEFAULT_MODEL_DIR / f"{part}.onnx")).graph
        inits = {
            i.name: torch.from_numpy(numpy_helper.to_array(i).copy()) for i in graph.initializer
        }
        for node in graph.node:
            for name in node.input:
                if name.startswith("onnx::MatMul"):
                    key = "encoder" + node.name.removesuffix("/MatMul").replace("/", ".")
                    state[key + ".weight"] = inits.pop(name).T.contiguous()
        prefix = "encoder." if part == "encoder" else "head."
        state.update({(k if k.startswith(prefix) else prefix + k): v for k, v in inits.items()})
    return GNNConfig(**card["gnn"]), state


def test_shipped_onnx_model_loads_into_the_pyg_model_and_agrees(captured):
    """The PyG model needs no retraining: the shipped weights fill its state_dict exactly
    (strict load: same keys and shapes) and it answers what the shipped ONNX files do."""
    if not (DEFAULT_MODEL_DIR / "model_card.json").is_file():
        pytest.skip("no learned model shipped in predictor/memory/default_model")
    config, state = shipped_state_dict()
    model = MemoryGNN(config).eval()
    model.load_state_dict(state, strict=True)
    onnx_model = OnnxMemoryModel.load(DEFAULT_MODEL_DIR)
    rng = np.random.default_rng(1)
    q = (rng.normal(size=(5, NUM_QUERY_FEATURES)) * model.head.q_std.numpy()
         + model.head.q_mean.numpy()).astype(np.float32)  # fmt: skip
    for graph in captured:
        emb, out = _pyg_outputs(model, graph, torch.from_numpy(q))
        ort_emb, ort_out = _onnx_outputs(onnx_model, graph, q)
        np.testing.assert_allclose(ort_emb, emb, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(ort_out, out, rtol=1e-5, atol=1e-5)


def test_a_column_constant_in_training_keeps_unit_scale():
    """A query column no training row sets (an option the corpus never draws) must not be
    scaled by 1 / 1e-3 when a query sets it: it reaches the head as at most 1."""
    from memgnn.predictor.memory.gnn import QueryHead

    head = QueryHead(GNNConfig(), emb_dim=4, num_query=3)
    q = torch.tensor([[0.0, 1.0, 2.0], [0.0, 3.0, 2.0], [0.0, 5.0, 2.0]])
    head.set_normalization(q)
    assert head.q_std.tolist() == pytest.approx([1.0, (8 / 3) ** 0.5, 1.0])
    assert head.q_mean.tolist() == pytest.approx([0.0, 3.0, 2.0])
    scaled = (torch.tensor([1.0, 3.0, 2.0]) - head.q_mean) / head.q_std
    assert scaled.tolist() == pytest.approx([1.0, 0.0, 0.0])
