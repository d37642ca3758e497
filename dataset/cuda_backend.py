"""The `cuda` backend: a real training step on the GPU, measured by PyTorch's caching allocator.

What one `profile_cuda` call measures, in this order (all bytes):
1. A clean slate: `gc.collect()`, cuBLAS workspaces released, `empty_cache()`, peak stats
   reset, so every config starts as a fresh process would (a config's numbers do not
   depend on what ran before it). The device's used memory (`mem_get_info`) is noted.
2. `TrainingStep` builds the model, optimizer and scaler on the GPU. Building is not
   measured by itself, but everything it leaves alive (parameters, buffers) is live when
   the first step starts, so it counts in every peak.
3. `step_plan(train)` gives warm-up and measured steps. Warm-up steps run unmeasured. Before
   a measured steady step (step 1), `warmup_steps` extra steady steps run unmeasured. With
   the defaults (steps="both", warmup_steps=1): step 0 measured as the first step, one
   unmeasured steady step, then step 1 measured as steady state; with warmup_steps=0, step
   1 directly follows step 0 (what the sim replays).
4. At every phase boundary (input, forward, backward, optimizer, zero_grad) the observer
   synchronizes, reads `max_memory_allocated` / `max_memory_reserved` for the phase that
   just ended, samples device used memory (total - free from `mem_get_info`; NVML too where
   pynvml is importable), then resets the peak stats. Reserved memory only grows between
   resets (except on an OOM retry), so the sample at a phase's end is its peak.
   `breakdown.phases[phase]` is the max over measured steps; `breakdown.first_step` and
   `breakdown.steady_state` the max over that step's phases; `peak_*` the max of both.
5. After each measured optimizer update (gradients still alive) the storages of parameters
   + buffers, gradients and optimizer state are summed (`breakdown.categories`, from the
   last measured step). At the end: allocator counters, fragmentation from
   `memory_snapshot()` (largest free block / free reserved bytes), optional snapshot dump.

`torch.OutOfMemoryError` is not raised: the result has `stats.oom` True, the message, and
the peaks measured up to the failure. Everything is released afterwards.
"""

from __future__ import annotations

import gc
import logging
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from memgnn.predictor.capture.step import TrainingStep, step_plan
from memgnn.predictor.memory.analytic import STEP_NAMES
from memgnn.predictor.spec.bundle import ModelBundle
from memgnn.predictor.spec.devices import PROFILES, DeviceProfile, GiB, MiB, gpu_profile
from memgnn.predictor.spec.train import TrainSpec

log = logging.getLogger(__name__)

NO_CUDA = "no CUDA device: the cuda backend needs a GPU; use --backend sim"
TOTAL_TOLERANCE = 0.10  # a named board whose memory differs more than this is not that profile
HISTORY_MAX_ENTRIES = 100_000

# A device-name pattern and the profiles it may be; the closest total memory wins.
_NAME_RULES: tuple[tuple[re.Pattern[str], tuple[str, ...]], ...] = (
    (re.compile(r"\bH200\b", re.I), ("h200-141gb",)),
    (re.compile(r"\bH[18]00\b", re.I), ("h100-80gb",)),
    (re.compile(r"\bA[18]00\b", re.I), ("a100-40gb", "a100-80gb")),
    (re.compile(r"\bV100\b", re.I), ("v100-16gb", "v100-32gb")),
    (re.compile(r"\bT4\b", re.I), ("t4-16gb",)),
    (re.compile(r"\bA10G?\b", re.I), ("a10g-24gb",)),
    (re.compile(r"\bL4\b", re.I), ("l4-24gb",)),
    (re.compile(r"\b4090\b", re.I), ("rtx4090-24gb",)),
)


# ---- which device profile ------------------------------------------------------------------


