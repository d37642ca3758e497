"""Features for the learned memory model, split by what they depend on.

- **Graph level** (`graph_inputs`, size independent, computed once per graph path and fed
  to the encoder): per node the op id (a fixed vocabulary of common aten ops, unknown ops
  hashed into buckets and flagged), the dtype and category of its largest new storage,
  phase / step / micro-step, position in the schedule, log2 bytes it allocates, frees and
  needs as scratch, how those bytes scale with the batch and the other size symbols, and
  live bytes / peak from `analytic.live_curve`; all evaluated at two fixed reference sizes
  (the trace sizes, and those scaled up) so the features never depend on a query. Edges
  are the data dependencies, sorted by destination.
- **Query level** (`query_features.PathContext`, per (sizes, device) and fed to the head):
  the columns are `QUERY_COLUMNS` here; `predictor.memory.query_features` computes them. Those
  from the training config are `config_features`: precision, optimizer (8-bit AdamW
  included) and its implementation, checkpointing, accumulation, and since schema 3 LoRA
  (on, log rank, dropout), the quantised base (nf4 / nf4-dq / int8) and the attention
  kernel, so the head tells a LoRA or QLoRA step from a full fine-tune of the same graph.

Bump FEATURE_SCHEMA_VERSION whenever a column changes meaning: shipped models record it
and refuse to load under another version.
"""

from __future__ import annotations

import logging
import zlib
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import chain, repeat
from typing import Any

import numpy as np
from memgnn.predictor.ir.graph import StepGraph
from memgnn.predictor.ir.recorder import PHASES
from memgnn.predictor.ir.vocab import FEATURE_CATEGORIES, fold_comm
from memgnn.predictor.memory.analytic import live_curve

log = logging.getLogger(__name__)

FEATURE_SCHEMA_VERSION = 3  # 3: fine-tuning columns (peft, LoRA rank, quantised base, attention)
OP_VOCAB: tuple[str, ...] = (
    "view", "t", "detach", "zeros_like", "mm", "mul", "lift_fresh", "add", "sum",
    "transpose", "addmm", "slice", "_unsafe_view", "pow", "native_layer_norm",
    "native_layer_norm_backward", "expand", "cat", "unsqueeze", "_foreach_mul_", "permute",
    "embedding", "clone", "embedding_dense_backward", "empty_like", "bernoulli_", "div_",
    "div", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_efficient_attention_backward", "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_flash_attention_backward",
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_flash_attention_for_cpu_backward", "arange", "gelu", "gelu_backward",
    "mean", "relu", "new_zeros", "threshold_backward", "unbind", "convolution",
    "convolution_backward", "stack", "randint", "zeros", "_log_softmax", "ones_like",
    "_log_softmax_backward_data", "_foreach_add_", "_foreach_lerp_", "_foreach_addcmul_",
    "_foreach_sqrt", "_foreach_div_", "_foreach_addcdiv_", "_foreach_mul", "_foreach_add",
    "_foreach_div", "_foreach_sub_", "_foreach_neg", "_foreach_maximum_", "_fused_adam_",
    "_fused_adamw_", "_fused_sgd_", "nll_loss_forward", "nll_loss_backward", "rsqrt", "add_",
    "mul_", "addcmul_", "addcdiv_", "lerp_", "sqrt", "empty", "native_batch_norm",
    "native_batch_norm_backward", "_native_batch_norm_legit_functional", "index",
    "index_put", "slice_backward", "new_full", "select", "neg", "lt", "squeeze", "eq",
    "_to_copy", "rand", "nonzero", "index_add_", "index_add", "index_select", "gt",
    "where", "sigmoid", "sigmoid_backward", "randn", "masked_fill", "scalar_tensor",
    "minimum", "maximum", "silu", "silu_backward", "split", "tanh", "tanh_backward", "sub",
    "log", "full_like", "ge", "le", "ne", "logical_not", "_softmax",
    "_softmax_backward_data", "topk", "scatter", "max_pool2d_with_indices",
    "max_pool2d_with_indices_backward", "copy_", "select_backward", "mkldnn_rnn_layer",
    "mkldnn_rnn_layer_backward", "bmm", "baddbmm", "native_dropout",
    "native_dropout_backward", "_amp_foreach_non_finite_check_and_unscale_",
    "_amp_update_scale_", "upsample_nearest2d", "upsample_nearest2d_backward", "gather",
    "avg_pool2d", "avg_pool2d_backward", "_adaptive_avg_pool2d",
    "_adaptive_avg_pool2d_backward", "cumsum", "exp", "abs", "clamp", "fill_", "zero_",
    "_efficient_attention_backward", "_flash_attention_backward", "scan", "cond",
    "profiler._record_function_enter_new", "profiler._record_function_exit", "remainder",
    "bitwise_and", "bitwise_not", "bitwise_or", "floor_divide", "cos", "sin", "masked_fill_",
    "nll_loss2d_forward", "nll_loss2d_backward", "new_empty_strided", "new_empty", "rsub",
    "fill", "ones", "full", "to", "_unsafe_index", "_unsafe_index_put", "alias",
)  # fmt: skip
HASH_BUCKETS = 16
NUM_OPS = len(OP_VOCAB) + HASH_BUCKETS
DTYPES = ("float32", "float16", "bfloat16", "float64", "int64", "int32", "bool", "uint8")
PRECISIONS = ("fp32", "bf16", "fp16", "amp-bf16", "amp-fp16")
OPTIMIZERS = ("sgd", "adam", "adamw", "adafactor", "adamw8bit")
IMPLS = ("foreach", "fused", "for-loop")
QUANTIZED = ("nf4", "nf4-dq", "int8")  # quantize_base; "none" is all zeros
ATTENTION = ("auto", "eager", "sdpa", "flash")
SCALE_UP = {"B": 16}  # the second reference point multiplies B by 16, other symbols by 4
SCALE_OTHER = 4
_VOCAB_INDEX = {name: k for k, name in enumerate(OP_VOCAB)}

