"""What inductor allocates for a partitioned graph, from inductor's own code.

`lower` runs inductor on one graph of a compiled region as `compile_fx` does (its post-grad
passes, `GraphLowering` on the capture's fake inputs, the scheduler's fusion, the wrapper's
memory planning with buffer reuse) up to the generated Python wrapper, and stops before
any kernel is compiled. `WrapperCode.run` then executes that wrapper on the capture's
tensors: every `empty_strided_cpu` is a real allocation the recorder sees, every `del` and
`# reuse` is inductor's, extern kernels (matmul, attention, any fallback op) run as ops,
and each generated C++ kernel is recorded as one op reading and writing the buffers it is
passed (its arithmetic is not run: the capture's tensors hold no values).

Inductor generates CPU code here (the capture's tensors are CPU tensors); for a CUDA
target its Triton code's buffers are assumed to be the same, which the scheduler's fusion
decides for both.
"""

from __future__ import annotations

import copy
import functools
import logging
import re
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import fx

log = logging.getLogger(__name__)

__all__ = ["WrapperCode", "lower", "run_graph"]

_RNG_HOPS = ("run_and_save_rng_state", "run_with_rng_state")
_KERNEL = re.compile(r"^(\w+) = async_compile\.\w+\(", re.MULTILINE)


class WrapperCode:
    """Inductor's generated wrapper for one graph, runnable on the capture's tensors."""

    def __init__(self, source: str):
        self.source = source
        self.kernels = _KERNEL.findall(source)

    @functools.cached_property
    def _call(self) -> Callable[[list[Any]], Any]:
        from unittest import mock

        namespace: dict[str, Any] = {"__name__": "memgnn_inductor_wrapper"}
        source = self.source
        for hop in _RNG_HOPS:  # the RNG-state wrappers: the op, its state a host tensor
            source = source.replace(f"torch.ops.higher_order.{hop}(", f"_{hop}(")
            namespace[f"_{hop}"] = _rng_op(getattr(torch.ops.higher_order, hop))
        with mock.patch("torch._inductor.async_compile.AsyncCompile", _NoCompile):
            exec(compile(source, "<inductor wrapper>", "exec"), namespace)
        namespace.update(
            empty_strided_cpu=_empty_strided,
            empty_strided_cpu_pinned=_empty_strided,
            empty_strided_cuda=_empty_strided,
            empty_strided=_empty_strided,
            reinterpret_tensor=_reinterpret,
            assert_size_stride=_nothing,
            assert_alignment=_nothing,
            run_intermediate_hooks=_nothing,
            extern_kernels=_Externs(),
        )
        for name in self.kernels:
            namespace[name] = functools.partial(_kernel, name)
        return namespace["call"]

    def run(self, args: list[Any]) -> Any:
        """Run the wrapper (boxed: it clears `args` and frees each input after its last
        use, as inductor's generated code does)."""
        return self._call(args)


class _NoCompile:
    """`AsyncCompile` for a wrapper that is run, not compiled: kernel sources are kept as
    names only."""

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None

    def wait(self, scope: dict[str, Any]) -> None:
        pass


class _Externs:
    """The wrapper's `extern_kernels`: a call that writes into a buffer the wrapper made
    (`out=`) allocates nothing and is recorded as one op over its tensors (some, such as
    `_scaled_mm.out`, have no fake kernel); any other call runs as the op it is."""

    def __getattr__(self, name: str) -> Any:
        from torch._inductor.select_algorithm import extern_kernels

        real = getattr(extern_kernels, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            if "out" not in kwargs:
                return real(*args, **kwargs)
            rec = _recorder()
            if rec is not None:
                tensors = [t for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor)]
                rec.record_op(f"inductor.extern.{name}", tensors, None)
            return kwargs["out"]

        return call


def _nothing(*args: Any, **kwargs: Any) -> None:
    return None


def _empty_strided(size: Any, stride: Any, dtype: torch.dtype, device: Any = None) -> Any:
    return torch.empty_strided(tuple(size), tuple(stride), dtype=dtype, device="cpu")


