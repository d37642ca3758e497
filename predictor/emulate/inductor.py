"""What inductor allocates for a partitioned graph, approximated (`predictor.emulate.compile`
runs AOTAutograd's partition; this module runs its graphs as inductor's kernels allocate).

Each graph runs op by op, but the output of a fused op (pointwise, view, an op inductor
generates inline) is not materialised unless it leaves the graph (a saved tensor, an
output) or an extern kernel (matmul, convolution, attention, any op inductor falls back
to) reads it; extern kernels, reductions, concatenations and scatters write buffers.
Not modelled: inductor's buffer reuse (`reuse` / `inplace` of dead buffers, which only
lowers the peak), its in-kernel scratch, the joint-graph pattern passes, and differences
between its CUDA and CPU code generation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import fx
from torch.utils._pytree import tree_flatten

# ops inductor generates code for and fuses into their consumers (besides `Tag.pointwise`
# and views); their outputs are not buffers unless something outside the kernel reads them
_FUSIBLE_NAMES = {
    "clone", "_to_copy", "expand", "where", "full", "full_like", "zeros", "zeros_like",
    "ones", "ones_like", "empty", "empty_like", "scalar_tensor", "arange", "iota",
    "embedding", "index", "gather", "index_select", "rand", "rand_like", "randn_like",
    "convert_element_type", "lift_fresh_copy", "alias", "copy", "slice_scatter",
    "select_scatter", "constant_pad_nd", "repeat", "masked_fill", "fill", "tril", "triu",
}  # fmt: skip
# ops that write a buffer of their own but whose inputs inductor computes inside the same
# kernel: reductions (small outputs, the reduced dims), concatenation (producers write into
# the slices), scatter / index_put (a buffer filled, then written at indices)
_BUFFERED = {
    "sum", "mean", "amax", "amin", "max", "min", "var", "var_mean", "prod", "argmax",
    "argmin", "any", "all", "logsumexp", "std", "cumsum", "cat", "scatter", "scatter_add",
    "index_put", "_unsafe_index_put", "_unsafe_masked_index_put_accumulate",
    "index_add", "scatter_reduce",
}  # fmt: skip
# metadata: no kernel at all
_NEUTRAL = {"sym_size", "sym_stride", "sym_numel", "sym_storage_offset"}


def _name(target: Any) -> str:
    packet = getattr(target, "overloadpacket", None)
    return getattr(packet, "__name__", "") or getattr(target, "__name__", "")


def kind(target: Any) -> str:
    """How inductor runs an op of a partitioned graph: ``neutral`` (no kernel: Python
    arithmetic on sizes, `getitem`, size queries), ``fused`` (generated into its
    consumers' kernel; its output is a buffer only if something outside reads it),
    ``buffered`` (generated code writing a buffer of its own, its inputs fused into it),
    ``extern`` (a library kernel, e.g. matmul or attention: inputs and output are buffers;
    also any op inductor falls back to, and every mutating op)."""
    if not isinstance(target, torch._ops.OpOverload) or _name(target) in _NEUTRAL:
        return "neutral"
    if target._schema.is_mutable:
        return "extern"
    name = _name(target)
    if target.is_view or torch.Tag.pointwise in target.tags or name in _FUSIBLE_NAMES:
        return "fused"
    return "buffered" if name in _BUFFERED else "extern"


def materialised(gm: fx.GraphModule) -> set[fx.Node]:
    """The nodes of a partitioned graph whose outputs inductor writes to a buffer: graph
    outputs (saved tensors, gradients), buffered and extern ops, and what extern ops read
    (through views, the viewed buffer)."""
    import operator

    out: set[fx.Node] = set()

    def root(n: Any) -> Any:
        while (
            isinstance(n, fx.Node)
            and isinstance(n.target, torch._ops.OpOverload)
            and n.target.is_view
            and n.args
            and isinstance(n.args[0], fx.Node)
        ):
            n = n.args[0]
        return n

    for node in gm.graph.nodes:
        if node.op == "output":
            for a in node.all_input_nodes:
                r = root(a)
                if r.op == "call_function":
                    out.add(r)
            continue
        if node.op != "call_function":
            continue
        if node.target is operator.getitem:
            if root(node.args[0]) in out:
                out.add(node)
            continue
        k = kind(node.target)
        if k in ("buffered", "extern"):
            out.add(node)
        # the partitioner's RNG-state wrapper runs a random op (flash attention's dropout,
        # even at p=0) as a library kernel: what it reads is a buffer too
        if k == "extern" or _rng_op(node.target) is not None:
            for a in node.all_input_nodes:
                r = root(a)
                if isinstance(r, fx.Node) and r.op == "call_function":
                    out.add(r)
    return out


def _rng_op(target: Any) -> Callable[..., Any] | None:
    """`run_and_save_rng_state(op, ...)` / `run_with_rng_state(state, op, ...)`, which the
    partitioner puts around a random op it recomputes: the op itself (recorded), with an
    empty stand-in for the generator state (a host tensor, not device memory)."""
    if not isinstance(target, torch._ops.HigherOrderOperator):
        return None
    if target.name() == "run_and_save_rng_state":

        def save(op: Any, *args: Any, **kwargs: Any) -> Any:
            from memgnn.predictor.ir.recorder import unrecorded

            with unrecorded():
                state = torch.empty(0, dtype=torch.uint8)
            return state, op(*args, **kwargs)

        return save
    if target.name() == "run_with_rng_state":
        return lambda state, op, *args, **kwargs: op(*args, **kwargs)
    return None


def _recorder() -> Any:
    """The innermost StepRecorder on the dispatch mode stack, if any."""
    from memgnn.predictor.ir.recorder import StepRecorder
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    for mode in reversed(_get_current_dispatch_mode_stack()):
        if isinstance(mode, StepRecorder):
            return mode
    return None


def run_fused(gm: fx.GraphModule, kept: set[fx.Node], args: list[Any]) -> Any:
    """Run a partitioned graph as its fused kernels allocate: nodes in `kept` are recorded
    (their outputs are buffers), the others run unrecorded (their outputs are values
    inside a fused kernel and never reach the allocator). Each value is dropped after its
    last use and the argument list is cleared (inductor's boxed calling convention), so
    saved activations die inside the backward as soon as it has read them."""
    from memgnn.predictor.ir.recorder import recorded

    with recorded():
        return run_graph(gm, kept, args, _recorder())


def run_graph(gm: fx.GraphModule, kept: set[fx.Node], args: list[Any], rec: Any) -> Any:
    """`run_fused` with the recorder given (None: record nothing, e.g. a tracing run)."""
    from memgnn.predictor.ir.recorder import unrecorded

    nodes = list(gm.graph.nodes)
    last: dict[fx.Node, fx.Node] = {}
    for node in nodes:
        for a in node.all_input_nodes:
            last[a] = node
    dying: dict[fx.Node, list[fx.Node]] = {}
    for value, user in last.items():
        dying.setdefault(user, []).append(value)
    env: dict[fx.Node, Any] = {}
    inputs = list(args)
    args.clear()  # the graph owns its inputs now: each dies after its last use
    inputs.reverse()
    result = None
    for node in nodes:
        if node.op == "placeholder":
            value = inputs.pop()
            if node.users:
                env[node] = value
            del value
        elif node.op == "output":
            result = fx.node.map_arg(node.args[0], env.__getitem__)
        elif node.op == "get_attr":
            env[node] = getattr(gm, node.target)
        else:
            a, kw = fx.node.map_arg((node.args, node.kwargs), env.__getitem__)
            k = kind(node.target)
            rng = _rng_op(node.target)
            if rng is not None:  # the partitioner's RNG-state wrappers of a recomputed op
                env[node] = rng(*a, **kw)
            elif rec is None or k == "neutral" or (node in kept and k == "extern"):
                env[node] = node.target(*a, **kw)
            else:
                with unrecorded():
                    env[node] = node.target(*a, **kw)
                if node in kept:  # a fused kernel's output buffer, read from what it reads
                    reads = [
                        t
                        for t in tree_flatten((a, kw))[0]
                        if isinstance(t, torch.Tensor) and rec.uid_of(t) is not None
                    ]
                    rec.record_op(f"inductor.fused.{_name(node.target)}", reads, env[node])
                    del reads
            del a, kw
        for dead in dying.get(node, ()):
            env.pop(dead, None)
    return result
