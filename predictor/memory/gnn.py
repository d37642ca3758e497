"""The learned memory model: a graph encoder (once per graph) and a query head (per query).

`GraphEncoder` embeds one StepGraph path: an op-id embedding plus the node features of
`predictor.memory.features`, projected to `hidden`, then `layers` directed graph convolutions
(`DirConv`, a torch-geometric `MessagePassing` layer with separate weights for producers
and consumers, mean aggregation, residual, LayerNorm), pooled by `global_mean_pool` and
`global_max_pool`. `forward(x, edge_index, batch)` is the PyG entry used in training (a
`torch_geometric.data.Batch` of graphs, see `training.fit`); `forward_csr` computes the
same function with the same parameters for one graph from CSR neighbour lists with prefix
sums (float64 cumsum + gathers), which is what the ONNX encoder runs: onnxruntime's
ScatterElements is slow and its ScatterND(add) is not deterministic with threads.

`QueryHead` maps (graph embedding, query features) to, per metric (allocated, reserved,
device_total), a correction `mu` over the analytic estimate in natural-log space and an
upper bound `mu + relu(softplus(raw) + calibration)` trained with a pinball loss at
`quantile` and shifted on held-out data to the wanted coverage. Query features are
standardised inside the head (buffers set from the training set), so ONNX needs no extra
preprocessing.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from memgnn.predictor.memory.features import NUM_NODE_FEATURES, NUM_OPS, NUM_QUERY_FEATURES
from memgnn.predictor.memory.gnn_config import GNNConfig
from torch import Tensor, nn
from torch_geometric.nn import MessagePassing, global_max_pool, global_mean_pool

log = logging.getLogger(__name__)

__all__ = ["DirConv", "GNNConfig", "GraphEncoder", "MemoryGNN", "QueryHead", "memory_loss"]

NUM_METRICS = 3


def csr_mean(h: Tensor, neighbours: Tensor, ptr: Tensor) -> Tensor:
    """Mean of `h[neighbours]` per CSR row (`ptr`, length N+1) by float64 prefix sums."""
    msg = h.index_select(0, neighbours).to(torch.float64)
    csum = torch.cat([msg.new_zeros(1, msg.shape[1]), torch.cumsum(msg, dim=0)])
    total = csum.index_select(0, ptr[1:]) - csum.index_select(0, ptr[:-1])
    count = (ptr[1:] - ptr[:-1]).clamp(min=1).to(torch.float64)
    return (total / count.unsqueeze(1)).to(h.dtype)


class DirConv(MessagePassing):
    r"""Directed graph convolution with separate weights for a node's producers and consumers.

    .. math::
        h_i' = \mathrm{LN}\big(h_i + \mathrm{SiLU}(W_s h_i + b_s
               + W_{in} \operatorname{mean}_{j \to i} h_j
               + W_{out} \operatorname{mean}_{i \to j} h_j)\big)

    where `j -> i` ranges over the edges `(j, i)` of `edge_index` (row 0 source, row 1
    target: what node i consumes) and `i -> j` over the edges leaving i (its consumers);
    a mean over no edges is 0. Dropout (training only) acts on the SiLU output.

    Args:
        dim: node feature width (input = output).
        dropout: dropout probability on the update before the residual.

    Shapes:
        - input: node features `(N, dim)`, `edge_index` `(2, E)` (int64)
        - output: node features `(N, dim)`
    """

    def __init__(self, dim: int, dropout: float = 0.0):
        super().__init__(aggr="mean", flow="source_to_target")
        self.lin_self = nn.Linear(dim, dim)
        self.lin_in = nn.Linear(dim, dim, bias=False)
        self.lin_out = nn.Linear(dim, dim, bias=False)
        self.norm = nn.LayerNorm(dim)
        self.dropout = dropout
        self.reset_parameters()

    def reset_parameters(self) -> None:
        super().reset_parameters()
        for lin in (self.lin_self, self.lin_in, self.lin_out):
            lin.reset_parameters()
        self.norm.reset_parameters()

    def forward(
        self, x: Tensor, edge_index: Tensor | None, means: tuple[Tensor, Tensor] | None = None
    ) -> Tensor:
        """New node features.

        Args:
            x: node features.
            edge_index: the edges, source row 0 (PyG layout).
            means: the two neighbour means `(mean_{j->i}, mean_{i->j})` when the caller has
                computed them already (`GraphEncoder.forward_csr`, the ONNX path, by prefix
                sums); `edge_index` is then not read and may be None. Calling the layer
                (not a helper) there keeps the exported ONNX graph's node names.

        Shapes:
            - input: `x` `(N, dim)`, `edge_index` `(2, E)`, `means` two `(N, dim)`
            - output: `(N, dim)`
        """
        if means is None:
            if edge_index is None:
                raise ValueError("DirConv needs edge_index or the neighbour means")
            agg_in = self.propagate(edge_index, x=x)  # producers j -> i
            agg_out = self.propagate(edge_index.flip(0), x=x)  # consumers i -> j
        else:
            agg_in, agg_out = means
        m = F.silu(self.lin_self(x) + self.lin_in(agg_in) + self.lin_out(agg_out))
        m = F.dropout(m, self.dropout, self.training)
        return self.norm(x + m)

    def message(self, x_j: Tensor) -> Tensor:
        return x_j


class GraphEncoder(nn.Module):
    """Op embedding + node features -> `config.layers` `DirConv`s -> mean and max pool.

    Args:
        config: widths, depth and dropout (`GNNConfig`).
        num_features: node feature columns, the op id first (`predictor.memory.features`).
    """

    def __init__(self, config: GNNConfig, num_features: int = NUM_NODE_FEATURES):
        super().__init__()
        self.config = config
        self.num_features = num_features
        self.op_emb = nn.Embedding(NUM_OPS, config.op_dim)
        self.inp = nn.Linear(num_features - 1 + config.op_dim, config.hidden)
        self.convs = nn.ModuleList(
            DirConv(config.hidden, config.dropout) for _ in range(config.layers)
        )
        self.out_dim = 2 * config.hidden
        self.reset_parameters()

    def reset_parameters(self) -> None:
        self.op_emb.reset_parameters()
        self.inp.reset_parameters()
        for conv in self.convs:
            conv.reset_parameters()

    def _embed(self, x: Tensor) -> Tensor:
        op = x[:, 0].to(torch.int64).clamp(0, NUM_OPS - 1)
        return F.silu(self.inp(torch.cat([self.op_emb(op), x[:, 1:]], dim=1)))

    def forward(
        self, x: Tensor, edge_index: Tensor, batch: Tensor, num_graphs: int | None = None
    ) -> Tensor:
        """Embeddings of a batch of graphs (a `torch_geometric.data.Batch`'s fields).

        Args:
            x: node features; column 0 is the op id, the rest `predictor.memory.features`.
            edge_index: edges indexed into the concatenated nodes (source row 0).
            batch: graph of each node (PyG's `batch` vector, sorted).
            num_graphs: number of graphs G (default: `batch.max() + 1`).

        Shapes:
            - input: `x` `(N, num_features)`, `edge_index` `(2, E)`, `batch` `(N,)`
            - output: `(G, out_dim)`: mean pool, then max pool of the last layer
        """
        g = int(batch.max()) + 1 if num_graphs is None else num_graphs
        h = self._embed(x)
        for conv in self.convs:
            h = conv(h, edge_index)
        mean = global_mean_pool(h, batch, size=g)
        return torch.cat([mean, global_max_pool(h, batch, size=g)], dim=1)

    def forward_csr(
        self, x: Tensor, in_src: Tensor, in_ptr: Tensor, out_dst: Tensor, out_ptr: Tensor
    ) -> Tensor:
        """The embedding [1, out_dim] of one graph from CSR neighbour lists
        (`features.GraphInputs.csr()`); equal to `forward` up to float rounding."""
        h = self._embed(x)
        for conv in self.convs:
            h = conv(h, None, (csr_mean(h, in_src, in_ptr), csr_mean(h, out_dst, out_ptr)))
        return torch.cat([h.mean(0, keepdim=True), h.amax(0, keepdim=True)], dim=1)


class QueryHead(nn.Module):
    def __init__(self, config: GNNConfig, emb_dim: int, num_query: int = NUM_QUERY_FEATURES):
        super().__init__()
        self.config = config
        self.emb_dim, self.num_query = emb_dim, num_query
        self.register_buffer("q_mean", torch.zeros(num_query))
        self.register_buffer("q_std", torch.ones(num_query))
        self.register_buffer("calibration", torch.zeros(NUM_METRICS))
        dims = [emb_dim + num_query] + [config.head_hidden] * config.head_layers
        self.hidden = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.out = nn.Linear(dims[-1], 2 * NUM_METRICS)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for lin in self.hidden:
            lin.reset_parameters()
        nn.init.normal_(self.out.weight, std=1e-3)  # start at the analytic estimate
        nn.init.zeros_(self.out.bias)
        self.q_mean.zero_()
        self.q_std.fill_(1.0)
        self.calibration.zero_()

    def set_normalization(self, q: Tensor) -> None:
        """Standardise each query column over the training rows `q`. A column constant
        there (a training option no row draws) keeps unit scale: its value never reaches
        the head as a 1000-sigma input when a query sets it."""
        std = q.std(0, unbiased=False)
        self.q_mean.copy_(q.mean(0))
        self.q_std.copy_(torch.where(std > 1e-6, std.clamp(min=1e-3), torch.ones_like(std)))

    def forward(self, emb: Tensor, q: Tensor) -> Tensor:
        """[Q, 6]: log corrections `mu` (3 metrics), then log upper bounds (3 metrics)."""
        if not self.config.use_graph:
            emb = torch.zeros_like(emb)
        h = torch.cat([emb, (q - self.q_mean) / self.q_std], dim=1)
        for lin in self.hidden:
            h = F.dropout(F.silu(lin(h)), self.config.dropout, self.training)
        raw = self.out(h)
        mu, spread = raw[:, :NUM_METRICS], raw[:, NUM_METRICS:]
        upper = mu + F.relu(F.softplus(spread) + self.calibration)
        return torch.cat([mu, upper], dim=1)


class MemoryGNN(nn.Module):
    """Encoder + head; `forward` scores queries whose graphs are in one PyG-style batch."""

    def __init__(self, config: GNNConfig | None = None):
        super().__init__()
        self.config = config or GNNConfig()
        self.encoder = GraphEncoder(self.config)
        self.head = QueryHead(self.config, self.encoder.out_dim)

    def reset_parameters(self) -> None:
        self.encoder.reset_parameters()
        self.head.reset_parameters()

    def forward(
        self, x: Tensor, edge_index: Tensor, batch: Tensor, q: Tensor, query_graph: Tensor
    ) -> Tensor:
        """Head outputs `(Q, 6)` for queries `q` `(Q, num_query)` on a batch of graphs
        (`x`, `edge_index`, `batch` as in `GraphEncoder.forward`); `query_graph` `(Q,)` is
        each query's graph in the batch (PyG's `follow_batch` vector of the queries)."""
        emb = self.encoder(x, edge_index, batch)
        return self.head(emb.index_select(0, query_graph), q)


def memory_loss(out: Tensor, y: Tensor, mask: Tensor, quantile: float, beta: float = 0.01):
    """Smooth-L1 on `mu` plus pinball loss at `quantile` on the upper bound, over the
    (query, metric) entries `mask` marks as labelled; returns (total, mu part)."""
    mu, upper = out[:, :NUM_METRICS], out[:, NUM_METRICS:]
    y = torch.where(mask, y, torch.zeros_like(y))
    m = mask.to(out.dtype)
    denom = m.sum().clamp(min=1.0)
    fit = (F.smooth_l1_loss(mu, y, beta=beta, reduction="none") * m).sum() / denom
    diff = y - upper
    pinball = torch.maximum(quantile * diff, (quantile - 1.0) * diff)
    return fit + (pinball * m).sum() / denom, fit