def generic_profile(total_bytes: int, sm: int) -> DeviceProfile:
    """A profile from the device's own properties ("cuda-<sm>-<GiB>gb"), for unknown boards."""
    if total_bytes <= 0 or sm <= 0:
        raise ValueError(f"bad device properties: total_bytes={total_bytes}, sm={sm}")
    name = f"cuda-{sm}-{round(total_bytes / GiB)}gb"
    return replace(gpu_profile(name, max(1, total_bytes // MiB), sm), total_bytes=total_bytes)


def match_profile(name: str, total_bytes: int, sm: int) -> DeviceProfile:
    """The known profile for a CUDA device name + total memory + sm (compute capability x10).

    A name rule (H200, H100, A100, ...) picks its candidates' closest total; the match must
    agree on sm and lie within TOTAL_TOLERANCE of the total, else (and for unknown names) the
    result is `generic_profile(total_bytes, sm)`.
    """
    if total_bytes <= 0:
        raise ValueError(f"total_bytes must be positive, got {total_bytes}")
    for pattern, candidates in _NAME_RULES:
        if not pattern.search(name):
            continue
        best = min(
            (PROFILES[c] for c in candidates), key=lambda p: abs(p.total_bytes - total_bytes)
        )
        close = abs(best.total_bytes - total_bytes) <= TOTAL_TOLERANCE * best.total_bytes
        if close and best.sm == sm:
            return best
        log.info("%r is not %s (%d bytes, sm %s): using its properties", name, best.name,
                 total_bytes, sm)  # fmt: skip
        break
    return generic_profile(total_bytes, sm)


def nearest_known(profile: DeviceProfile) -> DeviceProfile:
    """The known GPU profile closest to `profile`: same sm family (Hopper or not) first,
    then the closest total memory. A known profile is returned as is."""
    if profile.name in PROFILES:
        return profile
    hopper = (profile.sm or 0) >= 90
    gpus = [p for p in PROFILES.values() if p.is_gpu]
    return min(
        gpus,
        key=lambda p: (
            ((p.sm or 0) >= 90) != hopper,
            abs((p.sm or 0) - (profile.sm or 0)),
            abs((p.total_bytes or 0) - (profile.total_bytes or 0)),
        ),
    )


def detect_profile() -> DeviceProfile:
    """The profile of the current CUDA device; ValueError without one."""
    if not torch.cuda.is_available():
        raise ValueError(NO_CUDA)
    major, minor = torch.cuda.get_device_capability()
    total = torch.cuda.mem_get_info()[1]
    return match_profile(torch.cuda.get_device_name(), int(total), major * 10 + minor)


# ---- the torch.cuda calls, in one place (tests substitute a fake) --------------------------


class CudaApi:
    """The torch.cuda calls the measurement makes on the current device."""

    def __init__(self) -> None:
        self._nvml: bool | None = None  # None: not tried yet

    def synchronize(self) -> None:
        torch.cuda.synchronize()

    def peaks(self) -> tuple[int, int]:
        return torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()

    def current(self) -> tuple[int, int]:
        return torch.cuda.memory_allocated(), torch.cuda.memory_reserved()

    def reset_peaks(self) -> None:
        torch.cuda.reset_peak_memory_stats()

    def memory_stats(self) -> dict[str, Any]:
        return torch.cuda.memory_stats()

    def mem_get_info(self) -> tuple[int, int]:
        free, total = torch.cuda.mem_get_info()
        return int(free), int(total)

    def nvml_used(self) -> int | None:
        """Used device memory as NVML reports it (nvidia-smi), or None without pynvml."""
        if self._nvml is False:
            return None
        try:
            used = int(torch.cuda.device_memory_used())
        except Exception as exc:  # pynvml missing or failing: optional, so stop asking
            log.debug("no NVML memory reading: %s", exc)
            self._nvml = False
            return None
        self._nvml = True
        return used

    def segments(self) -> list[dict[str, Any]]:
        return torch.cuda.memory_snapshot()

    def clean(self) -> None:
        """Release everything cached: gc, cuBLAS workspaces, empty_cache."""
        gc.collect()
        torch.cuda.synchronize()
        clear_workspaces = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
        if clear_workspaces is not None:
            clear_workspaces()
        torch.cuda.empty_cache()

    def start_history(self) -> None:
        torch.cuda.memory._record_memory_history(max_entries=HISTORY_MAX_ENTRIES)

    def dump_history(self, path: str) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        torch.cuda.memory._dump_snapshot(path)

    def stop_history(self) -> None:
        torch.cuda.memory._record_memory_history(enabled=None)


# ---- the measurement ---------------------------------------------------------------------


def _merge(table: dict[str, dict[str, int]], key: str, allocated: int, reserved: int) -> None:
    prev = table.get(key, {"allocated": 0, "reserved": 0})
    table[key] = {
        "allocated": max(prev["allocated"], allocated),
        "reserved": max(prev["reserved"], reserved),
    }


def category_bytes(state: dict[str, list[torch.Tensor]], device_type: str) -> dict[str, int]:
    """Bytes of distinct storages per category, counting only tensors on `device_type`
    (an optimizer's `step` counters may live on the CPU)."""
    out: dict[str, int] = {}
    for category, tensors in state.items():
        seen: dict[int, int] = {}
        for t in tensors:
            if t.device.type != device_type:
                continue
            storage = t.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
        out[category] = sum(seen.values())
    return out


class PeakObserver:
    """Per-phase peaks of the allocator, read at each phase boundary (see module doc)."""

    def __init__(self, api: CudaApi, device_type: str = "cuda") -> None:
        self.api = api
        self.device_type = device_type
        self.current: tuple[str, int] | None = None
        self.phases: dict[str, dict[str, int]] = {}
        self.steps: dict[str, dict[str, int]] = {}
        self.device_used_bytes = 0
        self.nvml_used_bytes: int | None = None
        self.inactive_split_peak = 0
        self.categories: dict[str, int] = {}
        self.state_fn: Any = None  # TrainingStep.state_tensors while the step is alive

    def begin(self) -> None:
        """Start a measured step: peaks from here on belong to its first phase."""
        self.api.synchronize()
        self.api.reset_peaks()
        self.current = None

    def on_phase(self, phase: str, step: int, micro: int) -> None:
        self.close()
        self.current = (phase, step)

    def on_backward_end(self, model: torch.nn.Module, step: int, micro: int) -> None:
        pass

    def on_optimizer_end(self, optimizer: torch.optim.Optimizer, step: int) -> None:
        if self.state_fn is not None:
            self.categories = category_bytes(self.state_fn(), self.device_type)

    def close(self) -> None:
        """End the current phase: record its peaks, sample device memory, reset peaks."""
        if self.current is None:
            return
        self.api.synchronize()
        allocated, reserved = self.api.peaks()
        phase, step = self.current
        _merge(self.phases, phase, allocated, reserved)
        _merge(self.steps, STEP_NAMES[step], allocated, reserved)
        split = self.api.memory_stats().get("inactive_split_bytes.all.peak", 0)
        self.inactive_split_peak = max(self.inactive_split_peak, int(split))
        free, total = self.api.mem_get_info()
        self.device_used_bytes = max(self.device_used_bytes, total - free)
        nvml = self.api.nvml_used()
        if nvml is not None:
            self.nvml_used_bytes = max(self.nvml_used_bytes or 0, nvml)
        self.api.reset_peaks()
        self.current = None


def end_state(api: CudaApi) -> dict[str, Any]:
    """Allocator state now: fragmentation (largest free block / free reserved bytes, 1.0 when
    nothing is free, as predictor.sim.allocator defines it), current allocated/reserved."""
    segments = api.segments()
    free = [
        int(b["size"])
        for seg in segments
        for b in seg.get("blocks", ())
        if b.get("state") == "inactive"
    ]
    free_reserved, largest = sum(free), max(free, default=0)
    allocated, reserved = api.current()
    return {
        "fragmentation_at_end": largest / free_reserved if free_reserved else 1.0,
        "largest_free_block_bytes": largest,
        "free_reserved_bytes": free_reserved,
        "num_segments": len(segments),
        "allocated_at_end_bytes": allocated,
        "reserved_at_end_bytes": reserved,
    }


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _run_steps(
    bundle: ModelBundle,
    train: TrainSpec,
    sizes: dict[str, int],
    obs: PeakObserver,
    *,
    torch_device: torch.device,
    warmup_steps: int,
    snapshot_path: str | None,
) -> tuple[str | None, tuple[int, int], dict[str, Any]]:
    """Build and run the steps; (OOM message or None, peaks at the OOM, end state)."""
    oom, at_oom = None, (0, 0)
    try:
        step = TrainingStep(bundle, train, device=torch_device, target="cuda")
        obs.state_fn = step.state_tensors
        warm, measured = step_plan(train)
        if warm:
            step.run(sizes, steps=warm)
        for s in measured:
            if s == 1 and warmup_steps:
                step.run(sizes, steps=(1,) * warmup_steps)
            obs.begin()
            step.run(sizes, obs, steps=(s,))
            obs.close()
    except torch.OutOfMemoryError as exc:
        oom = _first_line(exc)
        at_oom = obs.api.peaks()
        obs.close()
        log.warning("%s %s ran out of memory: %s", bundle.name, sizes, oom)
    end = end_state(obs.api)
    if snapshot_path:
        obs.api.dump_history(snapshot_path)
    return oom, at_oom, end


def measure_step(
    bundle: ModelBundle,
    train: TrainSpec,
    sizes: dict[str, int],
    *,
    api: CudaApi,
    torch_device: torch.device,
    warmup_steps: int = 1,
    snapshot_path: str | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """The measurement behind `profile_cuda`, on any `api` and device (see module doc)."""
    if warmup_steps < 0:
        raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
    api.clean()
    api.reset_peaks()
    before = api.memory_stats()
    free0, total0 = api.mem_get_info()
    base_allocated, base_reserved = api.current()
    obs = PeakObserver(api, torch_device.type)
    torch.manual_seed(seed)
    if snapshot_path:
        api.start_history()
    try:
        oom, at_oom, end = _run_steps(
            bundle, train, sizes, obs, torch_device=torch_device,
            warmup_steps=warmup_steps, snapshot_path=snapshot_path,
        )  # fmt: skip
        after = api.memory_stats()
    finally:
        obs.state_fn = None  # the bound method holds the model: drop it before cleaning
        if snapshot_path:
            api.stop_history()
        api.clean()
    measured = list(obs.steps.values())
    peak_allocated = max([m["allocated"] for m in measured] + [at_oom[0]])
    peak_reserved = max([m["reserved"] for m in measured] + [at_oom[1]])
    warm, steps = step_plan(train)
    breakdown = {
        "phases": obs.phases,
        "first_step": obs.steps.get("first"),
        "steady_state": obs.steps.get("steady"),
        "categories": obs.categories,
        "measured_steps": list(steps),
        "unmeasured_steps": list(warm) + ([1] * warmup_steps if 1 in steps else []),
    }

    def delta(key: str) -> int:
        return int(after.get(key, 0)) - int(before.get(key, 0))

    stats: dict[str, Any] = {
        "num_alloc_retries": delta("num_alloc_retries"),
        "num_ooms": delta("num_ooms"),
        "inactive_split_bytes": obs.inactive_split_peak,
        "inactive_split_bytes_current": int(after.get("inactive_split_bytes.all.current", 0)),
        **end,
        "baseline_used_bytes": total0 - free0,
        "baseline_allocated_bytes": base_allocated,
        "baseline_reserved_bytes": base_reserved,
        "device_capacity_bytes": total0,
        "nvml_used_bytes": obs.nvml_used_bytes,
        "warmup_steps": warmup_steps,
        "oom": oom is not None,
        "would_oom": oom is not None,
        "oom_message": oom,
    }
    return {
        "peak_allocated_bytes": peak_allocated,
        "peak_reserved_bytes": peak_reserved,
        "device_total_bytes": obs.device_used_bytes or None,
        "breakdown": breakdown,
        "stats": stats,
    }


def profile_cuda(
    bundle: ModelBundle,
    train: TrainSpec,
    sizes: dict[str, int],
    device: DeviceProfile,
    *,
    warmup_steps: int = 1,
    snapshot_path: str | None = None,
) -> dict[str, Any]:
    """Measure one training config on the current GPU (see the module doc for what counts).

    Returns the fields of a `ProfileRecord`: peak_allocated_bytes, peak_reserved_bytes,
    device_total_bytes (device used memory at the phase boundaries, mem_get_info),
    breakdown, stats, device_name. ValueError without a CUDA device.
    """
    if not torch.cuda.is_available():
        raise ValueError(NO_CUDA)
    name = torch.cuda.get_device_name()
    major, minor = torch.cuda.get_device_capability()
    actual = match_profile(name, torch.cuda.mem_get_info()[1], major * 10 + minor)
    if actual.name != device.name:
        log.warning(
            "profiling on %s (%s) but the device profile says %s", name, actual.name, device.name
        )
    result = measure_step(bundle, train, sizes, api=CudaApi(),
                          torch_device=torch.device("cuda", torch.cuda.current_device()),
                          warmup_steps=warmup_steps, snapshot_path=snapshot_path)  # fmt: skip
    return result | {"device_name": name}
