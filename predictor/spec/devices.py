"""Device profiles: what a device adds around the tensors, so every metric can be reported.

- `total_bytes`: device memory as nvidia-smi reports it (MiB figure x 2**20). Sources: the
  vendor's nvidia-smi totals commonly reported for each board (nominal, not measured
  here); measured values replace them when `memgnn validate-gpu` runs on the device.
- `cublas_workspace_bytes`: one cuBLAS workspace per (handle, stream), allocated through the
  caching allocator and kept: 4096 KiB x 2 + 16 KiB x 8 = 8,519,680 B before Hopper,
  32 MiB on sm90 and newer (``getChosenWorkspaceSize`` in PyTorch v2.13.0
  ``aten/src/ATen/cuda/CublasHandlePool.cpp``).
- `context_bytes`: CUDA context outside the allocator, counted by nvidia-smi only. The
  reference gives about 287 MB with lazy module loading (default since CUDA 11.7); kernel
  images loaded later add more, so this is an estimate that real measurements correct.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

MiB = 1 << 20
GiB = 1 << 30
_WS_PRE_HOPPER = 4096 * 1024 * 2 + 16 * 1024 * 8  # 8,519,680 B
_WS_HOPPER = 32 * MiB
_CONTEXT_LAZY = 287 * MiB


@dataclass(kw_only=True, slots=True, frozen=True)
class DeviceProfile:
    name: str
    kind: str  # "cuda" or "cpu"
    total_bytes: int | None
    sm: int | None = None  # compute capability x10 (80 = sm_80)
    cublas_workspace_bytes: int = 0
    context_bytes: int = 0
    bf16: bool = True
    flash_attention: bool = False  # FlashAttention-2 kernels (sm80+) for fp16/bf16 SDPA

    def __post_init__(self) -> None:
        if self.kind not in ("cuda", "cpu"):
            raise ValueError(f"device kind must be cuda or cpu, got {self.kind!r}")
        if self.total_bytes is not None and self.total_bytes <= 0:
            raise ValueError(f"device {self.name}: total_bytes must be positive")

    @property
    def is_gpu(self) -> bool:
        return self.kind == "cuda"

    def check_precision(self, precision: str) -> None:
        """ValueError if the device cannot train in `precision`."""
        if "bf16" in precision and not self.bf16:
            raise ValueError(f"device {self.name} has no bfloat16 support (sm {self.sm})")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def gpu_profile(name: str, mib: int, sm: int) -> DeviceProfile:
    return DeviceProfile(
        name=name,
        kind="cuda",
        total_bytes=mib * MiB,
        sm=sm,
        cublas_workspace_bytes=_WS_HOPPER if sm >= 90 else _WS_PRE_HOPPER,
        context_bytes=_CONTEXT_LAZY,
        bf16=sm >= 80,
        flash_attention=sm >= 80,
    )


PROFILES: dict[str, DeviceProfile] = {
    p.name: p
    for p in (
        DeviceProfile(name="cpu", kind="cpu", total_bytes=None),
        gpu_profile("v100-16gb", 16160, 70),
        gpu_profile("v100-32gb", 32510, 70),
        gpu_profile("t4-16gb", 15360, 75),
        gpu_profile("a10g-24gb", 23028, 86),
        gpu_profile("l4-24gb", 23034, 89),
        gpu_profile("rtx4090-24gb", 24564, 89),
        gpu_profile("a100-40gb", 40960, 80),
        gpu_profile("a100-80gb", 81920, 80),
        gpu_profile("h100-80gb", 81559, 90),
        gpu_profile("h200-141gb", 143771, 90),
    )
}


def get_profile(name: str) -> DeviceProfile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown device profile {name!r}; known: {', '.join(PROFILES)}") from None
