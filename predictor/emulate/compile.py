"""`torch.compile` of the model (`--compile full`) or of each repeated block (`--compile
blocks`, the regional compilation torchtune and torchtitan apply), run under capture.

What a compiled region holds for backward is decided by AOTAutograd: it traces the joint
forward + backward graph (with inductor's decompositions) and splits it with inductor's
partition function (its joint-graph passes, then the min-cut partitioner), which saves
some activations and recomputes cheap (pointwise) ones in backward. Capture runs exactly
that: `aot_function` with the same decompositions and `compile_fx.partition_fn` on the
capture's fake tensors, so the forward really saves only the partitioner's choice and the
backward really recomputes the rest (`Region`). A checkpointed block is traced as
AOTAutograd traces dynamo's `tag_activation_checkpoint`: under non-reentrant `checkpoint`
whose selective-checkpoint dispatch mode tags each forward op for the partitioner (plain
checkpointing: prefer recomputing every op; `--checkpointing selective-op`: torchtitan's
policy, `emulate.selective`).

What inductor then allocates is inductor's own: each partitioned graph is lowered and
scheduled by inductor and its generated wrapper (buffers, reuse, frees) is run on the
capture's tensors (`predictor.emulate.inductor`). The real step (not fake) runs
`torch.compile` itself.

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
import itertools
import logging
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import torch
from memgnn.predictor.emulate.inductor import lower, run_graph
from memgnn.predictor.ir.recorder import recorded
from torch import fx, nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_unflatten

log = logging.getLogger(__name__)


def _checkpointed(inner: Callable[..., Any], context_fn: Callable[..., Any] | None):
    """`inner` under non-reentrant `checkpoint`, as AOTAutograd traces dynamo's
    `tag_activation_checkpoint` (torch/_higher_order_ops/wrap.py): the region's forward
    ops tagged for the partitioner by PyTorch's selective-checkpoint dispatch mode, with
    `context_fn`'s policy (torchtitan's op-level SAC) or, for plain checkpointing, one that
    prefers recomputing every op; RNG state not stashed (inductor handles random ops)."""
    import torch.fx.traceback as fx_traceback
    from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

    make = context_fn or functools.partial(
        create_selective_checkpoint_contexts, _always_prefer_recompute
    )

    def context() -> Any:
        forward, recompute = make()
        forward.ac_graph_id = next(_AC_GRAPH_IDS)  # one region, one id (as dynamo numbers)
        return forward, recompute

    def run(*args: Any, **kwargs: Any) -> Any:
        with fx_traceback.preserve_node_meta():
            return checkpoint(
                inner, *args, use_reentrant=False, preserve_rng_state=False,
                context_fn=context, early_stop=False, **kwargs,
            )  # fmt: skip

    return run


_AC_GRAPH_IDS = itertools.count(1)


def _inductor_partition(
    joint: fx.GraphModule, inputs: Any, *, static: list[int], **kwargs: Any
) -> Any:
    """Inductor's own partition function: its joint-graph passes (among them
    `replace_random_passes`: a random op becomes a seeded `inductor_random`, recomputed in
    backward from the saved seed where checkpointing asks) and then the min-cut
    partitioner, under the trace's fake mode as `compile_fx` runs it. The `static` inputs
    (the region's parameters and buffers, `_static_indices`) are static-lifetime, as dynamo
    marks a module's parameters: free to save, so that what is derived from a weight (a
    float8 cast) is recomputed from it rather than saved."""
    if not kwargs.get("static_lifetime_input_indices"):
        kwargs["static_lifetime_input_indices"] = static
    from torch._guards import detect_fake_mode
    from torch._inductor.compile_fx import partition_fn
    from torch._inductor.virtualized import V

    vals = [n.meta.get("val") for n in joint.graph.nodes if n.op == "placeholder"]
    with V.set_fake_mode(detect_fake_mode(vals)):
        return partition_fn(joint, inputs, **kwargs)


def _static_indices(n_state: int, order: list[int]) -> list[int]:
    """The static-lifetime inputs the partitioner is told of: the positions of the region's
    parameters and buffers (the first `n_state` inputs) in the order they are passed, as
    dynamo marks a module's parameters. These index the region's inputs before AOTAutograd
    flattens a tensor subclass into its inner tensors, and torch 2.13 hands them to the
    partitioner as they are (`fw_metadata.static_input_indices`), so past a subclass input
    (torchao's float8 weight FSDP gathers: data and scale) they name the placeholders one
    or more to the left; the real compile partitions so, and so does this."""
    return [k for k, i in enumerate(order) if i < n_state]


def _first_use(fn: Callable[..., Any], args: tuple, kwargs: dict, inputs: list[Any]) -> list[int]:
    """`inputs` (indices) in the order `fn` first uses them, as dynamo lifts a region's
    parameters and arguments into its graph's placeholders when its trace first meets
    them (the min-cut partitioner breaks ties by that order); unused ones last."""
    from memgnn.predictor.ir.recorder import unrecorded

    index = {id(t): i for i, t in enumerate(inputs)}
    seen: dict[int, None] = {}

    class FirstUse(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            for x in tree_flatten((args, kwargs))[0]:
                i = index.get(id(x))
                if i is not None:
                    seen.setdefault(i)
            return func(*args, **kwargs)

    with unrecorded(), torch.no_grad(), FirstUse():
        fn(*args, **kwargs)
    return [*seen, *(i for i in range(len(inputs)) if i not in seen)]


def _permuted(fn: Callable[..., Any], order: list[int]) -> Callable[..., Any]:
    """`fn` taking its tensors in `order` (the k-th argument is `fn`'s `order[k]`-th)."""

    def permuted(*tensors: Any) -> Any:
        back: list[Any] = [None] * len(order)
        for k, i in enumerate(order):
            back[i] = tensors[k]
        return fn(*back)

    return permuted


def _same(x: Any) -> Any:
    return x


def _always_prefer_recompute(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
    from torch.utils.checkpoint import CheckpointPolicy

    return CheckpointPolicy.PREFER_RECOMPUTE


class Region:
    """One compiled region: `module`'s forward (`inner`) through AOTAutograd with
    inductor's decompositions and min-cut partitioner, compiled once per input signature
    (as dynamo would, with dynamic sizes) and run as inductor's generated wrapper."""

    def __init__(
        self,
        module: nn.Module,
        inner: Callable[..., Any],
        *,
        checkpointed: bool = False,
        context_fn: Callable[..., Any] | None = None,
        eager: Callable[..., Any] | None = None,
        dynamic: bool = True,
    ):
        self.module, self.inner = module, eager or inner  # `inner` run eagerly
        self.dynamic = dynamic  # False: sizes fixed (guarded) as a static compile sees them
        # its forward wrapped in activation checkpointing (`context_fn`: selective)
        self.traced = _checkpointed(inner, context_fn) if checkpointed else inner
        self.cache: dict[Any, Any] = {}
        self.broken = False  # a graph break: run eagerly, children compiled
        self.tracing = False

    def _fn(self, spec: Any, leaves: list[Any], where: list[int], names: list[str]):
        from torch.nn.utils.stateless import _reparametrize_module

        module, inner, n = self.module, self.traced, len(names)
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
        if not self.dynamic:  # a static compile: the capture holds at these sizes only
            _specialize(tensors)
        key = (
            spec,
            tuple((str(t.shape), t.dtype, t.requires_grad) for t in (*state.values(), *tensors)),
            tuple(None if i in where else repr(x) for i, x in enumerate(leaves)),
            torch.is_grad_enabled(),
            torch.is_autocast_enabled("cpu"),
        )
        if self.broken:
            return self.inner(*args, **kwargs)
        inputs = [*state.values(), *tensors]
        cached = self.cache.get(key)
        if cached is None:
            order = _first_use(self.inner, args, kwargs, inputs)
            compiled = aot_function(
                _permuted(self._fn(spec, leaves, where, list(state)), order),
                fw_compiler=functools.partial(self._compiler, backward=False),
                bw_compiler=functools.partial(self._compiler, backward=True),
                partition_fn=functools.partial(
                    _inductor_partition, static=_static_indices(len(state), order)
                ),
                decompositions=select_decomp_table(),
                num_params_buffers=len(state),
                dynamic=True,
            )
            cached = self.cache[key] = (compiled, order)
            try:  # AOTAutograd traces on a first call: on fresh inputs, unrecorded
                self._trace(compiled, order, [*state.values()], tensors)
            except Exception as exc:
                del self.cache[key]
                if not _data_dependent(exc):
                    raise
                self._graph_break(exc)
                return self.inner(*args, **kwargs)
        with unrecorded():  # AOTAutograd's runtime; the wrapper's run records the kernels
            compiled, order = cached
            return compiled(*(inputs[i] for i in order))

    def _trace(
        self, compiled: Any, order: list[int], state: list[torch.Tensor], tensors: list[Any]
    ) -> None:
        """The first call traces; its inputs are fresh tensors like the real ones, so that
        what AOTAutograd keeps of its trace holds none of the step's tensors. Its saves for
        backward bypass the step's saved-tensor hooks (activation offloading would keep the
        tracing call's tensors, sized by the trace's own symbols, in its stash)."""
        from memgnn.predictor.ir.recorder import unrecorded
        from torch.autograd.graph import saved_tensors_hooks

        self.tracing = True
        try:
            with (
                unrecorded(),
                _dynamo_view(True),
                saved_tensors_hooks(_same, _same),
            ):
                fresh = [*state, *(_like(t) for t in tensors)]
                compiled(*(fresh[i] for i in order))
        finally:
            self.tracing = False

    def _compiler(
        self, gm: fx.GraphModule, example_inputs: Any, *, backward: bool
    ) -> Callable[..., Any]:
        """Inductor's generated wrapper for the graph (`emulate.inductor.lower`), run on the
        capture's tensors; the tracing call runs the graph itself, unrecorded."""
        code = lower(gm, list(example_inputs), backward=backward)

        def call(args: list[Any]) -> Any:
            if self.tracing:  # the tracing call's own run: not the step's
                return run_graph(gm, args)
            with recorded():
                return code.run(args)

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
    """A fresh tensor like `t`. A size that is an expression of the capture's symbols (a
    chunk of the sequence: `B*((S+7)//8)`) gets a symbol of its own, as dynamo gives each
    dynamic input dimension one: inductor's wrapper reads its symbols from its inputs'
    sizes, and this one it could not read back."""
    sizes = [_own_symbol(d) for d in t.shape]
    if all(a is b for a, b in zip(sizes, t.shape, strict=True)):
        fresh = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
    else:
        fresh = torch.empty(sizes, dtype=t.dtype, device=t.device)
    return fresh.requires_grad_(t.requires_grad)


def _specialize(tensors: list[Any]) -> None:
    """Fix every symbolic size of `tensors` to its value (a guard the capture keeps, so that
    another size captures anew), as a static-shape compile sees constants."""
    from torch.fx.experimental.symbolic_shapes import guard_int

    for t in tensors:
        for size in (*t.shape, *t.stride()):
            if isinstance(size, torch.SymInt):
                guard_int(size)


def _own_symbol(size: Any) -> Any:
    import sympy
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import DimDynamic

    if not isinstance(size, torch.SymInt) or isinstance(size.node.expr, sympy.Symbol):
        return size
    env, hint = size.node.shape_env, size.node.hint
    if hint is None:  # unbacked: nothing to give a fresh symbol
        return size
    name = f"memgnn_region_dim{next(_DIM_IDS)}"
    sym = env.create_symbol(hint, ConstantSource(name), dynamic_dim=DimDynamic.DYNAMIC)
    _ALIASES.setdefault(id(env), {})[sym] = size.node.expr
    return env.create_symintnode(sym, hint=hint)


_DIM_IDS = itertools.count()
_ALIASES: dict[int, dict[Any, Any]] = {}  # id(shape env) -> {region symbol: expression}


def region_aliases(env: Any) -> dict[Any, Any]:
    """The symbols compiled regions gave their inputs' compound sizes in `env`, each with
    the expression of the capture's symbols it stands for (a guard inductor's lowering
    records on one is a guard on that expression)."""
    return _ALIASES.get(id(env), {})


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


def assumption(mode: str, sharding: str = "none", dynamic: bool = True) -> str | None:
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
        "partitioner saves for backward and recomputes, and the buffers inductor's "
        "generated wrapper allocates, reuses and frees (both run on the capture); "
        f"{_SHAPES[dynamic]}; approximate: inductor's CPU code generation stands in for its "
        "CUDA (Triton) code, and kernels' in-kernel scratch is not counted; "
        "a region AOTAutograd cannot trace compiles its child modules (a graph break); "
        "a checkpointed block compiled recomputes in backward what the partitioner "
        "chooses under the checkpoint's policy (all its forward, or what torchtitan's "
        "op-level policy does not save)" + wrapped
    )


_SHAPES = {
    True: "lowered with symbolic batch and sequence sizes, as torch.compile(dynamic=True) or "
    "a recompile under automatic dynamic shapes (a first static-shape compile can save and "
    "fuse otherwise: --compile-dynamic false)",
    False: "lowered at the capture's sizes, as a static-shape compile (another size captures anew)",
}
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
    dynamic: bool = True,
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
        if fake and id(module) in wrapped:  # its own forward, under checkpoint when traced
            module.forward = Region(
                module, inner.checkpointed, checkpointed=True, eager=inner,
                context_fn=inner.context_fn, dynamic=dynamic,
            )  # fmt: skip
        elif fake:
            module.forward = Region(module, inner, dynamic=dynamic)
        else:
            module.forward = torch.compile(inner, dynamic=dynamic)
    return len(regions)
