"""The governor's view of a real GPU: `torch.cuda` memory statistics for one device.

Same interface as `serving.governor.devices.EmulatedDevice`; fragmentation (largest free
cached block / free reserved bytes) comes from `torch.cuda.memory_snapshot()`, which is why
the governor reads it only every `fragmentation_every` samples. `profile` names the device
profile predictions are made for: the closest known one by compute capability and memory,
unless given.
"""

from __future__ import annotations

import contextlib
import gc
import logging
from typing import Any

import torch
from memgnn.predictor.spec.devices import PROFILES
from torch.utils._pytree import tree_map

log = logging.getLogger(__name__)

__all__ = ["CudaDevice"]


class CudaDevice:
    """`torch.cuda` for one device; `profile` names the closest device profile."""

    target = "cuda"
    byte_scale = 1

    def __init__(self, index: int = 0, profile: str | None = None) -> None:
        if not torch.cuda.is_available():
            raise ValueError("CUDA is not available: use EmulatedDevice or CpuDevice")
        self.index = index
        self.torch_device = torch.device("cuda", index)
        props = torch.cuda.get_device_properties(index)
        self.capacity_bytes = int(props.total_memory)
        self.sm = props.major * 10 + props.minor
        self.profile = profile or _closest_profile(self.capacity_bytes, self.sm)

    def memory_allocated(self) -> int:
        return torch.cuda.memory_allocated(self.index)

    def max_memory_allocated(self) -> int:
        return torch.cuda.max_memory_allocated(self.index)

    def memory_reserved(self) -> int:
        return torch.cuda.memory_reserved(self.index)

    def max_memory_reserved(self) -> int:
        return torch.cuda.max_memory_reserved(self.index)

    def reset_peak_memory_stats(self) -> None:
        torch.cuda.reset_peak_memory_stats(self.index)

    def mem_get_info(self) -> tuple[int, int]:
        return torch.cuda.mem_get_info(self.index)

    def empty_cache(self) -> None:
        torch.cuda.empty_cache()

    def register(self, tensors: Any) -> None:
        pass

    def register_module(self, module: torch.nn.Module) -> None:
        pass

    def transfer(self, batch: Any) -> Any:
        dev = self.torch_device
        return tree_map(
            lambda t: t.to(dev, non_blocking=True) if isinstance(t, torch.Tensor) else t, batch
        )

    def context(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def recover(self) -> int:
        gc.collect()
        torch.cuda.empty_cache()
        return self.memory_allocated()

    def memory_stats(self) -> dict[str, Any]:
        stats = dict(torch.cuda.memory_stats(self.index))
        largest = 0
        for seg in torch.cuda.memory_snapshot():
            if seg.get("device", self.index) != self.index:
                continue
            for block in seg["blocks"]:
                if block["state"] == "inactive":
                    largest = max(largest, block["size"])
        free = stats.get("reserved_bytes.all.current", 0) - stats.get(
            "allocated_bytes.all.current", 0
        )
        stats["largest_free_block_bytes"] = largest
        stats["free_reserved_bytes"] = free
        stats["fragmentation"] = largest / free if free > 0 else 1.0
        return stats


def _closest_profile(total: int, sm: int) -> str:
    gpus = [p for p in PROFILES.values() if p.is_gpu]
    best = min(gpus, key=lambda p: (p.sm != sm, abs((p.total_bytes or 0) - total)))
    return best.name