NODE_COLUMNS: tuple[str, ...] = (
    "op_id", "unknown_op", *(f"dtype_{d}" for d in (*DTYPES, "other")),
    *(f"cat_{c}" for c in FEATURE_CATEGORIES), *(f"phase_{p}" for p in PHASES), "step", "micro",
    "position", "log_new", "log_new_big", "log_scratch", "log_freed", "n_new", "n_in",
    "n_out", "alias_only", "log_skipped", "b_exponent", "other_exponent", "live_frac",
    "live_frac_big", "near_peak", "near_peak_big",
)  # fmt: skip
QUERY_COLUMNS: tuple[str, ...] = (
    "log_b", "log_other_max", "log_tokens", "log_peak", "round_slack",
    *(f"peak_{c}" for c in FEATURE_CATEGORIES), *(f"peak_phase_{p}" for p in PHASES), "peak_steady",
    "first_over_steady", "small_frac", "mid_frac", "large_frac", "n_small", "n_mid",
    "n_large", "log_max_storage", "max_over_peak", "churn", "segment_slack", "scratch_frac",
    "seg_estimate", "large_churn", "n_large_allocs", "large_sizes", "ws_segment",
    "is_gpu", "log_total", "sm", "log_workspace", "workspace_over_peak", "pressure",
    *(f"prec_{p}" for p in PRECISIONS), *(f"opt_{o}" for o in OPTIMIZERS),
    *(f"impl_{i}" for i in IMPLS), "ckpt_none", "ckpt_full", "ckpt_blocks", "log_accum",
    "set_to_none", "peft_lora", "log_lora_r", "lora_dropout",
    *(f"quant_{k}" for k in QUANTIZED), *(f"attn_{a}" for a in ATTENTION), "log_nodes",
    "log_storages", "backward_frac", "unknown_frac",
)  # fmt: skip
NUM_NODE_FEATURES = len(NODE_COLUMNS)
NUM_QUERY_FEATURES = len(QUERY_COLUMNS)


@lru_cache(maxsize=4096)
def op_id(op: str) -> tuple[int, bool]:
    """(vocabulary id, unknown?) of an aten op name such as `mm.default`."""
    base = op.split(".default")[0]
    if base in _VOCAB_INDEX:
        return _VOCAB_INDEX[base], False
    base = base.rsplit(".", 1)[0] if "." in base else base
    if base in _VOCAB_INDEX:
        return _VOCAB_INDEX[base], False
    return len(OP_VOCAB) + zlib.crc32(base.encode()) % HASH_BUCKETS, True


