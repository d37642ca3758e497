"""Inductor's buffers for a partitioned graph (`predictor.emulate.inductor`): which ops
fuse into their consumers' kernels, and which outputs are buffers."""

from __future__ import annotations

import torch
from memgnn.predictor.emulate.inductor import kind, materialised, run_fused
from memgnn.predictor.ir.recorder import StepRecorder


def _graph() -> torch.fx.GraphModule:
    """tanh(a * 2 + 1) @ w, summed after a relu."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(a, w):
        return torch.mm(torch.tanh(a * 2 + 1), w).relu().sum()

    return make_fx(f)(torch.randn(4, 4), torch.randn(4, 4))


def test_fused_intermediates_are_not_buffers():
    gm = _graph()
    kinds = {str(n.target): kind(n.target) for n in gm.graph.nodes if n.op == "call_function"}
    assert kinds["aten.mm.default"] == "extern"
    assert kinds["aten.tanh.default"] == kinds["aten.mul.Tensor"] == "fused"
    assert kinds["aten.sum.default"] == "buffered"
    kept = {str(n.target) for n in materialised(gm)}
    # the matmul's input (tanh) and output are buffers, the sum's fused relu and the
    # affine before tanh are not
    assert kept == {"aten.tanh.default", "aten.mm.default", "aten.sum.default"}


def test_only_buffers_reach_the_allocator():
    """Two buffers (tanh's, the matmul's) and the scalar sum; the affine and relu
    intermediates are never allocated."""
    gm = _graph()
    a, w = torch.randn(64, 32), torch.randn(32, 16)
    rec = StepRecorder()
    rec.register([a, w], "input")
    with rec:
        out = run_fused(gm, materialised(gm), [a, w])
    made = sorted(int(rec.storages[u].nbytes) for n in rec.nodes for u in n.new)
    assert made == [4, 64 * 16 * 4, 64 * 32 * 4]
    assert out.item() == torch.mm(torch.tanh(a * 2 + 1), w).relu().sum().item()
