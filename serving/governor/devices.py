"""Devices the governor reads: a memory-capped emulated GPU, the CPU tracker, and CUDA.

`EmulatedDevice` runs the real model on the CPU and puts every storage the step creates
through `predictor.sim.allocator.CachingAllocatorSim` with a capacity: a `TorchDispatchMode`
sees each op's outputs, allocates each new storage once (views and in-place ops alias an
existing one, as in `predictor.ir.recorder.StepRecorder`), and frees it when the storage dies
(`weakref.finalize`). When the simulated device would run out of memory, the op raises
`SimulatedOOM` (a `torch.OutOfMemoryError`) right there, as `torch.cuda` would. Tensors the
step reads that were made outside the device (a batch on the host) are adopted when first
seen, like a host-to-device copy; `transfer` copies a batch in explicitly.

Every device answers the `torch.cuda` memory questions the governor asks:
`memory_allocated`, `max_memory_allocated`, `memory_reserved`, `max_memory_reserved`,
`reset_peak_memory_stats`, `memory_stats` (torch.cuda keys plus fragmentation),
`mem_get_info`, `empty_cache`, and `capacity_bytes`, `profile` (the device profile a
prediction is made for), `target` (the capture target), `sm` (the compute capability a
capture is made for), `byte_scale` (bytes counted per tensor byte); `GovernedDevice` is
that interface. `serving.governor.cuda.CudaDevice` answers it from `torch.cuda`.

`EmulatedDevice(..., execute="fake")` runs the step on fake tensors (`FakeTensorMode`, as
a capture does): every op's outputs have the shapes, dtypes and storages of the real CPU
step, chosen by the same CPU kernel selection, but no kernel runs, so a model of any size
costs the per-op dispatch only. The loss is then not a number, and a GradScaler (which
reads its inf check) cannot run.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import weakref
from typing import Any, Literal, Protocol, runtime_checkable

import torch
from memgnn.predictor.sim.allocator import AllocatorConfig, CachingAllocatorSim, SimulatedOOM
from memgnn.serving.governor.cuda import CudaDevice
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map

log = logging.getLogger(__name__)

__all__ = [
    "CpuDevice",
    "CudaDevice",
    "EmulatedDevice",
    "GovernedDevice",
    "SimulatedOOM",
    "resolve_device",
]


@runtime_checkable
class GovernedDevice(Protocol):
    """What the governor reads and calls on a device (all bytes)."""

    capacity_bytes: int
    profile: str  # device profile name for `Query(device=...)`
    target: str  # capture target: "cpu" or "cuda"
    sm: int  # compute capability captures are made for (80 where the target is the CPU)
    byte_scale: int  # bytes counted per tensor byte (predictions are scaled alike)
    torch_device: torch.device  # where the model and its batches live

    def memory_allocated(self) -> int: ...
    def max_memory_allocated(self) -> int: ...
    def memory_reserved(self) -> int: ...
    def max_memory_reserved(self) -> int: ...
    def reset_peak_memory_stats(self) -> None: ...
    def memory_stats(self) -> dict[str, Any]: ...
    def mem_get_info(self) -> tuple[int, int]: ...
    def empty_cache(self) -> None: ...
    def context(self) -> contextlib.AbstractContextManager: ...
    def register(self, tensors: Any) -> None: ...
    def register_module(self, module: torch.nn.Module) -> None: ...
    def transfer(self, batch: Any) -> Any: ...
    def recover(self) -> int: ...


class _ExactAllocator:
    """Tensor bytes with no allocator effects (the `cpu` metric); never runs out."""

    def __init__(self, capacity: int | None) -> None:
        self.capacity, self.allocated, self.peak_allocated = capacity, 0, 0
        self._sizes: dict[int, int] = {}
        self._next = 1
        self.num_ooms = self.num_alloc_retries = 0

    def malloc(self, size: int) -> int:
        handle, self._next = self._next, self._next + 1
        self._sizes[handle] = size
        self.allocated += size
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        return handle

    def free(self, handle: int) -> None:
        self.allocated -= self._sizes.pop(handle)

    # reserved == allocated for a device without a cache
    @property
    def reserved(self) -> int:
        return self.allocated

    @property
    def peak_reserved(self) -> int:
        return self.peak_allocated

    def reset_peak_stats(self) -> None:
        self.peak_allocated = self.allocated

    def empty_cache(self) -> None:
        pass


class _TrackingMode(TorchDispatchMode):
    def __init__(self, device: _TrackedDevice) -> None:
        super().__init__()
        self.device = device

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        dev = self.device
        for t in _tensors(args):
            dev.adopt_tensor(t)
        if kwargs:
            for t in _tensors(kwargs.values()):
                dev.adopt_tensor(t)
        out = func(*args, **kwargs)
        if func.namespace == "prim":
            return out
        if isinstance(out, torch.Tensor):
            dev.on_output(out, func)
        elif isinstance(out, (tuple, list)):
            for t in _tensors(out):
                dev.on_output(t, func)
        return out


def _tensors(items: Any) -> list[torch.Tensor]:
    """Tensors in op arguments: top level and one level of lists/tuples (aten's forms)."""
    out = []
    for a in items:
        if isinstance(a, torch.Tensor):
            out.append(a)
        elif isinstance(a, (list, tuple)):
            out.extend(x for x in a if isinstance(x, torch.Tensor))
    return out


class _TrackedDevice:
    """Storage tracking shared by the emulated device and the CPU tracker."""

    target = "cpu"
    sm = 80  # captures for the cpu target do not depend on it
    torch_device = torch.device("cpu")
    byte_scale = 1

    def __init__(self, allocator: Any, capacity_bytes: int, profile: str) -> None:
        self.alloc = allocator
        self.capacity_bytes = capacity_bytes
        self.profile = profile
        self._live: dict[int, tuple[int, int]] = {}  # id(storage) -> (handle, nbytes)
        self._pending: list[int] = []
        self._busy = False
        self.mode = _TrackingMode(self)
        self.last_oom: dict[str, Any] | None = None

    # ---- tracking ---------------------------------------------------------------------
    fake: FakeTensorMode | None = None  # set: the step runs on fake tensors

    def _storage(self, t: torch.Tensor) -> Any | None:
        if t.layout != torch.strided or t.is_nested or t.device.type == "meta":
            return None
        if isinstance(t, FakeTensor) != (self.fake is not None):
            return None  # a capture's fake tensors on a real device; host tensors on a fake one
        return t.untyped_storage()

    def adopt_tensor(self, t: torch.Tensor) -> None:
        storage = self._storage(t)
        if storage is not None and id(storage) not in self._live:
            self._allocate(storage, None)

    def on_output(self, t: torch.Tensor, func: Any) -> None:
        storage = self._storage(t)
        if storage is None:
            return
        known = self._live.get(id(storage))
        if known is None:
            self._allocate(storage, func)
        elif known[1] != storage.nbytes():  # resized in place (resize_, out= ops)
            self._release(known[0])
            del self._live[id(storage)]
            self._allocate(storage, func)

    def _allocate(self, storage: Any, func: Any) -> None:
        nbytes = storage.nbytes()
        self._busy = True
        try:
            handle = self.alloc.malloc(nbytes * self.byte_scale)
        except SimulatedOOM as exc:
            self.last_oom = {"op": str(func) if func is not None else "<input>", "bytes": nbytes}
            raise SimulatedOOM(f"{exc} [at op {self.last_oom['op']}]") from None
        finally:
            self._busy = False
            self._drain()
        key = id(storage)
        self._live[key] = (handle, nbytes)
        weakref.finalize(storage, self._on_free, key, handle)

    def _on_free(self, key: int, handle: int) -> None:
        live = self._live.get(key)
        if live is not None and live[0] == handle:
            del self._live[key]
        if self._busy:  # a storage died inside malloc: free it right after
            self._pending.append(handle)
        else:
            self._release(handle)

    def _release(self, handle: int) -> None:
        self.alloc.free(handle)

    def _drain(self) -> None:
        while self._pending:
            self._release(self._pending.pop())

    def register(self, tensors: Any) -> None:
        """Count tensors made outside the device (e.g. a model built before) as on it."""
        for t in tree_leaves(tensors):
            if isinstance(t, torch.Tensor):
                self.adopt_tensor(t)

    def register_module(self, module: torch.nn.Module) -> None:
        self.register([*module.parameters(), *module.buffers()])

    def transfer(self, batch: Any) -> Any:
        """A copy of `batch` on the device (tensors cloned inside it, like `.to(device)`)."""

        def copy(t: Any) -> Any:
            if not isinstance(t, torch.Tensor):
                return t
            # made on the host, then counted on the device (not the source)
            out = t.clone()  # a view's own elements only, as `.to(device)` copies them
            if self.fake is not None:
                out = self.fake.from_tensor(out)
            self.adopt_tensor(out)
            return out

        return tree_map(copy, batch)

    def context(self) -> contextlib.AbstractContextManager:
        if self.fake is None:
            return self.mode
        stack = contextlib.ExitStack()
        stack.enter_context(self.fake)
        stack.enter_context(self.mode)
        return stack

    def __enter__(self) -> _TrackedDevice:
        self._entered = self.context()
        self._entered.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._entered.__exit__(*exc)

    def recover(self) -> int:
        """Collect garbage after a failed step; returns the bytes still allocated."""
        gc.collect()
        self.empty_cache()
        return self.memory_allocated()

    # ---- torch.cuda-like stats ----------------------------------------------------------
    def memory_allocated(self) -> int:
        return self.alloc.allocated

    def max_memory_allocated(self) -> int:
        return self.alloc.peak_allocated

    def memory_reserved(self) -> int:
        return self.alloc.reserved

    def max_memory_reserved(self) -> int:
        return self.alloc.peak_reserved

    def reset_peak_memory_stats(self) -> None:
        self.alloc.reset_peak_stats()

    def empty_cache(self) -> None:
        self.alloc.empty_cache()

    def mem_get_info(self) -> tuple[int, int]:
        return max(self.capacity_bytes - self.memory_reserved(), 0), self.capacity_bytes

    def fragmentation(self) -> tuple[int, int]:
        """(largest free cached block, free reserved bytes)."""
        return 0, 0

    def memory_stats(self) -> dict[str, Any]:
        largest, free_reserved = self.fragmentation()
        return {
            "allocated_bytes.all.current": self.memory_allocated(),
            "allocated_bytes.all.peak": self.max_memory_allocated(),
            "reserved_bytes.all.current": self.memory_reserved(),
            "reserved_bytes.all.peak": self.max_memory_reserved(),
            "num_alloc_retries": self.alloc.num_alloc_retries,
            "num_ooms": self.alloc.num_ooms,
            "largest_free_block_bytes": largest,
            "free_reserved_bytes": free_reserved,
            "fragmentation": largest / free_reserved if free_reserved > 0 else 1.0,
        }


class EmulatedDevice(_TrackedDevice):
    """A GPU of `capacity_bytes` emulated on the CPU through the caching-allocator model.

    Predictions for it use the `cpu` profile (tensor bytes of CPU kernels); the allocator's
    rounding, caching and fragmentation are what the governor's residual correction learns.
    `byte_scale` > 1 counts every storage that many times its size: a small model then
    stresses the device like one with `byte_scale`-times larger tensors, at the small
    model's compute cost (predictions for the device must be scaled alike).
    """

    def __init__(
        self,
        capacity_bytes: int,
        config: AllocatorConfig | None = None,
        *,
        byte_scale: int = 1,
        execute: Literal["cpu", "fake"] = "cpu",
    ) -> None:
        if execute not in ("cpu", "fake"):
            raise ValueError(f"execute must be cpu or fake, got {execute!r}")
        self.fake = FakeTensorMode(allow_non_fake_inputs=True) if execute == "fake" else None
        if capacity_bytes <= 0:
            raise ValueError(f"capacity_bytes must be positive, got {capacity_bytes}")
        if isinstance(byte_scale, bool) or not isinstance(byte_scale, int) or byte_scale < 1:
            raise ValueError(f"byte_scale must be a positive int, got {byte_scale!r}")
        self.byte_scale = byte_scale
        cfg = config or AllocatorConfig()
        if cfg.capacity_bytes not in (None, capacity_bytes):
            raise ValueError("allocator config capacity differs from capacity_bytes")
        cfg.capacity_bytes = capacity_bytes
        super().__init__(CachingAllocatorSim(cfg), capacity_bytes, "cpu")

    def fragmentation(self) -> tuple[int, int]:
        sim = self.alloc
        free = [*sim._small.blocks.values(), *sim._large.blocks.values()]
        return max((b.size for b in free), default=0), sim.reserved - sim.allocated

    def memory_stats(self) -> dict[str, Any]:
        out = super().memory_stats()
        out["requested_bytes.all.current"] = self.alloc.requested
        out["requested_bytes.all.peak"] = self.alloc.peak_requested
        return out


class CpuDevice(_TrackedDevice):
    """The CPU with a memory budget: live tensor bytes, counted by the same tracker."""

    def __init__(self, capacity_bytes: int) -> None:
        if capacity_bytes <= 0:
            raise ValueError(f"capacity_bytes must be positive, got {capacity_bytes}")
        super().__init__(_ExactAllocator(capacity_bytes), capacity_bytes, "cpu")


def resolve_device(
    device: str | GovernedDevice, capacity_bytes: int | None = None
) -> GovernedDevice:
    """A governed device from "cuda" | "cuda:N" | "cpu" | "emulated" | a device object."""
    if not isinstance(device, str):
        if not isinstance(device, GovernedDevice):
            missing = [n for n in _PROTOCOL_MEMBERS if not hasattr(device, n)]
            raise ValueError(f"{type(device).__name__} is not a governed device: lacks {missing}")
        return device
    if device.startswith("cuda"):
        index = int(device.split(":", 1)[1]) if ":" in device else 0
        return CudaDevice(index)
    if device in ("cpu", "emulated"):
        if capacity_bytes is None:
            raise ValueError(f"device {device!r} needs capacity_bytes (the memory budget)")
        return CpuDevice(capacity_bytes) if device == "cpu" else EmulatedDevice(capacity_bytes)
    raise ValueError(f"unknown device {device!r}; expected cuda, cuda:N, cpu or emulated")


_PROTOCOL_MEMBERS = sorted(n for n in dir(GovernedDevice) if not n.startswith("_")) + [
    "capacity_bytes",
    "profile",
    "target",
    "sm",
    "byte_scale",
    "torch_device",
]