def _reinterpret(base: torch.Tensor, size: Any, stride: Any, offset: Any = 0) -> torch.Tensor:
    return base.as_strided(tuple(size), tuple(stride), base.storage_offset() + offset)


def _kernel(name: str, *args: Any) -> None:
    """One generated kernel: recorded as an op over the buffers it reads and writes."""
    rec = _recorder()
    if rec is not None:
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        rec.record_op(f"inductor.{name}", tensors, None)


def lower(gm: fx.GraphModule, example_inputs: list[Any], *, backward: bool) -> WrapperCode:
    """Inductor's wrapper code for `gm` (a partitioned forward or backward graph) on
    `example_inputs` (the trace's fake tensors), cached by the graph's code and inputs
    within one capture (its fake mode's shape environment): every repeated block compiles
    to the same wrapper, and a later capture lowers afresh, so that the guards inductor's
    lowering adds land in its own shape environment. The cache goes with the capture."""
    from torch._guards import detect_fake_mode

    fake = detect_fake_mode(example_inputs)
    owner = (fake.shape_env or fake) if fake is not None else _NO_FAKE_MODE
    cache = _CACHE.setdefault(owner, {})
    key = (gm.code, backward, tuple(_meta(x) for x in example_inputs))
    found = cache.get(key)
    if found is None:
        if owner is _NO_FAKE_MODE and len(cache) >= _MAX_UNOWNED:
            cache.pop(next(iter(cache)))  # real tensors (tests): the oldest goes
        found = cache[key] = WrapperCode(_generate(gm, example_inputs, backward))
    return found


class _NoFakeMode:
    """The cache owner of graphs lowered on real example inputs."""


_NO_FAKE_MODE = _NoFakeMode()
_MAX_UNOWNED = 64
# shape environment (or fake mode) -> {(graph code, backward, input metadata): wrapper}
_CACHE: weakref.WeakKeyDictionary[Any, dict[Any, WrapperCode]] = weakref.WeakKeyDictionary()


def _meta(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return (str(x.shape), str(x.stride()), x.dtype, str(x.device))
    return repr(x)


def _generate(gm: fx.GraphModule, example_inputs: list[Any], backward: bool) -> str:
    from torch._guards import detect_fake_mode
    from torch._inductor.compile_fx import _recursive_post_grad_passes
    from torch._inductor.debug import DebugContext
    from torch._inductor.graph import GraphLowering
    from torch._inductor.virtualized import V
    from torch.utils._python_dispatch import _disable_current_modes

    gm = copy.deepcopy(gm)  # the passes rewrite it; the tracing run keeps the original
    fake = detect_fake_mode(example_inputs)
    shape_env = fake.shape_env if fake is not None else None
    # out of every dispatch mode (the capture's recorder), as dynamo compiles
    with _disable_current_modes(), DebugContext(), V.set_fake_mode(fake):
        _recursive_post_grad_passes(gm, is_inference=False)
        graph = GraphLowering(
            gm, example_inputs=example_inputs, shape_env=shape_env,
            is_inference=False, is_backward=backward,
        )  # fmt: skip
        graph.freeze_runtime_asserts()
        with V.set_graph_handler(graph), V.set_extern_kernel_nodes([]):
            graph.run(*example_inputs)
            wrapper, _kernels = graph.codegen()
    log.debug(
        "inductor wrapper (%s): %d lines", "bw" if backward else "fw", wrapper.value.count("\n")
    )
    return wrapper.value


def run_graph(gm: fx.GraphModule, args: list[Any]) -> Any:
    """Run a partitioned graph node by node, unrecorded (the tracing call's own run, on
    fresh inputs); the partitioner's RNG-state wrappers run their op (`_rng_op`). Boxed:
    `args` is cleared and each value dropped after its last use."""
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
    args.clear()
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
            rng = _rng_op(node.target)
            env[node] = (rng or node.target)(*a, **kw)
            del a, kw
        for dead in dying.get(node, ()):
            env.pop(dead, None)
    return result


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
