import torch

from predictor.capture import CaptureConfig, capture
from predictor.kernels import choose_sdpa
from predictor.spec import TrainSpec


def _qkv(dtype, d=64, kv_heads=4):
    q = torch.empty(2, 4, 16, d, dtype=dtype, device="meta")
    k = torch.empty(2, kv_heads, 16, d, dtype=dtype, device="meta")
    return q, k, k


def test_choose_sdpa_follows_cuda_rules():
    assert choose_sdpa(*_qkv(torch.bfloat16), None, sm=90) == "flash"
    assert choose_sdpa(*_qkv(torch.float16), None, sm=75) == "efficient"
    assert choose_sdpa(*_qkv(torch.float32), None, sm=90) == "efficient"
    mask = torch.empty(16, 16, dtype=torch.bool, device="meta")
    assert choose_sdpa(*_qkv(torch.bfloat16), mask, sm=90) == "efficient"
    assert choose_sdpa(*_qkv(torch.bfloat16, d=512), None, sm=90) == "efficient"  # no flash
    assert choose_sdpa(*_qkv(torch.bfloat16, kv_heads=2), None, sm=90) == "math"
    assert choose_sdpa(*_qkv(torch.bfloat16), None, sm=70) == "math"


def _ops(graph):
    return set(graph.paths[0].nodes["op"])


def test_cuda_target_uses_cuda_attention_kernels_and_records_scratch(tiny_gpt):
    bf16 = capture(tiny_gpt, TrainSpec(precision="amp-bf16"), CaptureConfig(target="cuda"))
    assert "_scaled_dot_product_flash_attention.default" in _ops(bf16)
    assert "_scaled_dot_product_flash_attention_backward.default" in _ops(bf16)
    p = bf16.paths[0]
    scratch = bf16.scratch_bytes(0, bf16.resolve_sizes({"B": 2, "S": 100}))
    bwd = [
        i
        for i, op in enumerate(p.nodes["op"])
        if op.startswith("_scaled_dot_product_flash") and "backward" in op
    ]
    # 2 heads, S rounded to 128, head dim 16: softmax_d + dq_accum, fp32
    assert all(int(scratch[i]) == 2 * 2 * 128 * 4 + 2 * 128 * 2 * 16 * 4 for i in bwd)
    assert int(scratch.sum()) == len(bwd) * (2 * 2 * 128 * 4 + 2 * 128 * 2 * 16 * 4)
    fp32 = capture(tiny_gpt, TrainSpec(), CaptureConfig(target="cuda"))
    assert "_scaled_dot_product_efficient_attention.default" in _ops(fp32)
    cpu = capture(tiny_gpt, TrainSpec(), CaptureConfig(target="cpu"))
    assert not any(
        "efficient" in op or op.startswith("_scaled_dot_product_flash_attention.")
        for op in _ops(cpu)
    )
    assert int(cpu.scratch_bytes(0, cpu.resolve_sizes({"B": 2, "S": 9})).sum()) == 0
