"""torchao's `CPUOffloadOptimizer` (torchao/optim/cpu_offload.py, 0.18), as a CUDA run
places its tensors, on any tensors.

torchao's class asserts a CUDA or XPU device and moves data with streams; memgnn runs its
structure on the step's (fake or real CPU) tensors and says where each storage lives:

- every trained parameter of >= `minimal_size` (4096) elements gets a pinned host copy
  (`empty_like(p, device="cpu", pin_memory=True)`) and a pinned host gradient of the same
  shape and dtype, made when the optimizer is built;
- its own optimizer (default `torch.optim.AdamW(fused=True)`) steps that host copy on the
  CPU: its state and its step's temporaries are ordinary (pageable) host memory;
- the GPU gradient is copied to the host gradient in the parameter's post-accumulate-grad
  hook; with `offload_gradients=True` it is freed there (no accumulation), else it lives
  until `zero_grad` (which always sets gradients to None);
- after each host step the host copy is copied into the GPU parameter in place;
- smaller parameters stay with one on-device optimizer of the same class and arguments.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from memgnn.predictor.ir.recorder import mark_place, placed
from torch import nn

__all__ = ["CPUOffloadOptimizer"]

MINIMAL_SIZE = 4096  # torchao's default: smaller parameters stay on the GPU


def _tensors(state: dict) -> list[torch.Tensor]:
    return [v for s in state.values() for v in s.values() if isinstance(v, torch.Tensor)]


class CPUOffloadOptimizer:
    """`torchao.optim.CPUOffloadOptimizer(params, optimizer_class, offload_gradients=...)`
    (see the module docstring). `make(tensors, on_host)` builds the optimizer over a list
    of tensors, on the host (`on_host`) or on the device."""

    def __init__(
        self,
        params: list[nn.Parameter],
        make: Callable[[list[torch.Tensor], bool], torch.optim.Optimizer],
        *,
        offload_gradients: bool = False,
        minimal_size: int = MINIMAL_SIZE,
    ) -> None:
        if not params:
            raise ValueError("optimizer got an empty parameter list")
        self.offload_gradients = offload_gradients
        self.host: dict[nn.Parameter, torch.Tensor] = {}
        self.host_optim: dict[nn.Parameter, torch.optim.Optimizer] = {}
        self.queue: dict[nn.Parameter, None] = {}
        retained = []
        for p in params:
            if not p.requires_grad:
                continue
            if p.numel() < minimal_size:
                retained.append(p)
                continue
            with placed("pinned"):  # pinned for real where p is on a GPU (cuda backend)
                host = torch.empty_like(p, device="cpu", pin_memory=p.is_cuda)
                host.grad = torch.empty_like(host, pin_memory=p.is_cuda)
                host.copy_(p.detach())
            mark_place([host, host.grad], "pinned")
            self.host[p] = host
            p.register_post_accumulate_grad_hook(self._grad_ready)
            self.host_optim[p] = make([host], True)
        self.device_optim = make(retained, False) if retained else None

    def _grad_ready(self, p: nn.Parameter) -> None:
        if p.grad is None:
            return
        self.host[p].grad.copy_(p.grad)  # D2H into the pinned gradient
        self.queue.pop(p, None)  # re-queued last (accumulation moves it to the end)
        self.queue[p] = None
        if self.offload_gradients:
            p.grad = None

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = closure() if closure is not None else None
        if self.device_optim is not None:
            self.device_optim.step()
        for p in self.queue:
            optimizer = self.host_optim[p]
            with placed("pageable"):  # the CPU step: its state and temporaries on the host
                optimizer.step()
            mark_place(_tensors(optimizer.state), "pageable")
            p.copy_(self.host[p])  # H2D into the parameter, in place
        self.queue.clear()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        if not set_to_none:
            raise ValueError("CPUOffloadOptimizer.zero_grad sets gradients to None only")
        for p in self.host:
            p.grad = None
        if self.device_optim is not None:
            self.device_optim.zero_grad(set_to_none=True)

    @property
    def optimizers(self) -> list[torch.optim.Optimizer]:
        """Every optimizer it runs: the host ones and the on-device one."""
        return [*self.host_optim.values(), *self.device_optimizers]

    @property
    def device_optimizers(self) -> list[torch.optim.Optimizer]:
        """The optimizer that steps on the device (parameters under `minimal_size`)."""
        return [self.device_optim] if self.device_optim is not None else []

    @property
    def param_groups(self) -> list[dict]:
        return [g for o in self.optimizers for g in o.param_groups]

    @property
    def state(self) -> dict:
        """Every optimizer's state, by parameter (host copies for the offloaded ones)."""
        return {p: s for o in self.optimizers for p, s in o.state.items()}

    def host_tensors(self) -> dict[str, list[torch.Tensor]]:
        """The pinned copies alive across steps, by category."""
        return {
            "parameter": list(self.host.values()),
            "gradient": [h.grad for h in self.host.values()],
        }