def log_scale(v: Any, scale: float = 40.0) -> np.ndarray:
    return np.log2(1.0 + np.maximum(np.asarray(v, dtype=np.float64), 0.0)) / scale


@dataclass(kw_only=True, slots=True)
class GraphInputs:
    """Encoder inputs of one graph path: node features and dst-sorted dependency edges."""

    x: np.ndarray  # float32 [N, NUM_NODE_FEATURES]; column 0 is the op id
    edge_index: np.ndarray  # int64 [2, E], sorted by destination
    unknown_ops: list[str] = field(default_factory=list)

    @property
    def num_nodes(self) -> int:
        return int(self.x.shape[0])

    def csr(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(in_src, in_ptr, out_dst, out_ptr): neighbours grouped by node, for the
        prefix-sum aggregation the exported encoder uses."""
        n = self.num_nodes
        src, dst = self.edge_index
        order = np.argsort(src, kind="stable")
        in_ptr = np.concatenate([[0], np.cumsum(np.bincount(dst, minlength=n))])
        out_ptr = np.concatenate([[0], np.cumsum(np.bincount(src, minlength=n))])
        return src.copy(), in_ptr.astype(np.int64), dst[order].copy(), out_ptr.astype(np.int64)


def reference_sizes(graph: StepGraph) -> list[dict[str, int]]:
    """The two size points graph features are evaluated at: trace sizes, and scaled up."""
    small = dict(graph.symbols)
    big = {s: v * SCALE_UP.get(s, SCALE_OTHER) for s, v in small.items()}
    for guard in graph.guards:  # a static dim (pinned by a guard) keeps its trace value
        for s, v in small.items():
            if guard == f"({s} == {v})":
                big[s] = v
    return [graph.resolve_sizes(small, "balanced"), graph.resolve_sizes(big, "balanced")]


def _largest_per_node(n: int, alloc: np.ndarray, nbytes: np.ndarray, codes: np.ndarray):
    out = np.full(n, -1, dtype=np.int64)
    ok = alloc >= 0
    order = np.argsort(nbytes[ok], kind="stable")  # later writes (bigger) win
    out[alloc[ok][order]] = codes[ok][order]
    return out


def graph_inputs(graph: StepGraph, path: int = 0, *, compact: bool = True) -> GraphInputs:
    """Size-independent node features and edges of one path (see the module docstring).

    `compact` drops inert nodes (no new storage, no free, no scratch: views, detach,
    in-place updates), about half of a training step; edges then run from the last kept
    writer of a storage to each kept reader, and `log_skipped` counts the dropped nodes
    before each kept one."""
    p = graph.paths[path]
    n = p.num_nodes
    alloc = np.asarray(p.storages["alloc"], dtype=np.int64)
    free = np.asarray(p.storages["free"], dtype=np.int64)
    refs = reference_sizes(graph)
    sizes = [graph.storage_bytes(path, r) for r in refs]
    scratch = graph.scratch_bytes(path, refs[0])
    ops = p.nodes["op"]
    per_op = {op: op_id(op) for op in set(ops)}  # a step has ~100 distinct ops
    code = {op: 2 * i + u for op, (i, u) in per_op.items()}  # id and unknown flag at once
    codes_n = np.fromiter(map(code.__getitem__, ops), np.int64, n)
    ids, unknown = codes_n >> 1, codes_n & 1
    dtypes = p.storages["dtype"]
    codes = {d: k for k, d in enumerate(DTYPES)}.get  # other dtypes: len(DTYPES)
    dtype_code = np.fromiter(map(codes, dtypes, repeat(len(DTYPES))), np.int64, len(dtypes))
    x = np.zeros((n, NUM_NODE_FEATURES), dtype=np.float64)
    col = {name: k for k, name in enumerate(NODE_COLUMNS)}
    x[:, 0] = ids
    x[:, 1] = unknown
    top_dtype = _largest_per_node(n, alloc, sizes[1], dtype_code)
    top_cat = _largest_per_node(n, alloc, sizes[1], fold_comm(np.asarray(p.storages["category"])))
    rows = np.flatnonzero(top_dtype >= 0)
    x[rows, col["dtype_float32"] + top_dtype[rows]] = 1
    x[rows, col[f"cat_{FEATURE_CATEGORIES[0]}"] + top_cat[rows]] = 1
    x[np.arange(n), col[f"phase_{PHASES[0]}"] + np.asarray(p.nodes["phase"], dtype=np.int64)] = 1
    x[:, col["step"]] = p.nodes["step"]
    x[:, col["micro"]] = np.minimum(np.asarray(p.nodes["micro"]), 1)
    x[:, col["position"]] = np.arange(n) / max(n - 1, 1)
    ok = alloc >= 0
    new = [np.bincount(alloc[ok], weights=s[ok], minlength=n) for s in sizes]
    x[:, col["log_new"]] = log_scale(new[0])
    x[:, col["log_new_big"]] = log_scale(new[1])
    x[:, col["log_scratch"]] = log_scale(scratch)
    freed_bytes = np.bincount(free[free >= 0], weights=sizes[0][free >= 0], minlength=n)
    x[:, col["log_freed"]] = log_scale(freed_bytes)
    n_new = np.bincount(alloc[ok], minlength=n)
    x[:, col["n_new"]] = log_scale(n_new, 4)
    x[:, col["n_in"]] = log_scale(np.fromiter(map(len, p.nodes["inputs"]), np.int64, n), 4)
    n_out = np.fromiter(map(len, p.nodes["outputs"]), np.int64, n)
    x[:, col["n_out"]] = log_scale(n_out, 4)
    x[:, col["alias_only"]] = (n_out > 0) & (n_new == 0)
    x[:, col["b_exponent"]], x[:, col["other_exponent"]] = _exponents(graph, path, refs, alloc)
    for k, name in ((0, ""), (1, "_big")):
        _, live = live_curve(graph, path, sizes[k])
        peak = max(float(live.max()) if n else 0.0, 1.0)
        x[:, col[f"live_frac{name}"]] = live / peak
        x[:, col[f"near_peak{name}"]] = live >= 0.98 * peak
    unknown_ops = sorted(op for op, (_, u) in per_op.items() if u)
    if not compact or n == 0:
        return GraphInputs(x=x.astype(np.float32), edge_index=p.edges(), unknown_ops=unknown_ops)
    freed = np.bincount(free[free >= 0], minlength=n) > 0
    scratch_big = graph.scratch_bytes(path, refs[1]) > 0
    keep = (n_new > 0) | freed | scratch_big
    keep[0] = True
    kept = np.flatnonzero(keep)
    skipped = np.diff(np.concatenate([[-1], kept])) - 1
    x[kept, col["log_skipped"]] = log_scale(skipped, 8)
    return GraphInputs(
        x=x[kept].astype(np.float32),
        edge_index=_kept_edges(p, keep),
        unknown_ops=unknown_ops,
    )


def _flat(lists: list[list[int]], rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(node, position in its list, uid) of every entry of `lists[i]` for i in rows."""
    picked = [lists[i] for i in rows.tolist()]
    lengths = np.fromiter(map(len, picked), dtype=np.int64, count=len(picked))
    total = int(lengths.sum())
    uids = np.fromiter(chain.from_iterable(picked), dtype=np.int64, count=total)
    node = np.repeat(rows, lengths)
    starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
    return node, np.arange(total) - starts, uids


def _kept_edges(p: Any, keep: np.ndarray) -> np.ndarray:
    """Dependency edges among kept nodes (renumbered), sorted by destination: from the
    last kept node before a reader that wrote a storage it reads; per destination in the
    order its inputs first name each source (array operations, no loop over nodes)."""
    new_id = np.cumsum(keep) - 1
    kept = np.flatnonzero(keep)
    r_node, r_pos, r_uid = _flat(p.nodes["inputs"], kept)
    w_node, _, w_uid = _flat(p.nodes["outputs"], kept)
    if not len(r_node) or not len(w_node):
        return np.zeros((2, 0), dtype=np.int64)
    # events by (storage, node), a node's reads before its writes: each read then sees
    # the last write before it of the same storage
    uid = np.concatenate([r_uid, w_uid])
    node = np.concatenate([r_node, w_node])
    is_write = np.concatenate([np.zeros(len(r_uid), bool), np.ones(len(w_uid), bool)])
    order = np.lexsort((is_write, node, uid))
    uid, node, is_write = uid[order], node[order], is_write[order]
    idx = np.where(is_write, np.arange(len(uid)), -1)
    last = np.maximum.accumulate(idx)  # position of the latest write so far
    ok = (~is_write) & (last >= 0)
    ok[ok] &= uid[last[ok]] == uid[ok]  # the write is of the same storage
    reads = order[ok]  # positions among the read events
    src = new_id[node[last[ok]]]
    dst = new_id[r_node[reads]]
    pos = r_pos[reads]
    # one edge per (dst, src), at the first input naming it; then by dst, input position
    first = np.lexsort((pos, src, dst))
    dst, src, pos = dst[first], src[first], pos[first]
    new = np.ones(len(dst), dtype=bool)
    new[1:] = (dst[1:] != dst[:-1]) | (src[1:] != src[:-1])
    dst, src, pos = dst[new], src[new], pos[new]
    out = np.lexsort((pos, dst))
    return np.stack([src[out], dst[out]]).astype(np.int64)


def _exponents(graph: StepGraph, path: int, refs: list[dict[str, int]], alloc: np.ndarray):
    """Per node: how its new bytes scale with B and with the other symbols (log2 ratio / 2
    between the reference sizes and a point with that symbol doubled)."""
    n = graph.paths[path].num_nodes
    base = refs[0]
    ok = alloc >= 0
    b0 = np.bincount(alloc[ok], weights=graph.storage_bytes(path, base)[ok], minlength=n)
    out = []
    for doubled in (["B"], [s for s in graph.symbols if s != "B"]):
        pinned = [s for s in doubled if s in graph.symbols and f"({s} == {base[s]})" not in
                  graph.guards]  # fmt: skip
        if not pinned:
            out.append(np.zeros(n))
            continue
        sizes = {s: v * (2 if s in pinned else 1) for s, v in base.items() if s in graph.symbols}
        b1 = np.bincount(alloc[ok], weights=graph.storage_bytes(
            path, graph.resolve_sizes(sizes, "balanced"))[ok], minlength=n)  # fmt: skip
        ratio = np.where(b0 > 0, np.log2(np.maximum(b1, 1) / np.maximum(b0, 1)), 0.0)
        out.append(np.clip(ratio, 0, 4) / 2)
    return out


def config_features(train: dict[str, Any], target: str) -> np.ndarray:
    """The TrainSpec columns of QUERY_COLUMNS (`prec_*` to `attn_*`) of one config.

    Parallelism (`gpus`, `sharding`) has no column: a sharded graph is captured per rank,
    so its sizes and collectives are in the graph itself, and no corpus draws it."""
    from memgnn.predictor.capture.step import resolve_optimizer_impl
    from memgnn.predictor.spec.train import BY_NAME, TrainSpec

    spec = TrainSpec.of(**{k: v for k, v in train.items() if k in BY_NAME})
    impl = resolve_optimizer_impl(spec, target)
    blocks = spec.activations.checkpoint_blocks
    # every:N (blocks < -1: one block in N) has no count without the depth: 0
    count = 0.0 if blocks is None or blocks < 0 else log_scale(blocks, 4)
    lora = spec.adapter.method == "lora"
    return np.concatenate([
        [spec.numerics.precision == p for p in PRECISIONS],
        [spec.optim.name == o for o in OPTIMIZERS],
        [impl == i for i in IMPLS],
        [blocks is None, blocks == -1, count],
        [log_scale(spec.loop.grad_accum, 4), float(spec.optim.set_to_none)],
        [float(lora), log_scale(spec.adapter.r, 8) if lora else 0.0,
         spec.adapter.dropout if lora else 0.0],
        [spec.quant.base == k for k in QUANTIZED], [spec.kernels.attention == a for a in ATTENTION],
    ]).astype(np.float64)  # fmt: skip
