"""bitsandbytes' 8-bit AdamW (`bnb.optim.AdamW8bit`), as its CUDA step allocates, on any tensors.

What `Optimizer2State.init_state` creates the first time a parameter has a gradient
(bitsandbytes 0.50.2, `optim/optimizer.py`; non-paged, `optim_bits=8`, `max_unorm=0`):
- a parameter with at least `min_8bit_size` (4096) elements: `state1` and `state2`, uint8
  like the parameter (`zeros_like(p, dtype=uint8)`), and `absmax1` / `absmax2`, fp32, one
  per block of 256 elements (`ceil(n / 256)`);
- a smaller one: `state1` / `state2` in fp32 like the parameter (the 32-bit update);
- once per device, at the first 8-bit parameter: the signed and unsigned 256-entry fp32
  dynamic quantisation maps (`name2qmap[...].to(p.device)`; the host copies made in
  `__init__` are not on the device).
The step counter is a Python int. The update (`optimizer_update_8bit_blockwise` /
`optimizer_update_32bit`) is one fused in-place CUDA kernel per parameter that allocates
nothing; here one in-place op per parameter stands for it (its arithmetic is not bnb's:
this optimizer models memory, for captures and the `sim` backend).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

__all__ = ["AdamW8bit", "adamw8bit_state_bytes"]

BLOCKSIZE = 256
MIN_8BIT_SIZE = 4096
_QMAP_BYTES = 2 * 256 * 4


def adamw8bit_state_bytes(numels: Iterable[int], *, min_8bit_size: int = MIN_8BIT_SIZE) -> int:
    """Bytes of AdamW8bit state for parameters of these sizes, by hand (incl. the maps)."""
    total, any_8bit = 0, False
    for n in numels:
        if n < min_8bit_size:
            total += 2 * 4 * n
        else:
            any_8bit = True
            total += 2 * n + 2 * 4 * -(n // -BLOCKSIZE)
    return total + (_QMAP_BYTES if any_8bit else 0)


class AdamW8bit(torch.optim.Optimizer):
    """`bnb.optim.AdamW8bit(params, lr, betas, eps, weight_decay, min_8bit_size)`: its
    state tensors exactly (see the module docstring), its update as one in-place op."""

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        min_8bit_size: int = MIN_8BIT_SIZE,
    ):
        if not lr > 0:
            raise ValueError(f"lr must be > 0, got {lr}")
        if min_8bit_size < 1:
            raise ValueError(f"min_8bit_size must be >= 1, got {min_8bit_size}")
        defaults = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay}
        super().__init__(params, defaults)
        self.min_8bit_size = min_8bit_size
        self._qmaps: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def _device_qmaps(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if device not in self._qmaps:
            signed = torch.empty(256, dtype=torch.float32, device=device)
            unsigned = torch.empty(256, dtype=torch.float32, device=device)
            self._qmaps[device] = (signed, unsigned)
        return self._qmaps[device]

    def _init_state(self, p: torch.Tensor) -> None:
        state = self.state[p]
        state["step"] = 0
        if p.numel() < self.min_8bit_size:
            state["state1"] = torch.zeros_like(p, dtype=torch.float32)
            state["state2"] = torch.zeros_like(p, dtype=torch.float32)
            return
        qmap1, qmap2 = self._device_qmaps(p.device)
        state["state1"] = torch.zeros_like(p, dtype=torch.uint8)
        state["qmap1"] = qmap1
        state["state2"] = torch.zeros_like(p, dtype=torch.uint8)
        state["qmap2"] = qmap2
        blocks = -(p.numel() // -BLOCKSIZE)
        state["absmax1"] = torch.zeros(blocks, dtype=torch.float32, device=p.device)
        state["absmax2"] = torch.zeros(blocks, dtype=torch.float32, device=p.device)

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if not self.state[p]:
                    self._init_state(p)
                self.state[p]["step"] += 1
                p.add_(p.grad, alpha=-group["lr"])  # stands for the fused update kernel
        return loss
