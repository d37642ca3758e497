import threading

import pytest
import torch
import torch.nn.functional as F
from memgnn.predictor.capture.capture import CaptureConfig, capture
from memgnn.predictor.emulate.cuda_kernels import (
    cuda_dropout,
    efficient_backward_scratch,
    embedding_backward_scratch,
    flash_backward_scratch,
)
from memgnn.predictor.emulate.kernels import choose_sdpa
from memgnn.predictor.ir.recorder import StepRecorder
from memgnn.predictor.spec.train import TrainSpec
from tiny_models import _seq_bundle, tiny_gpt_bundle
from torch import nn

B, S, HIDDEN = 3, 5, 64


class Drop(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.out, self.drop = nn.Linear(16, HIDDEN), nn.Linear(HIDDEN, 3), nn.Dropout(0.1)

    def forward(self, x):
        return self.out(self.drop(self.fc(x)))


def _new_at(graph, op: str, sizes: dict[str, int]) -> list[list[tuple[int, str]]]:
    """For each node running `op`: the (bytes, dtype) of the storages it creates."""
    p = graph.paths[0]
    nbytes = graph.storage_bytes(0, graph.resolve_sizes(sizes))
    alloc, dtypes = p.array("storages", "alloc"), p.storages["dtype"]
    return [
        [(int(nbytes[u]), str(dtypes[u])) for u in range(len(alloc)) if alloc[u] == i]
        for i, name in enumerate(p.nodes["op"])
        if name == op
    ]


@pytest.mark.parametrize(("precision", "elem"), [("fp32", 4), ("bf16", 2)])
def test_dropout_mask_is_one_byte_per_element_on_cuda_and_the_input_dtype_on_cpu(precision, elem):
    numel = B * S * HIDDEN
    bundle = _seq_bundle("drop", Drop)
    train = TrainSpec.of(precision=precision)
    cuda = capture(bundle, train, CaptureConfig(target="cuda", mode="full"))
    # dropout_cuda<bool>: the bool mask first, then the output; backward: one output
    fwd = _new_at(cuda, "native_dropout.default", {"B": B, "S": S})
    assert fwd and all(new == [(numel, "bool"), (numel * elem, precision_dtype(precision))]
                       for new in fwd)  # fmt: skip
    bwd = _new_at(cuda, "native_dropout_backward.default", {"B": B, "S": S})
    assert bwd and all(new == [(numel * elem, precision_dtype(precision))] for new in bwd)
    assert not _new_at(cuda, "bernoulli_.float", {"B": B, "S": S})
    cpu = capture(bundle, train, CaptureConfig(target="cpu", mode="full"))
    masks = _new_at(cpu, "empty_like.default", {"B": B, "S": S})
    assert masks and all(new == [(numel * elem, precision_dtype(precision))] for new in masks)
    assert not _new_at(cpu, "native_dropout.default", {"B": B, "S": S})


def precision_dtype(precision: str) -> str:
    return {"fp32": "float32", "bf16": "bfloat16"}[precision]


def test_the_cpu_kernel_keeps_a_mask_in_the_input_dtype():
    """The real CPU step (what a CPU-target capture answers against): at::dropout on a CPU
    tensor takes `_dropout<false>`, whose fp32 mask MulBackward keeps for backward."""
    x = torch.randn(B, S, HIDDEN, requires_grad=True)
    rec = StepRecorder()
    with rec:
        y = F.dropout(x, 0.1, training=True)
        y.sum().backward()
    rec.close()
    ops = [n.op for n in rec.nodes]
    assert "empty_like.default" in ops and "native_dropout.default" not in ops
    (mask,) = [s for s in rec.storages if s.alloc_node == ops.index("empty_like.default")]
    assert (mask.nbytes, mask.dtype) == (B * S * HIDDEN * 4, "float32")


def test_cuda_dropout_is_undone_on_exit_and_kept_to_its_thread():
    x = torch.randn(4, 8, requires_grad=True)

    def ops_of_dropout() -> list[str]:
        rec = StepRecorder()
        with rec:
            F.dropout(x, 0.5, training=True)
        return [n.op for n in rec.nodes]

    seen: dict[str, list[str]] = {}
    with cuda_dropout():
        seen["inside"] = ops_of_dropout()
        other = threading.Thread(target=lambda: seen.setdefault("thread", ops_of_dropout()))
        other.start()
        other.join()
        # no training, p = 0: at::dropout returns its input, as on CUDA
        assert F.dropout(x, 0.0, training=True) is x
        assert F.dropout(x, 0.5, training=False) is x
    assert seen["inside"] == ["native_dropout.default"]
    assert "native_dropout.default" not in seen["thread"]
    assert "native_dropout.default" not in ops_of_dropout()


def test_bf16_layer_norm_keeps_fp32_statistics_on_cuda():
    bundle = tiny_gpt_bundle()
    tokens = 3 * 17
    cuda = capture(
        bundle, TrainSpec.of(precision="bf16"), CaptureConfig(target="cuda", mode="full")
    )
    for new in _new_at(cuda, "native_layer_norm.default", {"B": 3, "S": 17}):
        assert new[1:] == [(tokens * 4, "float32")] * 2  # layer_norm_cuda: acc type
    cpu = capture(bundle, TrainSpec.of(precision="bf16"), CaptureConfig(target="cpu", mode="full"))
    for new in _new_at(cpu, "native_layer_norm.default", {"B": 3, "S": 17}):
        assert new[1:] == [(tokens * 2, "bfloat16")] * 2


def test_efficient_attention_seed_and_offset_are_host_tensors():
    cuda = capture(tiny_gpt_bundle(), TrainSpec(), CaptureConfig(target="cuda", mode="full"))
    fwd = _new_at(cuda, "_scaled_dot_product_efficient_attention.default", {"B": 3, "S": 17})
    assert fwd and all([b for b, _ in new][2:] == [0, 0] for new in fwd)


def _meta(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, dtype=dtype, device="meta")


def test_flash_backward_scratch_rounds_the_head_dim_and_expands_grouped_heads():
    q, k = _meta(2, 8, 100, 80), _meta(2, 8, 100, 80)
    softmax_d, dq_accum = 2 * 8 * 128 * 4, 2 * 128 * 8 * 96 * 4  # head dim 80 -> 96
    assert flash_backward_scratch(q, k) == softmax_d + dq_accum
    q, k = _meta(2, 8, 100, 256), _meta(2, 2, 100, 256)  # GQA: dk, dv for all 8 heads
    expanded = 2 * (2 * 100 * 8 * 256 * 2)
    assert flash_backward_scratch(q, k) == 2 * 8 * 128 * 4 + 2 * 128 * 8 * 256 * 4 + expanded


def test_efficient_backward_scratch_follows_the_kernel_tiles():
    # bf16, head dim 128: the 128 x 128 tile kernel, dk/dv in registers; dq accumulator
    q = _meta(2, 4, 300, 128)
    tiles = 3 * 1 * (4 + 128 * 128)
    assert efficient_backward_scratch(q, q) == 2 * 4 * 300 * 4 + 2 * 4 * tiles * 4
    # sm86 without dropout: head dim 96 takes the 128 x 64 tile kernel
    q = _meta(2, 4, 300, 96)
    tiles = 3 * 2 * (4 + 128 * 64)
    assert efficient_backward_scratch(q, q, sm=86) == 2 * 4 * 300 * 4 + 2 * 4 * tiles * 4
    # bf16, head dim 160: 128 x 64 tiles up to 65536, dk and dv accumulated in fp32
    q = _meta(1, 2, 300, 160)
    splits = min(-(-300 // 64), 200 // 2)
    gq = 3 * 3 * (4 + 128 * 64)
    gkv = splits * 64 * (256 + 256)
    assert efficient_backward_scratch(q, q) == 1 * 2 * 300 * 4 + 2 * (gq + gkv) * 4
    # fp32: delta through (dO * O).sum(-1), or the workspace, whichever is larger
    q = _meta(2, 4, 300, 32, dtype=torch.float32)
    delta = 2 * 4 * 300 * 4
    product = 2 * 300 * 4 * 32 * 4 + 2 * 300 * 4 * 4
    workspace = 2 * 4 * (5 * 1 * (4 + 64 * 64)) * 4
    assert efficient_backward_scratch(q, q) == max(product + delta, delta + workspace)


def test_embedding_backward_sorts_above_3072_indices():
    grad = _meta(2, 1500, 64)
    idx = torch.empty(2, 1500, dtype=torch.long, device="meta")
    assert embedding_backward_scratch(grad, idx, False) == 0  # the direct kernel
    grad, idx = _meta(2, 2048, 64), torch.empty(2, 2048, dtype=torch.long, device="meta")
    n = 4096  # six int64 index buffers of n * 8 = 32768 bytes (a multiple of 512)
    expected = 6 * 32768 + 2 * 512 + n * 64 * 4  # + 2 counters + fp32 partial sums
    assert embedding_backward_scratch(grad, idx, False) == expected
    assert embedding_backward_scratch(grad, idx, True) == expected + 32768  # + counts
    edge = _meta(1, 3072, 64), torch.empty(1, 3072, dtype=torch.long, device="meta")
    assert embedding_backward_scratch(*edge, False) == 0
    past = _meta(1, 3073, 64), torch.empty(1, 3073, dtype=torch.long, device="meta")
    # 3073 x 8 = 24584 -> 25088; 3073 x 64 x 4 (fp32 sums of bf16 rows) = 786688 -> 786944
    assert embedding_backward_scratch(*past, False) == 6 * 25088 + 2 * 512 + 786944


def test_embedding_backward_scratch_is_a_formula_in_the_sizes():
    graph = capture(tiny_gpt_bundle(), TrainSpec(), CaptureConfig(target="cuda", mode="full"))
    ops = list(graph.paths[0].nodes["op"])
    at = [i for i, op in enumerate(ops) if op == "embedding_dense_backward.default"]
    small = graph.scratch_bytes(0, graph.resolve_sizes({"B": 3, "S": 17}))
    assert at and all(int(small[i]) == 0 for i in at)
    big = graph.scratch_bytes(0, graph.resolve_sizes({"B": 200, "S": 17}))
    n = 200 * 17  # 3400 > 3072: sorted, fp32 partial sums of the 32-wide rows
    expected = 6 * (-(-n * 8 // 512) * 512) + 2 * 512 + -(-n * 32 * 4 // 512) * 512
    assert all(int(big[i]) == expected for i in at)


def test_grouped_query_attention_runs_flash_or_math_on_cuda():
    q, kv = _meta(2, 8, 16, 64), _meta(2, 2, 16, 64)
    assert choose_sdpa(q, kv, kv, None, sm=90, enable_gqa=True) == "flash"
    assert choose_sdpa(q, kv, kv, None, sm=90) == "math"  # no enable_gqa: an error on CUDA
    mask = _meta(16, 16, dtype=torch.bool)
    assert choose_sdpa(q, kv, kv, mask, sm=90, enable_gqa=True) == "math"  # no efficient
    q32, kv32 = _meta(2, 8, 16, 64, dtype=torch.float32), _meta(2, 2, 16, 64, dtype=torch.float32)
    assert choose_sdpa(q32, kv32, kv32, None, sm=90, enable_gqa=True) == "math"


def test_an_hf_llama_with_grouped_heads_captures_cuda_kernels(tiny_llama):
    bf16 = capture(tiny_llama, TrainSpec.of(precision="amp-bf16"), CaptureConfig(target="cuda"))
    ops = set(bf16.paths[0].nodes["op"])
    assert "_scaled_dot_product_flash_attention.default" in ops
    assert not any(op.startswith("_scaled_dot_product_flash_attention_for_cpu") for op in ops)
    fp32 = capture(tiny_llama, TrainSpec(), CaptureConfig(target="cuda"))
    ops = set(fp32.paths[0].nodes["op"])
    # fp32 grouped-query attention: the math kernel, its S x S scores materialised
    assert "_softmax.default" in ops or "_safe_softmax.default" in ops
    assert not any("flash" in op or "efficient" in op for op in ops)
