"""Activation offloading: tensors saved for backward kept in pinned host memory.

Both libraries work through `torch.autograd.graph.saved_tensors_hooks` entered around the
model's forward (memgnn enters them in a root forward pre-hook and leaves them in the
forward hook): every tensor autograd saves goes through `pack`, every use in backward
through `unpack`. Capture runs on one fake CPU device, so what a CUDA run does across the
two memories is put explicitly: copies made for the host are created under
`recorder.placed("pinned")` (their bytes count on the host, not in the CUDA allocator),
and where a CUDA run copies a host tensor back (`tensor.to("cuda")`, a no-op on the CPU)
a device tensor is allocated and filled.

- `save_on_cpu`: torch's own `torch.autograd.graph.save_on_cpu(pin_memory=True)` hooks.
  `pack` copies every saved tensor, parameters included, into a new pinned host tensor of
  its shape (the device tensor is then free unless something else holds it); `unpack`
  copies it back to a new device tensor at each use in backward (freed after the node).
  On a CPU target nothing is copied back (torch returns the host tensor itself).
- `torchtune`: torchtune's `OffloadActivations` (training/_activation_offloading.py,
  use_streams=True, max_fwd_stash_size=5, min_offload_size=1024 bytes), as
  `get_act_offloading_ctx_manager` applies it: the output head runs under a no-op
  manager (torchtune's `model.output`; a transformers model's output embeddings). Only
  tensors of >= 1024 bytes that are not parameters or buffers go to the host, each saved
  tensor its own copy (torchtune's `dupe_cache` is looked up but never filled, as of
  pytorch/torchtune@e511d5a, so a storage saved twice is copied twice). With streams,
  each offloaded device tensor stays alive until 5 more tensors are saved (the forward
  stash; the rest is freed at the first unpack); in backward a tensor still stashed is used
  as it is, any other is copied back and kept until the next autograd node that brings a
  tensor back has run (or backward ends). Streams and events order work on the GPU; here
  they order nothing, and the allocator sees every copy on the one stream.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from memgnn.predictor.ir.recorder import placed, recorded
from memgnn.predictor.spec.train import TrainSpec
from torch import nn
from torch.autograd.graph import saved_tensors_hooks

log = logging.getLogger(__name__)

__all__ = ["OffloadActivations", "apply_activation_offload", "save_on_cpu_hooks"]


def _to_device(t: torch.Tensor, device: torch.device | None = None) -> torch.Tensor:
    """`host_tensor.to(device, non_blocking=True)`: a new device tensor of its layout (on a
    fake CPU device: a new tensor there, the copy a CUDA run makes)."""
    out = torch.empty_like(t, device=device)
    out.copy_(t)
    return out


def _host_copy(t: torch.Tensor) -> torch.Tensor:
    """A pinned host copy (pinned where the tensor really is on a GPU: the cuda backend)."""
    with placed("pinned"):
        host = torch.empty_like(t, device="cpu", pin_memory=t.is_cuda)
        host.copy_(t)
    return host


def save_on_cpu_hooks(target: str) -> saved_tensors_hooks:
    """torch's `save_on_cpu(pin_memory=True)`, its copies placed as a `target` run has them."""
    inner = torch.autograd.graph.save_on_cpu(pin_memory=True)
    pack, unpack = inner.pack_hook, inner.unpack_hook

    def pack_to_host(t: torch.Tensor) -> Any:
        with placed("pinned"):
            return pack(t)

    def unpack_from_host(packed: Any) -> torch.Tensor:
        out = unpack(packed)
        if target == "cuda" and out is packed[1]:  # torch's .to(device) is a copy on CUDA
            return _to_device(out)
        return out

    return saved_tensors_hooks(_recorded(pack_to_host), _recorded(unpack_from_host))


