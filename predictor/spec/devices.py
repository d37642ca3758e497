"""Device profiles: what a device adds around the tensors, so every metric can be reported.

- `total_bytes`: device memory as nvidia-smi reports it (its MiB figure x 2**20), the total
  of the board as it appears in nvidia-smi output published for it (`source` says which);
  measured values replace them when `memgnn validate-gpu` runs on the device.
- `cublas_workspace_bytes`: one cuBLAS workspace per (handle, stream), allocated through the
  caching allocator and kept. `parseChosenWorkspaceSize` (PyTorch
  `aten/src/ATen/cuda/CublasHandlePool.cpp`) defaults to 32 MiB when the compute
  capability's major is 9, 10, 11 or 12 (Hopper, Blackwell: 32 MiB on Blackwell since
  pytorch/pytorch#175344, Feb 2026; its revert #182669 was closed unmerged), else to
  `:4096:2:16:8` = 4096 KiB x 2 + 16 KiB x 8 = 8,519,680 B. torch 2.13.0 still caches it:
  its own docs (`torch/backends/cuda/__init__.py`, `blas_workspace_size`) describe the
  cuBLASLt workspace as reusing the cached cuBLAS one by default, and its
  `current_blas_handle` docstring has none of the later "default workspace unless caching
  is enabled" wording (torch 2.15's docs), so this term is for torch 2.13.
- `context_bytes`: CUDA context outside the allocator, counted by nvidia-smi only. The
  reference gives about 287 MB with lazy module loading (default since CUDA 11.7); kernel
  images loaded later add more, so this is an estimate that real measurements correct.

AMD Instinct boards (MI250X, MI300X) are not profiled: ROCm builds run the same caching
allocator (hipified from c10/cuda), but their BLAS workspaces differ (hipBLAS 32 MiB, 128 MiB
on gfx942/gfx950, plus a separate 76 MiB hipBLASLt pool per handle and stream in the
upstream source) and neither those for torch 2.13 nor the HIP context nor the boards' totals
as torch reports them could be read from a source here.

`custom_profile` builds a profile for any other card from its memory and compute capability;
`get_profile` accepts the names it makes (`custom-48gib-sm89`).
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass
from typing import Any

__all__ = [
    "DEFAULT_CUSTOM_SM",
    "PROFILES",
    "DeviceProfile",
    "cublas_workspace_bytes",
    "custom_profile",
    "get_profile",
    "gpu_profile",
]

MiB = 1 << 20
GiB = 1 << 30
_WS_PRE_HOPPER = 4096 * 1024 * 2 + 16 * 1024 * 8  # 8,519,680 B
_WS_HOPPER = 32 * MiB
_WS_32MIB_MAJORS = (9, 10, 11, 12)
_CONTEXT_LAZY = 287 * MiB
DEFAULT_CUSTOM_SM = 80  # custom_profile without a compute capability: an A100-class card


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
    source: str = ""  # where total_bytes and sm come from

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


def cublas_workspace_bytes(sm: int) -> int:
    """The cuBLAS workspace torch 2.13 allocates per (handle, stream) on compute capability
    `sm` (x10): 32 MiB for majors 9 to 12 (Hopper, Blackwell), else 8,519,680 B."""
    return _WS_HOPPER if sm // 10 in _WS_32MIB_MAJORS else _WS_PRE_HOPPER


def gpu_profile(name: str, mib: int, sm: int, source: str = "") -> DeviceProfile:
    return DeviceProfile(
        name=name,
        kind="cuda",
        total_bytes=mib * MiB,
        sm=sm,
        cublas_workspace_bytes=cublas_workspace_bytes(sm),
        context_bytes=_CONTEXT_LAZY,
        bf16=sm >= 80,
        flash_attention=sm >= 80,
        source=source,
    )


_SMI = "nvidia-smi total as printed for the board in public logs"
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
        # Added with their sources: the MiB total as nvidia-smi prints it for that board
        # ("NVIDIA L40S ... 46068MiB"), compute capability from NVIDIA's CUDA GPU table.
        gpu_profile("a10-24gb", 23028, 86, f"{_SMI} (NVIDIA A10: 23028MiB); sm86 (Ampere GA102)"),
        gpu_profile("rtx3090-24gb", 24576, 86, f"{_SMI} (RTX 3090: 24576MiB); sm86"),
        gpu_profile("rtx5090-32gb", 32607, 120, f"{_SMI} (RTX 5090: 32607MiB); sm120"),
        gpu_profile("l40s-48gb", 46068, 89, f"{_SMI} (NVIDIA L40S: 46068MiB); sm89 (Ada)"),
        gpu_profile("rtxa6000-48gb", 49140, 86, f"{_SMI} (RTX A6000: 49140MiB); sm86"),
        gpu_profile(
            "h100-pcie-80gb", 81559, 90, f"{_SMI} (NVIDIA H100 PCIe: 81559MiB); sm90 (Hopper)"
        ),
        gpu_profile("h100-sxm-80gb", 81559, 90, f"{_SMI} (NVIDIA H100 80GB HBM3: 81559MiB); sm90"),
        gpu_profile("b200-180gb", 183359, 100, f"{_SMI} (NVIDIA B200: 183359MiB); sm100"),
    )
}

_UNITS = {
    "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
}  # fmt: skip
_SIZE_RE = re.compile(r"^([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)([kmgt]i?b|b)?$")
_CUSTOM_RE = re.compile(r"^custom-([0-9a-z.]+)-sm([0-9]+)$")
_MIN_MEMORY = 1 << 30  # above the CUDA context (`_CONTEXT_LAZY`), with room to train


def _memory_bytes(memory: str) -> int:
    """Bytes from `48GiB`, `80GB`, `24 GiB`, `51539607552` (bare: bytes); ValueError else."""
    text = str(memory).strip().lower().replace(" ", "")
    m = _SIZE_RE.match(text)
    if m is None:
        raise ValueError(
            f"cannot read a device memory size from {memory!r}: give bytes with a unit "
            "(48GiB, 80GB, 24576MiB) or a whole number of bytes"
        )
    value = float(m.group(1)) * _UNITS[m.group(2) or "b"]
    if not math.isfinite(value) or value != int(value):
        raise ValueError(f"device memory {memory!r} is not a whole number of bytes")
    if value < _MIN_MEMORY:
        raise ValueError(
            f"device memory {memory!r} is under 1 GiB: not a training GPU (the CUDA "
            f"context alone takes {_CONTEXT_LAZY // MiB} MiB)"
        )
    return int(value)


def _size_label(total: int) -> str:
    """The shortest exact spelling of `total` bytes for a profile name: 48gib, 80gb, ..."""
    for unit in ("tib", "gib", "tb", "gb", "mib", "mb", "kib", "kb"):
        if total % _UNITS[unit] == 0:
            return f"{total // _UNITS[unit]}{unit}"
    return f"{total}b"


def custom_profile(memory: str, sm: int | None = None) -> DeviceProfile:
    """A CUDA profile for a card by its memory and compute capability, named
    `custom-<memory>-sm<sm>` (`custom_profile("48GiB", 89).name == "custom-48gib-sm89"`).

    `memory` is the total the device reports (nvidia-smi's MiB figure, or torch's
    `get_device_properties().total_memory`), not the marketing size: an "48 GB" RTX A6000
    reports 49140 MiB. `sm` is the compute capability x10 (86 for 8.6); without it sm80 is
    assumed (`DEFAULT_CUSTOM_SM`: bf16 and FlashAttention-2 available, the 8,519,680 B
    pre-Hopper cuBLAS workspace). The workspace follows `cublas_workspace_bytes(sm)`; the
    CUDA context is the same lazy-loading estimate as every profile's."""
    total = _memory_bytes(memory)
    assumed = sm is None
    sm = DEFAULT_CUSTOM_SM if sm is None else sm
    if isinstance(sm, bool) or not isinstance(sm, int) or not 50 <= sm <= 129:
        raise ValueError(
            f"compute capability must be an integer x10 between 50 and 129 (86 for sm_86), "
            f"got {sm!r}"
        )
    label = _size_label(total)
    name = f"custom-{label}-sm{sm}"
    note = f"custom: {label} ({total:,} B), " + (
        f"compute capability not given: sm{sm} assumed" if assumed else f"sm{sm}"
    )
    return DeviceProfile(
        name=name,
        kind="cuda",
        total_bytes=total,
        sm=sm,
        cublas_workspace_bytes=cublas_workspace_bytes(sm),
        context_bytes=_CONTEXT_LAZY,
        bf16=sm >= 80,
        flash_attention=sm >= 80,
        source=note,
    )


def get_profile(name: str) -> DeviceProfile:
    """The named profile, or the custom one a `custom-<memory>-sm<sm>` name describes."""
    if name in PROFILES:
        return PROFILES[name]
    m = _CUSTOM_RE.match(name)
    if m is not None:
        return custom_profile(m.group(1), int(m.group(2)))
    raise ValueError(
        f"unknown device profile {name!r}; known: {', '.join(PROFILES)}, or "
        "custom-<memory>-sm<cc> (e.g. custom-48gib-sm89)"
    )
