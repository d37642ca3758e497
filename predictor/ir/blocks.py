"""Which repeated block (transformer layer) each recorded op and storage belongs to.

A capture of repeated blocks (`predictor.capture.replicate`) runs the model at a small depth and
needs, for every node and storage of that run, the index of the block it belongs to
(None: outside every block). `LayerTagger` keeps `LayerState.current` up to date:
- forward: a forward pre-hook and hook on each block set it while the block runs;
- backward: a pre-hook on the autograd node that made a block's output sets it to that
  block (the engine runs that node first of the block's backward), and a pre-hook on the
  node that made the block's input (when it is not the previous block's output) resets it;
  recomputation under activation checkpointing runs inside the block's backward and keeps
  its index; hooks firing inside backward (transformers' checkpointing calls the block
  again) change nothing;
- optimizer and zero_grad (no hooks): `LayerState.infer` tags a node by the block of the
  storages it reads (one block: that block; several, e.g. a foreach op over all parameters:
  none, and each new output takes the block of the list element at its position); a node
  that reads none (a step counter made from a Python number) takes the next node's.
Storages alive before the step (weights, gradients, optimizer state, buffers) take the
block of their parameter (`tag_registered`). None of this adds an op or holds a tensor:
the tagged schedule is the schedule a plain capture records.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_leaves

__all__ = ["LayerState", "LayerTagger", "NotRepeated", "PhaseReset", "tag_registered"]

log = logging.getLogger(__name__)

_INFERRED_PHASES = ("optimizer", "zero_grad")


class NotRepeated(Exception):
    """The captured blocks are not identical copies: capture the full model instead."""


class LayerState:
    """The block running now, and what tagging found wrong (see the module docstring)."""

    def __init__(self) -> None:
        self.current: int | None = None
        self.problems: list[str] = []
        self._pending: list[Any] = []  # optimizer nodes that read nothing, not yet tagged

    def reset(self) -> None:
        self.current = None
        self._pending.clear()

    def infer(self, rec: Any, node: Any, args: Any, out: Any, known: int) -> None:
        """Tag an optimizer-phase node (and its new storages) from what it reads; uids from
        `known` on are constants first seen as its inputs (they go with the node)."""
        if self.current is not None or rec.phase not in _INFERRED_PHASES:
            return
        made = [u for u in node.inputs if u >= known] + list(node.new)
        read = [u for u in node.inputs if u < known]
        if not read:  # made from Python numbers: decided by the next node
            self._pending.append((node, made))
            return
        tags = {rec.storages[u].layer for u in read} - {None}
        node.layer = next(iter(tags)) if len(tags) == 1 else None
        for pending in [*self._pending, (node, made)]:
            pending[0].layer = node.layer
            for uid in pending[1]:
                rec.storages[uid].layer = node.layer
        self._pending.clear()
        if len(tags) > 1:  # an op over several blocks' tensors: new outputs by list position
            self._tag_by_position(rec, node, args, out)

    def _tag_by_position(self, rec: Any, node: Any, args: Any, out: Any) -> None:
        if not node.new:
            return
        outs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        positional = args[0] if isinstance(args, tuple) and args else args
        lists = [
            a
            for a in (positional if isinstance(positional, (list, tuple)) else ())
            if isinstance(a, (list, tuple))
            and len(a) == len(outs)
            and all(isinstance(t, torch.Tensor) for t in a)
        ]
        placed: set[int] = set()
        if lists:  # output i is made from element i of the list (an outside one: None)
            for t, src in zip(outs, lists[0]):
                uid, src_uid = rec.uid_of(t), rec.uid_of(src)
                if uid in node.new and src_uid is not None:
                    rec.storages[uid].layer = rec.storages[src_uid].layer
                    placed.add(uid)
        unplaced = [u for u in node.new if u not in placed]
        if unplaced:
            self.problems.append(
                f"op {node.op} over several blocks made {len(unplaced)} storage(s) that "
                "match no list element (their size may grow with depth)"
            )


def _in_backward() -> bool:
    return torch._C._current_autograd_node() is not None


def _grad_fns(value: Any) -> list[Any]:
    seen: dict[int, Any] = {}
    for t in tree_leaves(value):
        if isinstance(t, torch.Tensor) and t.grad_fn is not None:
            seen.setdefault(id(t.grad_fn), t.grad_fn)
    return list(seen.values())


class LayerTagger:
    """Module and autograd hooks that keep `state.current` on the running block."""

    def __init__(self, state: LayerState, blocks: list[nn.Module]):
        self.state = state
        self.blocks = blocks
        self._handles: list[Any] = []
        self._outputs: set[int] = set()  # ids of the last block's output nodes (forward)

    def __enter__(self) -> LayerTagger:
        for i, block in enumerate(self.blocks):
            self._handles.append(
                block.register_forward_pre_hook(functools.partial(self._pre, i), with_kwargs=True)
            )
            self._handles.append(block.register_forward_hook(functools.partial(self._post, i)))
        return self

    def __exit__(self, *exc: Any) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def _pre(self, index: int, module: nn.Module, args: Any, kwargs: Any) -> None:
        if _in_backward():
            return
        for fn in _grad_fns((args, kwargs)):
            if id(fn) not in self._outputs:
                fn.register_prehook(self._leave)
        self._outputs = set()
        self.state.current = index

    def _post(self, index: int, module: nn.Module, args: Any, out: Any) -> None:
        if _in_backward():
            return
        self.state.current = None
        fns = _grad_fns(out)
        for fn in fns:
            fn.register_prehook(functools.partial(self._enter, index))
        self._outputs = {id(fn) for fn in fns}

    def _enter(self, index: int, grad_outputs: Any) -> None:
        self.state.current = index

    def _leave(self, grad_outputs: Any) -> None:
        self.state.current = None


class PhaseReset:
    """A step observer that resets the tagging state at each phase, then passes it on."""

    def __init__(self, inner: Any, state: LayerState):
        self.inner, self.state = inner, state

    def on_phase(self, phase: str, step: int, micro: int) -> None:
        self.state.reset()
        self.inner.on_phase(phase, step, micro)

    def on_backward_end(self, model: nn.Module, step: int, micro: int) -> None:
        self.inner.on_backward_end(model, step, micro)

    def on_optimizer_end(self, optimizer: torch.optim.Optimizer, step: int) -> None:
        self.inner.on_optimizer_end(optimizer, step)


def tag_registered(rec: Any, blocks: list[nn.Module], optimizer: torch.optim.Optimizer) -> None:
    """Weights, buffers, gradients and optimizer state alive before the step: the block
    of their parameter. A tensor shared by two blocks is a problem (not repeated)."""
    state = getattr(optimizer, "optim", optimizer).state
    for index, block in enumerate(blocks):
        tensors: list[torch.Tensor] = list(block.buffers())
        for p in block.parameters():
            tensors.append(p)
            if p.grad is not None:
                tensors.append(p.grad)
            tensors.extend(v for v in state.get(p, {}).values() if isinstance(v, torch.Tensor))
        for t in tensors:
            uid = rec.uid_of(t)
            if uid is None:
                continue
            s = rec.storages[uid]
            if s.layer is not None and s.layer != index:
                rec.layers.problems.append(f"a tensor is shared by blocks {s.layer} and {index}")
            s.layer = index
