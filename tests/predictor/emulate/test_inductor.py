"""Inductor's own wrapper for a partitioned graph (`predictor.emulate.inductor`): lowered,
scheduled and planned by inductor, then run on the capture's fake tensors."""

from __future__ import annotations

import gc
import weakref

import torch
from memgnn.predictor.emulate import inductor
from memgnn.predictor.emulate.inductor import lower
from memgnn.predictor.ir.recorder import StepRecorder
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx


def f(a, w):
    """tanh(a * 2 + 1) @ w, summed after a relu."""
    return (torch.mm(torch.tanh(a * 2 + 1), w).relu().sum(),)


def _graph() -> torch.fx.GraphModule:
    return make_fx(f)(torch.randn(4, 4), torch.randn(4, 4))


def test_only_inductors_buffers_reach_the_allocator():
    """Inductor fuses the affine into tanh's kernel and the relu into the sum's: three
    buffers (tanh's, the matmul's output, the scalar), each recorded as it is made; each
    generated kernel is one op over the buffers it is passed."""
    mode = FakeTensorMode()
    with mode:
        a, w = torch.empty(64, 32), torch.empty(32, 16)
    code = lower(_graph(), [a, w], backward=False)
    assert code.source.count("empty_strided_cpu(") >= 3 and len(code.kernels) == 2
    rec = StepRecorder()
    with mode:
        rec.register([a, w], "input")
        args = [a, w]
        with rec:
            out = code.run(args)
    assert args == []  # boxed: the wrapper owns its inputs
    made = [int(rec.storages[u].nbytes) for n in rec.nodes for u in n.new]
    assert made == [64 * 32 * 4, 64 * 16 * 4, 4]
    kernels = [n for n in rec.nodes if n.op.startswith("inductor.cpp_fused")]
    assert len(kernels) == 2 and all(n.inputs for n in kernels)
    assert out[0].shape == ()


def test_repeated_blocks_share_one_wrapper():
    mode = FakeTensorMode()
    with mode:
        a, w = torch.empty(8, 8), torch.empty(8, 8)
    first = lower(_graph(), [a, w], backward=False)
    assert lower(_graph(), [a, w], backward=False) is first
    with mode:
        other = torch.empty(16, 8)
    assert lower(_graph(), [other, w], backward=False) is not first


def test_the_cache_is_one_captures_and_goes_with_it():
    """Another capture (its own fake mode and shape environment) lowers the same graph
    afresh, so inductor's lowering guards land in its environment; once a capture's
    fake mode is gone, so are its wrappers."""
    first_mode, second_mode = FakeTensorMode(), FakeTensorMode()
    with first_mode:
        a, w = torch.empty(8, 8), torch.empty(8, 8)
    first = lower(_graph(), [a, w], backward=False)
    with second_mode:
        b, v = torch.empty(8, 8), torch.empty(8, 8)
    assert lower(_graph(), [b, v], backward=False) is not first
    assert first_mode in inductor._CACHE
    gone = weakref.ref(first_mode)
    del first_mode, a, w, first
    gc.collect()
    assert gone() is None  # and with it its entry (other tests' captures may go too)
    assert second_mode in inductor._CACHE
