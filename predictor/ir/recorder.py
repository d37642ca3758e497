"""Record an eager training step as an ordered schedule of aten ops and storage lifetimes.

`StepRecorder` is a `TorchDispatchMode`: every aten op the step runs (forward, the autograd
engine's backward, the optimizer) becomes a node, in the order it really ran. Each output
tensor either creates a new storage (counted once, by storage identity) or aliases one that
exists (views, in-place ops). A storage's death is seen through `weakref.finalize` on its
Python storage object, so frees land exactly where eager PyTorch releases the memory. The
same recorder runs over fake tensors (capture, `sim`) and real CPU tensors (`cpu`).
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from memgnn.predictor.ir.sources import SourceFinder
from memgnn.predictor.ir.vocab import CATEGORIES, PHASES, PLACES
from torch.distributed.tensor import DTensor
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_leaves

# > 0 while ops run that a real step would not allocate for (see `unrecorded`)
_UNRECORDED = [0]


@contextlib.contextmanager
def unrecorded():
    """Ops run inside are not recorded: metadata-only work that happens to run on the
    capture's fake tensors (DTensor's sharding propagation builds global-shape fake inputs
    and runs the op on them to learn the output's shape; a real job runs that on fake
    tensors of its own, allocating nothing on the device)."""
    _UNRECORDED[0] += 1
    try:
        yield
    finally:
        _UNRECORDED[0] -= 1


@contextlib.contextmanager
def recorded():
    """Ops run inside are recorded even within `unrecorded` (a compiled region's kernels,
    run by AOTAutograd's runtime inside the call that traced them)."""
    saved, _UNRECORDED[0] = _UNRECORDED[0], 0
    try:
        yield
    finally:
        _UNRECORDED[0] = saved


# the place of storages created now (`placed`); the innermost context wins
_PLACE = ["device"]
# id(storage object) -> place, for storages made outside a recorder (`mark_place`)
_MARKED: dict[int, str] = {}


def _check_place(place: str) -> None:
    if place not in PLACES:
        raise ValueError(f"unknown place {place!r}; expected one of {PLACES}")


@contextlib.contextmanager
def placed(place: str):
    """Storages created inside live at `place` (`vocab.PLACES`), not in the CUDA allocator:
    what an offloading library allocates on the host (`pin_memory=True` copies, an
    optimizer stepping on the CPU) or in unified memory. Capture runs every tensor on one
    (fake) CPU device, so the code that offloads says where its storages go."""
    _check_place(place)
    _PLACE.append(place)
    try:
        yield
    finally:
        _PLACE.pop()


def mark_place(tensors: Iterable[torch.Tensor], place: str) -> None:
    """Remember that these tensors' storages live at `place`, for a recorder that first
    sees them later (state made before the recorded step, e.g. an optimizer's host state
    created in an unrecorded warm-up step), and re-place them in the recorders running now
    that track them already (a storage a library allocates first and hands to the host
    later, e.g. FSDP1's lazily initialised shards). Forgotten when the storage dies."""
    _check_place(place)
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    active = [m for m in _get_current_dispatch_mode_stack() if isinstance(m, StepRecorder)]
    for t in leaves(tensors):
        storage = _storage_of(t)
        if storage is None:
            continue
        key = id(storage)
        if key not in _MARKED:
            weakref.finalize(storage, _MARKED.pop, key, None)
        _MARKED[key] = place
        for rec in active:  # a recorder that already tracks it (made before it was marked)
            uid = rec._live.get(key)
            if uid is not None:
                rec.storages[uid].place = place


def _storage_of(t: torch.Tensor) -> Any | None:
    if isinstance(t, DTensor):  # a sharded parameter or gradient: this rank's shard
        t = t._local_tensor
    if t.layout != torch.strided or t.is_nested or is_traceable_wrapper_subclass(t):
        return None
    return t.untyped_storage()


def leaves(tensors: Iterable[torch.Tensor]) -> Iterator[torch.Tensor]:
    """The plain tensors holding `tensors`' memory: a tensor subclass that wraps others
    (torchao's quantised optimizer states: codes, scales, maps) gives its inner tensors."""
    for t in tensors:
        if isinstance(t, DTensor):  # this rank's shard (itself maybe a subclass)
            yield from leaves([t._local_tensor])
        elif isinstance(t, torch.Tensor) and is_traceable_wrapper_subclass(t):
            yield from leaves(_inner_tensors(t))
        else:
            yield t


def _inner_tensors(t: torch.Tensor) -> list[torch.Tensor]:
    """A wrapper subclass's inner tensors by its `__tensor_flatten__`; where that reads a
    value (torchao's float8 weight asks `if self._precomputed_scale:`, which a fake scale
    cannot answer), the tensors among its attributes, as flattening a real one gives
    them (a precomputed scale is never zero)."""
    try:
        names, _ = t.__tensor_flatten__()
    except GuardOnDataDependentSymNode:
        return [v for v in vars(t).values() if isinstance(v, torch.Tensor)]
    return [getattr(t, n) for n in names]


log = logging.getLogger(__name__)


@dataclass(slots=True)
class StorageRec:
    uid: int
    nbytes: Any  # int, or torch.SymInt under a symbolic capture
    dtype: str
    alloc_node: int  # index of the node that created it; -1 for storages alive before
    free_node: int | None = None  # index of the last node before it died; None: outlives
    category: str | None = None
    phase: str = "setup"
    step: int = 0
    micro: int = 0
    layer: int | None = None  # repeated block that made it (`predictor.ir.blocks`); None: none
    place: str = "device"  # where it lives (`vocab.PLACES`; `placed`)
    shape: Any = None  # the first tensor's shape seen on it (recorded with `sources`)


@dataclass(slots=True)
class NodeRec:
    op: str
    phase: str
    step: int
    micro: int
    module: str
    inputs: list[int] = field(default_factory=list)
    outputs: list[int] = field(default_factory=list)
    new: list[int] = field(default_factory=list)
    frees: list[int] = field(default_factory=list)
    scratch: Any = 0  # bytes the kernel allocates and frees inside the op
    layer: int | None = None  # repeated block running it (`predictor.ir.blocks`); None: none
    source: str = ""  # the user's file:line that ran it (`predictor.ir.sources`); "": none


DispatchHook = Callable[["StepRecorder", Any, tuple, dict], Any]


class StepRecorder(TorchDispatchMode):
    """Dispatch mode that records nodes and storage lifetimes (see module docstring).

    `hooks` maps an aten overload to a function that replaces running it (used by capture
    for data-dependent ops); the hook returns the op's output and may call `self.record_op`.
    """

    def __init__(
        self,
        hooks: dict[Any, DispatchHook] | None = None,
        module_stack: list[str] | None = None,
        scratch: Callable[[Any, tuple], Any] | None = None,
        track_resize: bool = False,
        layers: Any | None = None,
        sources: SourceFinder | None = None,
    ):
        super().__init__()
        self.sources = sources  # record each node's file:line (`predictor.ir.sources`)
        self.layers = layers  # a `predictor.ir.blocks.LayerState`: tag nodes with their block
        self.track_resize = track_resize
        self._orig_resize: Any = None
        self._resized_away: set[int] = set()  # uids freed by a storage resize to 0 bytes
        self.nodes: list[NodeRec] = []
        self.storages: list[StorageRec] = []
        self.hooks = hooks or {}
        self.scratch = scratch
        self._live: dict[int, int] = {}  # id(storage object) -> uid
        self._early_frees: list[int] = []
        self.phase, self.step, self.micro = "setup", 0, 0
        self.module_stack: list[str] = module_stack if module_stack is not None else []
        self.closed = False

    # ---- storages -------------------------------------------------------------------
    def _track(self, t: torch.Tensor, node: int) -> tuple[int, bool] | None:
        """The storage uid of `t`, creating a record if the storage is new."""
        storage = _storage_of(t)
        if storage is None:
            return None
        key = id(storage)
        uid = self._live.get(key)
        if uid is not None:
            return uid, False
        uid = len(self.storages)
        self._live[key] = uid
        rec = StorageRec(
            uid=uid,
            nbytes=storage.nbytes(),
            dtype=str(t.dtype).removeprefix("torch."),
            alloc_node=node,
            phase=self.phase,
            step=self.step,
            micro=self.micro,
            layer=None if self.layers is None else self.layers.current,
            place=_MARKED.get(key, _PLACE[-1]),
            shape=tuple(t.shape) if self.sources is not None else None,
        )
        self.storages.append(rec)
        weakref.finalize(storage, self._on_free, key, uid)
        return uid, True

    def _on_free(self, key: int, uid: int) -> None:
        if self._live.get(key) == uid:
            del self._live[key]
        if self.closed or uid in self._resized_away:
            return
        if self.nodes:
            self.nodes[-1].frees.append(uid)
            self.storages[uid].free_node = len(self.nodes) - 1
        else:
            self._early_frees.append(uid)

    def register(self, tensors: Iterable[torch.Tensor], category: str) -> list[int]:
        """Storages alive before the step (parameters, buffers, state): created at node -1."""
        assert category in CATEGORIES, category
        uids = []
        for t in leaves(tensors):
            got = self._track(t, -1)
            if got is None:
                continue
            uid, _ = got
            if self.storages[uid].category is None:
                self.storages[uid].category = category
            uids.append(uid)
        return uids

    def uid_of(self, t: torch.Tensor) -> int | None:
        storage = _storage_of(t)
        return None if storage is None else self._live.get(id(storage))

    def categorize(
        self, tensors: Iterable[torch.Tensor], category: str, *, force: bool = False
    ) -> None:
        """Give live storages a category unless they already have one (`force`: even so)."""
        assert category in CATEGORIES, category
        for t in leaves(tensors):
            uid = self.uid_of(t)
            if uid is not None and (force or self.storages[uid].category is None):
                self.storages[uid].category = category

    # ---- storage resizes (FSDP2 frees and re-allocates unsharded parameters this way) --
    def __enter__(self) -> StepRecorder:
        if self.track_resize:  # UntypedStorage.resize_ does not pass through dispatch
            self._orig_resize = orig = torch.UntypedStorage.resize_

            def resize_(storage: Any, size: int) -> Any:
                out = orig(storage, size)
                self._on_resize(storage, int(size))
                return out

            torch.UntypedStorage.resize_ = resize_  # type: ignore[method-assign]
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        if self._orig_resize is not None:
            torch.UntypedStorage.resize_ = self._orig_resize  # type: ignore[method-assign]
            self._orig_resize = None
        super().__exit__(*exc)

    def _on_resize(self, storage: Any, size: int) -> None:
        """A resize ends the storage's old lifetime (if any) and, to a size > 0, starts a
        new one at a node of its own; re-allocated storages are parameters."""
        key = id(storage)
        uid = self._live.pop(key, None)
        if uid is not None:
            self._resized_away.add(uid)
            if self.nodes:
                self.nodes[-1].frees.append(uid)
                self.storages[uid].free_node = len(self.nodes) - 1
            else:
                self._early_frees.append(uid)
        if size == 0:
            return
        node = self.record_op("inductor.resize_storage_bytes_.default", (), ())
        uid = len(self.storages)
        self._live[key] = uid
        self.storages.append(
            StorageRec(
                uid=uid,
                nbytes=size,
                dtype="uint8",
                alloc_node=len(self.nodes) - 1,
                category="parameter",
                phase=self.phase,
                step=self.step,
                micro=self.micro,
            )
        )
        node.outputs.append(uid)
        node.new.append(uid)
        weakref.finalize(storage, self._on_free, key, uid)

    def exclude(self, tensors: Iterable[torch.Tensor]) -> None:
        """Storages not on the target device (e.g. optimizer step counters kept on the host
        by CUDA training): their bytes count as 0."""
        for t in leaves(tensors):
            uid = self.uid_of(t)
            if uid is not None:
                self.storages[uid].nbytes = 0

    def categorize_live_from(self, phase: str, step: int, micro: int, category: str) -> None:
        """Every still-live storage allocated in (phase, step, micro) gets `category`."""
        for uid in self._live.values():
            rec = self.storages[uid]
            if (rec.phase, rec.step, rec.micro) == (phase, step, micro) and rec.category is None:
                rec.category = category

    # ---- nodes ------------------------------------------------------------------------
    def set_phase(self, phase: str, step: int, micro: int = 0) -> None:
        assert phase in PHASES, phase
        self.phase, self.step, self.micro = phase, step, micro

    def record_op(self, op: str, args: Any, out: Any) -> NodeRec:
        node_idx = len(self.nodes)
        known = len(self.storages)  # later uids: constants first seen as this op's inputs
        node = NodeRec(
            op=op,
            phase=self.phase,
            step=self.step,
            micro=self.micro,
            module=self.module_stack[-1] if self.module_stack else "",
            layer=None if self.layers is None else self.layers.current,
            source=self.sources.find() if self.sources is not None else "",
        )
        for t in tree_leaves(args):
            if isinstance(t, torch.Tensor):
                uid = self.uid_of(t)
                if uid is None:  # a tensor made outside the mode (e.g. a constant)
                    got = self._track(t, -1)
                    uid = None if got is None else got[0]
                if uid is not None and uid not in node.inputs:
                    node.inputs.append(uid)
        self.nodes.append(node)
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                got = self._track(t, node_idx)
                if got is None:
                    continue
                uid, is_new = got
                if uid not in node.outputs:
                    node.outputs.append(uid)
                if is_new:
                    node.new.append(uid)
        if self.layers is not None:
            self.layers.infer(self, node, args, out, known)
        return node

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if DTensor in types:  # let DTensor run its local ops, which come back here
            return NotImplemented
        if _UNRECORDED[0]:
            return func(*args, **kwargs)
        hook = self.hooks.get(func)
        if hook is not None:
            return hook(self, func, args, kwargs)
        out = func(*args, **kwargs)
        if func.namespace == "prim":  # metadata queries (prim.device): no data moves
            return out
        node = self.record_op(_op_name(func), (args, kwargs), out)
        if self.scratch is not None:
            node.scratch = self.scratch(func, args)
        return out

    def close(self) -> None:
        """Stop attributing frees (teardown after the measured steps)."""
        self.closed = True


def _op_name(func: Any) -> str:
    name = str(func)
    return name.removeprefix("aten.")


def live_categories(rec: StepRecorder) -> None:
    """Storages without a category after the step are temporaries."""
    for s in rec.storages:
        if s.category is None:
            s.category = "temporary"


class ModuleTracker:
    """Keeps `stack` as the qualified names of the modules whose forward is running."""

    def __init__(self, model: torch.nn.Module):
        self.names = {id(m): name or "<root>" for name, m in model.named_modules()}
        self.stack: list[str] = []
        self._handles: list[Any] = []

    def __enter__(self) -> ModuleTracker:
        from torch.nn.modules.module import (
            register_module_forward_hook,
            register_module_forward_pre_hook,
        )

        def pre(module, args):
            name = self.names.get(id(module))
            if name is not None:
                self.stack.append(name)

        def post(module, args, out):
            name = self.names.get(id(module))
            if name is not None and self.stack and self.stack[-1] == name:
                self.stack.pop()

        # always_call: a forward stopped by an exception (checkpoint recomputation stops
        # early that way) still leaves the stack, else its names would label later ops
        self._handles = [
            register_module_forward_pre_hook(pre),
            register_module_forward_hook(post, always_call=True),
        ]
        return self

    def __exit__(self, *exc: Any) -> None:
        for h in self._handles:
            h.remove()
        self.stack.clear()


class RecorderObserver:
    """Step observer that keeps a recorder's phase and categories in step with the run."""

    def __init__(self, recorder: StepRecorder, on_forward: Callable[[], None] | None = None):
        self.rec = recorder
        self.on_forward = on_forward

    def on_phase(self, phase: str, step: int, micro: int) -> None:
        if phase == "backward":
            # What forward left alive when backward starts is saved for backward.
            self.rec.categorize_live_from("forward", step, micro, "activation")
        if phase == "forward":
            self.rec.categorize_live_from("input", step, micro, "input")
            if self.on_forward is not None:
                self.on_forward()
        self.rec.set_phase(phase, step, micro)

    def on_backward_end(self, model: torch.nn.Module, step: int, micro: int) -> None:
        self.rec.categorize((p.grad for p in model.parameters() if p.grad is not None), "gradient")

    def on_optimizer_end(self, optimizer: torch.optim.Optimizer, step: int) -> None:
        tensors = [
            v
            for state in optimizer.state.values()
            for v in state.values()
            if isinstance(v, torch.Tensor)
        ]
        self.rec.categorize(tensors, "optimizer_state")


def register_state(rec: StepRecorder, state: dict[str, list[torch.Tensor]]) -> None:
    """Register what is alive before the recorded steps (TrainingStep.state_tensors())."""
    for category, tensors in state.items():
        rec.register(tensors, category)