def _recorded(hook: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """A saved-tensor hook whose copies are recorded wherever autograd calls it: also from
    a compiled region's `save_for_backward`, which AOTAutograd's runtime makes inside the
    capture's unrecorded call of the region (`emulate.compile.Region`)."""

    def run(x: Any) -> Any:
        with recorded():
            return hook(x)

    return run


class OffloadActivations(saved_tensors_hooks):
    """torchtune's `OffloadActivations` (use_streams=True), its memory as a CUDA run has
    it (see the module docstring); the state machine follows torchtune's."""

    def __init__(self, *, max_fwd_stash_size: int = 5, min_offload_size: int = 1024) -> None:
        if max_fwd_stash_size < 1:
            raise ValueError(f"max_fwd_stash_size must be >= 1, got {max_fwd_stash_size}")
        self.max_fwd_stash_size = max_fwd_stash_size
        self.min_offload_size = min_offload_size
        self.tracker: dict[int, tuple[torch.Tensor, bool]] = {}  # id -> (tensor, offloaded)
        self.devices: dict[int, torch.device] = {}  # id -> where an offloaded one came from
        self.tensor_id = 0
        self.first_forward_call = True
        self.first_backward_call = True
        self.fwd_stash: dict[int, torch.Tensor] = {}
        self.bwd_tensor_stash: dict[int, torch.Tensor] = {}
        self.curr_graph_id: Any = None
        self.curr_node: Any = None
        super().__init__(_recorded(self._pack), _recorded(self._unpack))

    # ---- forward --------------------------------------------------------------------
    def _pack(self, activation: torch.Tensor) -> int:
        if self.first_forward_call:
            if self.tracker:  # saved tensors no backward node used (outputs the loss
                # ignores): torchtune asserts here; their host copies go now
                log.debug("offload: %d saved tensors never unpacked", len(self.tracker))
                self.tracker.clear()
                self.devices.clear()
            self.first_forward_call = False
            self.first_backward_call = True
        num_bytes = activation.element_size() * activation.nelement()
        self.tensor_id += 1
        tensor_id = self.tensor_id
        is_param = isinstance(activation, nn.Parameter)
        is_buffer = isinstance(activation, nn.Buffer)
        if num_bytes < self.min_offload_size or is_param or is_buffer:
            self.tracker[tensor_id] = (activation, False)
            return tensor_id
        # the forward stash: device tensors offloaded long enough ago are released
        for old in [k for k in self.fwd_stash if k <= tensor_id - self.max_fwd_stash_size]:
            del self.fwd_stash[old]
        host = _host_copy(activation)
        self.devices[tensor_id] = activation.device
        self.tracker[tensor_id] = (host, True)
        self.fwd_stash[tensor_id] = activation
        return tensor_id

    # ---- backward -------------------------------------------------------------------
    def _unpack(self, tensor_id: int) -> torch.Tensor:
        if self.first_backward_call:
            self.curr_graph_id = torch._C._current_graph_task_id()

            def release_rest() -> None:
                self.bwd_tensor_stash.clear()

            torch.autograd.Variable._execution_engine.queue_callback(release_rest)
            self.first_backward_call = False
            self.first_forward_call = True
        if tensor_id not in self.tracker:
            raise RuntimeError(f"torchtune's OffloadActivations: untracked tensor {tensor_id}")
        tensor, modified = self.tracker[tensor_id]
        if modified:
            tensor = self._bring_back(tensor_id, tensor)
        del self.tracker[tensor_id]
        return tensor

    def _bring_back(self, tensor_id: int, host: torch.Tensor) -> torch.Tensor:
        graph_id = torch._C._current_graph_task_id()
        node = torch._C._current_autograd_node()
        prev_ids: list[int] = []
        if graph_id == self.curr_graph_id and self.curr_node != node:
            self.curr_node = node
            prev_ids = list(self.bwd_tensor_stash)
        brought_back = tensor_id not in self.fwd_stash
        device = self.devices.pop(tensor_id, None)
        if brought_back:
            tensor = _to_device(host, device)
            self.bwd_tensor_stash[tensor_id] = tensor
            count = torch._C._storage_Use_Count(tensor.untyped_storage()._cdata)
        else:
            tensor = self.fwd_stash[tensor_id]

        def hook(outputs: Any, inputs: Any) -> Any:
            if brought_back:
                kept = self.bwd_tensor_stash.get(tensor_id)
                if kept is not None:
                    now = torch._C._storage_Use_Count(kept.untyped_storage()._cdata)
                    if now > count:  # a view of it lives on: record_stream, then let go
                        del self.bwd_tensor_stash[tensor_id]
            self.fwd_stash.clear()  # backward has started: the stash is done with
            for old in prev_ids:
                self.bwd_tensor_stash.pop(old, None)
            return outputs

        if node is not None:
            node.register_hook(hook)
        return tensor


def _around(module: nn.Module, hooks: saved_tensors_hooks) -> None:
    """Enter `hooks` in `module`'s forward pre-hook and leave them in its forward hook
    (the hooks return None: the module's inputs and outputs stay as they are)."""

    def enter(*args: Any) -> None:
        hooks.__enter__()

    def leave(*args: Any) -> None:
        hooks.__exit__(None, None, None)

    module.register_forward_pre_hook(enter)
    module.register_forward_hook(leave, always_call=True)


def _output_head(model: nn.Module) -> nn.Module | None:
    head = getattr(model, "output", None)
    if isinstance(head, nn.Module):
        return head
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else None
    return head if isinstance(head, nn.Module) else None


def apply_activation_offload(model: nn.Module, train: TrainSpec, target: str) -> str:
    """Offload `model`'s saved activations as `train.offload.activations` says; returns
    what was done, in words ("" for nothing)."""
    kind = train.offload.activations
    if kind == "none":
        return ""
    if kind == "save_on_cpu":
        _around(model, save_on_cpu_hooks(target))
        return "torch.autograd.graph.save_on_cpu(pin_memory=True) around the model's forward"
    manager = OffloadActivations()
    _around(model, manager)
    head = _output_head(model)
    if head is None:
        log.warning("activation offloading: no output head found; it is offloaded too")
        return "torchtune's OffloadActivations around the forward (no output head found)"
    _around(head, saved_tensors_hooks(lambda t: t, lambda t: t))
    return "torchtune's OffloadActivations around the forward, the output head kept on GPU"
