"""`torch.compile` of the model (`--compile full`) or of each repeated block (`--compile
blocks`, the regional compilation torchtune and torchtitan apply), run under capture.

What a compiled region holds for backward is decided by AOTAutograd: it traces the joint
forward + backward graph (with inductor's decompositions) and splits it with the min-cut
partitioner (`min_cut_rematerialization_partition`, as inductor calls it), which saves some
activations and recomputes cheap (pointwise) ones in backward. Capture runs exactly that:
`aot_function` with the same decompositions and partitioner on the capture's fake
tensors, so the forward really saves only the partitioner's choice and the backward really
recomputes the rest (`Region`).

What inductor then allocates is approximated (`predictor.emulate.inductor.run_fused`:
fused intermediates are no allocations). The real step (not fake) runs `torch.compile`
itself.

Under `--sharding fsdp` (FSDP2) or `ddp` each block is compiled first and wrapped after, as
torchtitan applies compile before `fully_shard`: the wrapper's hooks (FSDP2's all-gather
before the block's forward and backward, its reshard and reduce-scatter after; DDP's
gradient hooks) run outside the region, whose parameters are the unsharded ones FSDP2 puts
on the module while it runs. The region saves what it saves on one GPU; a saved parameter
(or a view of it) shares the unsharded storage FSDP2 frees at reshard. Checked against a
real 2-rank gloo job with inductor-compiled blocks (tests/predictor/emulate/
test_compile_sharded.py).
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import torch
from memgnn.predictor.emulate.inductor import materialised, run_fused, run_graph
from torch import fx, nn
from torch.utils._pytree import tree_flatten, tree_unflatten

log = logging.getLogger(__name__)


# random ops (dropout's draws); attention kernels with a dropout_p argument are not here
_RANDOM = {
    "rand", "rand_like", "randn", "randn_like", "bernoulli", "native_dropout", "randint",
    "randint_like", "normal", "uniform", "exponential", "multinomial",
}  # fmt: skip


def _random(node: fx.Node) -> bool:
    """A random op (dropout's mask): without functionalized RNG, inductor does not
    recompute it, even in a checkpointed region; its output is saved."""
    packet = getattr(node.target, "overloadpacket", None)
    return getattr(packet, "__name__", "") in _RANDOM


def _partition(checkpointed: bool) -> Callable[..., Any]:
    """Inductor's partitioner; for a checkpointed region, with every forward node of the
    joint graph tagged must-recompute, as dynamo tags the ops of a `checkpoint` region
    for it: the forward then saves only what recomputing needs (the region's inputs)."""
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    base = functools.partial(min_cut_rematerialization_partition, compiler="inductor")
    if not checkpointed:
        return base

    def partition(joint: fx.GraphModule, inputs: Any, **kwargs: Any) -> Any:
        from torch.utils.checkpoint import CheckpointPolicy

        backward: set[fx.Node] = set()
        for node in joint.graph.nodes:
            tangent = node.op == "placeholder" and node.name.startswith("tangents")
            if tangent or any(a in backward for a in node.all_input_nodes):
                backward.add(node)
        for node in joint.graph.nodes:
            if node.op == "call_function" and node not in backward and not _random(node):
                node.meta["recompute"] = CheckpointPolicy.MUST_RECOMPUTE
                node.meta["ac_graph_id"] = 0
        return base(joint, inputs, **kwargs)

    return partition


class Region:
    """One compiled region: `module`'s forward (`inner`) through AOTAutograd with
    inductor's decompositions and min-cut partitioner, compiled once per input signature
    (as dynamo would, with dynamic sizes) and run with `run_fused`."""

    def __init__(self, module: nn.Module, inner: Callable[..., Any], *, checkpointed: bool = False):
        self.module, self.inner = module, inner
        self.checkpointed = checkpointed  # its forward wrapped in activation checkpointing
        self.cache: dict[Any, Any] = {}
        self.broken = False  # a graph break: run eagerly, children compiled
        self.tracing = False

    def _fn(self, spec: Any, leaves: list[Any], where: list[int], names: list[str]):
        from torch.nn.utils.stateless import _reparametrize_module

        module, inner, n = self.module, self.inner, len(names)
        # the first call's tensors are the trace's inputs, not held by the compiled region
        leaves = [None if isinstance(x, torch.Tensor) else x for x in leaves]

        def fn(*tensors: torch.Tensor) -> Any:
            values = list(leaves)
            for i, t in zip(where, tensors[n:], strict=True):
                values[i] = t
            args, kwargs = tree_unflatten(values, spec)
            with _reparametrize_module(module, dict(zip(names, tensors[:n], strict=True))):
                return inner(*args, **kwargs)

        return fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from memgnn.predictor.ir.recorder import unrecorded
        from torch._functorch.aot_autograd import aot_function
        from torch._inductor.decomposition import select_decomp_table

        state = dict(self.module.named_parameters()) | dict(self.module.named_buffers())
        leaves, spec = tree_flatten((args, kwargs))
        where = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
        tensors = [leaves[i] for i in where]
        key = (
            spec,
            tuple((str(t.shape), t.dtype, t.requires_grad) for t in (*state.values(), *tensors)),
            tuple(None if i in where else repr(x) for i, x in enumerate(leaves)),
            torch.is_grad_enabled(),
            torch.is_autocast_enabled("cpu"),
        )
        if self.broken:
            return self.inner(*args, **kwargs)
        compiled = self.cache.get(key)
        if compiled is None:
            compiled = aot_function(
                self._fn(spec, leaves, where, list(state)),
                fw_compiler=self._compiler,
                bw_compiler=self._compiler,
                partition_fn=_partition(self.checkpointed),
                decompositions=select_decomp_table(),
                num_params_buffers=len(state),
                dynamic=True,
            )
            self.cache[key] = compiled
            try:  # AOTAutograd traces on a first call: on fresh inputs, unrecorded
                self._trace(compiled, [*state.values()], tensors)
            except Exception as exc:
                del self.cache[key]
                if not _data_dependent(exc):
                    raise
                self._graph_break(exc)
                return self.inner(*args, **kwargs)
        with unrecorded():  # AOTAutograd's runtime; `run_fused` records the kernels
            return compiled(*state.values(), *tensors)

    def _trace(self, compiled: Any, state: list[torch.Tensor], tensors: list[Any]) -> None:
        """The first call traces; its inputs are fresh tensors like the real ones, so that
        what AOTAutograd keeps of its trace holds none of the step's tensors."""
        from memgnn.predictor.ir.recorder import unrecorded

        self.tracing = True
        try:
            with unrecorded(), _dynamo_view(True):
                fresh = [_like(t) for t in tensors]
                compiled(*state, *fresh)
        finally:
            self.tracing = False

    def _compiler(self, gm: fx.GraphModule, example_inputs: Any) -> Callable[..., Any]:
        kept = materialised(gm)

        def call(args: list[Any]) -> Any:
            if self.tracing:  # the tracing call's own run: not the step's
                return run_graph(gm, kept, args, None)
            return run_fused(gm, kept, args)

        call._boxed_call = True  # type: ignore[attr-defined]
        return call

    def _graph_break(self, exc: Exception) -> None:
        """What AOTAutograd cannot trace (data-dependent control flow, e.g. a mask built
        from tensor values) dynamo would split into graphs around it: the region runs
        eagerly and each child module with parameters becomes a region of its own."""
        text = str(exc).strip()
        first = text.splitlines()[0][:200] if text else type(exc).__name__
        log.warning("compile: graph break in %s (%s)", type(self.module).__name__, first)
        self.broken = True
        todo = list(self.module.children())
        while todo:
            child = todo.pop(0)
            if isinstance(child, (nn.ModuleList, nn.ModuleDict)):  # containers: not called
                todo[:0] = list(child.children())
            elif not isinstance(child.forward, Region) and any(True for _ in child.parameters()):
                child.forward = Region(child, child.forward)


def _data_dependent(exc: BaseException | None) -> bool:
    """Tracing failed on data-dependent code (where dynamo breaks the graph), anywhere in
    the exception's chain; any other failure is an error, not a graph break."""
    from torch._subclasses.fake_tensor import (
        DataDependentOutputException,
        DynamicOutputShapeException,
    )
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    kinds = (DataDependentOutputException, DynamicOutputShapeException)
    kinds += (GuardOnDataDependentSymNode,)
    seen = 0
    while exc is not None and seen < 16:
        if isinstance(exc, kinds):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def _like(t: torch.Tensor) -> torch.Tensor:
    fresh = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
    return fresh.requires_grad_(t.requires_grad)


@contextlib.contextmanager
def _dynamo_view(tracing: bool) -> Iterator[None]:
    """While a region is traced, `torch.compiler.is_compiling()` is True, as under dynamo,
    and so is `torch.compiler.is_exporting()` before torch 2.14 (dynamo folded it to a
    constant True until pytorch#176499): code that branches on them takes the path the
    compiled graph holds (transformers' mask creation keeps an explicit causal mask and
    skips its data-dependent shortcuts; SDPA then runs on repeated GQA keys and values)."""
    if not tracing:
        yield
        return
    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(torch.compiler, "is_compiling", lambda: True))
        if _torch_before(2, 14):
            stack.enter_context(mock.patch.object(torch.compiler, "is_exporting", lambda: True))
        yield


def _torch_before(major: int, minor: int) -> bool:
    parts = torch.__version__.split("+")[0].split(".")
    return (int(parts[0]), int(parts[1])) < (major, minor)


def assumption(mode: str, sharding: str = "none") -> str | None:
    """What an answer under `--compile` assumed (None: eager)."""
    if mode == "none":
        return None
    where = "the whole model" if mode == "full" else "each repeated block"
    wrapped = (
        f"; each block compiled, then wrapped ({_WRAPPERS[sharding]}): the wrapper's hooks "
        "run outside the compiled region, which traces the unsharded parameters"
        if sharding in _WRAPPERS
        else ""
    )
    return (
        f"compile: torch.compile (inductor) of {where}; modelled: what AOTAutograd's min-cut "
        "partitioner saves for backward and recomputes (run on the capture); approximate: "
        "inductor's buffers (fused pointwise intermediates not allocated; its buffer reuse "
        "and in-kernel scratch not modelled; CUDA and CPU code generation assumed alike; "
        "where the peak falls inside a compiled backward this under-counts: 5.7% on a tiny "
        "Llama with checkpointed blocks at S=40, benchmarks/results/compile.md); "
        "a region AOTAutograd cannot trace compiles its child modules (a graph break); "
        "a checkpointed block compiled recomputes its whole forward in backward but for "
        "random ops (dropout), whose values it saves" + wrapped
    )


_WRAPPERS = {
    "fsdp": "FSDP2 fully_shard per block, then the root, as torchtitan",
    "ddp": "DistributedDataParallel",
}


def apply_compile(
    model: nn.Module,
    blocks: list[nn.Module],
    mode: str,
    *,
    fake: bool,
    checkpointed: list[nn.Module] = (),  # type: ignore[assignment]
) -> int:
    """Compile the model (`full`) or each block (`blocks`, over the checkpoint wrapper of
    those in `checkpointed`, as torchtitan applies AC then compile); returns the regions
    compiled. A real step runs `torch.compile` (inductor); a fake one (capture) `Region`."""
    if mode == "none":
        return 0
    if mode == "blocks" and not blocks:
        raise ValueError("--compile blocks: the model has no repeated blocks; use --compile full")
    if mode == "full" and checkpointed:
        raise ValueError(
            "--compile full with --checkpointing is not modelled yet; use --compile blocks "
            "(each block compiled over its checkpoint, as torchtune and torchtitan do)"
        )
    regions = blocks if mode == "blocks" else [model]
    wrapped = {id(b) for b in checkpointed}
    for module in regions:
        inner = module.forward
        if fake:  # a checkpointed block: its own forward, recomputed by the partitioner
            ckpt = id(module) in wrapped
            traced = getattr(inner, "checkpointed", inner) if ckpt else inner
            module.forward = Region(module, traced, checkpointed=ckpt)
        else:
            module.forward = torch.compile(inner, dynamic=False)
    return len(regions)
