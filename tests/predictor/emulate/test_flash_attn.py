"""flash-attn stand-ins: flash-attn v2's output sizes, backward scratch, and the HF path."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from memgnn.predictor.capture.capture import CaptureConfig, capture
from memgnn.predictor.emulate.flash_attn import (
    flash_attn_func,
    flash_attn_varlen_func,
    flash_scratch,
    hf_flash_kernels,
)
from memgnn.predictor.ir.recorder import StepRecorder
from memgnn.predictor.spec.train import TrainSpec
from tiny_models import LLAMA_HEADS, LLAMA_LAYERS, tiny_hf_llama_bundle
from torch._subclasses.fake_tensor import FakeTensorMode

transformers = pytest.importorskip("transformers")

B, S, H, HK, D = 2, 200, 8, 2, 40
BWD = torch.ops.memgnn.flash_attn_bwd.default


def _run(fn, *shapes, dtype=torch.bfloat16, **kwargs):
    """Forward + backward of `fn` on fake tensors, recorded; returns (nodes, out, grads)."""
    with FakeTensorMode():
        q, k, v = (torch.empty(s, dtype=dtype, requires_grad=True) for s in shapes)
        rec = StepRecorder(scratch=flash_scratch)
        with rec:
            out = fn(q, k, v, **kwargs)
            out.sum().backward()
        return rec.nodes, out, (q.grad, k.grad, v.grad)


def test_dense_sizes_match_flash_attn_v2():
    nodes, out, grads = _run(
        flash_attn_func, (B, S, H, D), (B, S, HK, D), (B, S, HK, D), causal=True
    )
    assert out.shape == (B, S, H, D)
    assert [g.shape for g in grads] == [(B, S, H, D), (B, S, HK, D), (B, S, HK, D)]
    fwd = next(n for n in nodes if n.op == "memgnn.flash_attn_fwd.default")
    assert len(fwd.new) == 4  # out (padded head dim), softmax_lse, empty p, rng_state
    (bwd,) = [n for n in nodes if n.op == "memgnn.flash_attn_bwd.default"]
    d8, s128, hd = 40, 256, 64  # head dim padded to 8; S to 128; dq_accum head dim to 32
    softmax_d = B * H * s128 * 4
    dq_accum = B * s128 * H * hd * 4
    expanded = 2 * B * S * H * d8 * 2  # GQA: dk, dv for all 8 heads, bf16
    assert bwd.scratch == softmax_d + dq_accum + expanded


def test_head_dim_padding_and_no_gqa_scratch():
    shapes = [(B, S, H, 36)] * 3  # 36 -> padded to 40 before the kernel
    nodes, out, grads = _run(flash_attn_func, *shapes)
    assert out.shape == (B, S, H, 36) and grads[0].shape == (B, S, H, 36)
    (bwd,) = [n for n in nodes if n.op == "memgnn.flash_attn_bwd.default"]
    assert bwd.scratch == B * H * 256 * 4 + B * 256 * H * 64 * 4


def test_varlen_sizes():
    total = 300
    with FakeTensorMode():
        q, k, v = (
            torch.empty(total, H, 64, dtype=torch.float16, requires_grad=True) for _ in "qkv"
        )
        cu = torch.empty(4, dtype=torch.int32)
        rec = StepRecorder(scratch=flash_scratch)
        with rec:
            out = flash_attn_varlen_func(q, k, v, cu, cu, 128, 128, causal=True)
            out.sum().backward()
    assert out.shape == (total, H, 64)
    (bwd,) = [n for n in rec.nodes if n.op == "memgnn.flash_attn_varlen_bwd.default"]
    rows = total + 128 * 3
    assert bwd.scratch == H * rows * 4 + rows * H * 64 * 4


def test_fp32_and_real_tensors_are_refused():
    with pytest.raises(ValueError, match="fp16/bf16"):
        _run(flash_attn_func, *[(1, 8, 2, 16)] * 3, dtype=torch.float32)
    q = torch.zeros(1, 8, 2, 16, dtype=torch.bfloat16)
    with pytest.raises(NotImplementedError, match="stand-in"):
        flash_attn_func(q, q, q)


def test_scratch_is_zero_for_other_ops():
    assert flash_scratch(torch.ops.aten.mm.default, ()) == 0


def test_hf_flash_kernels_restores_transformers_state():
    from transformers import modeling_flash_attention_utils as fa

    before = (fa._loaded_implementation, fa._flash_fn, fa._flash_varlen_fn)
    with hf_flash_kernels():
        assert fa.lazy_import_flash_attention("flash_attention_2")[0][0] is flash_attn_func
    assert (fa._loaded_implementation, fa._flash_fn, fa._flash_varlen_fn) == before


def test_an_hf_llama_captures_through_transformers_flash_path(tmp_path: Path):
    heads, layers = LLAMA_HEADS, LLAMA_LAYERS
    bundle = tiny_hf_llama_bundle(tmp_path, max_positions=256)
    train = TrainSpec.of(attention="flash", precision="bf16", steps="first")
    graph = capture(bundle, train, CaptureConfig(target="cuda", sizes={"B": 2, "S": 130}))
    p = graph.paths[0]
    ops = p.nodes["op"]
    assert ops.count("memgnn.flash_attn_fwd.default") == layers
    assert ops.count("memgnn.flash_attn_bwd.default") == layers
    assert not any("scaled_dot_product" in op for op in ops)
    scratch = [
        graph.exprs[e]
        for e, op in zip(p.nodes["scratch"], ops)
        if op.startswith("memgnn.flash_attn_bwd")
    ]
    assert len(set(scratch)) == 1  # one expression in B, S for every layer
    sizes = {"B": 3, "S": 300}
    values = graph.scratch_bytes(0, graph.resolve_sizes(sizes))
    (bwd_idx,) = [i for i, op in enumerate(ops) if op == "memgnn.flash_attn_bwd.default"][:1]
    s128, hd, d = 384, 32, 16
    want = 3 * heads * s128 * 4 + 3 * s128 * heads * hd * 4 + 2 * 3 * 300 * heads * d * 2
    assert int(values[bwd_idx]) == want
