"""The GNN: shapes, scatter vs prefix-sum aggregation, config checks, and that it learns."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from predictor.capture import CaptureConfig, capture
from predictor.features import NUM_QUERY_FEATURES, graph_inputs
from predictor.gnn import GNNConfig, MemoryGNN, memory_loss
from predictor.spec import TrainSpec

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors (tests/conftest.py)


@pytest.fixture(scope="module")
def inputs():
    from tests.conftest import tiny_gpt_bundle, tiny_mlp_bundle

    graphs = [capture(b, TrainSpec(), CaptureConfig(target="cuda"))
              for b in (tiny_mlp_bundle(), tiny_gpt_bundle(layers=1))]  # fmt: skip
    return [graph_inputs(g) for g in graphs]


def _batch(inputs):
    xs, eis, batch, offset = [], [], [], 0
    for j, gi in enumerate(inputs):
        xs.append(torch.from_numpy(gi.x))
        eis.append(torch.from_numpy(gi.edge_index) + offset)
        batch.append(torch.full((gi.num_nodes,), j))
        offset += gi.num_nodes
    return torch.cat(xs), torch.cat(eis, 1), torch.cat(batch)


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


def test_csr_encoder_equals_scatter_encoder(inputs):
    torch.manual_seed(1)
    enc = MemoryGNN(GNNConfig(hidden=16, layers=3)).encoder.eval()
    x, ei, batch = _batch(inputs)
    with torch.no_grad():
        both = enc(x, ei, batch)
        for j, gi in enumerate(inputs):
            csr = [torch.from_numpy(a) for a in gi.csr()]
            one = enc.forward_csr(torch.from_numpy(gi.x), *csr)
            torch.testing.assert_close(one[0], both[j], rtol=1e-5, atol=1e-5)


def test_config_validation():
    for bad in ({"hidden": 0}, {"quantile": 0.3}, {"dropout": 1.0}, {"layers": -1}):
        with pytest.raises(ValueError):
            GNNConfig(**bad)


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
