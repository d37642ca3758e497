"""The cuda backend: device-profile matching, and the measurement's control flow on the CPU
through a fake torch.cuda API (the real GPU test runs only where CUDA is available)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from memgnn.dataset.cuda_backend import (
    NO_CUDA,
    CudaApi,
    category_bytes,
    detect_profile,
    generic_profile,
    match_profile,
    measure_step,
    nearest_known,
    profile_cuda,
)
from memgnn.predictor.spec.bundle import ModelBundle
from memgnn.predictor.spec.devices import PROFILES, GiB, MiB
from memgnn.predictor.spec.train import TrainSpec
from torch import nn

PHASES = {"input", "forward", "backward", "optimizer", "zero_grad"}


# ---- device profiles ---------------------------------------------------------------------


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error")
def test_detect_profile_without_cuda_raises():
    with pytest.raises(ValueError, match="no CUDA device"):
        detect_profile()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error")
def test_profile_cuda_without_cuda_raises(tiny_mlp):
    with pytest.raises(ValueError, match="use --backend sim"):
        profile_cuda(tiny_mlp, TrainSpec(), {"B": 4}, PROFILES["h100-80gb"])


@pytest.mark.parametrize(
    ("name", "mib", "sm", "expected"),
    [
        ("NVIDIA H200", 143771, 90, "h200-141gb"),
        ("NVIDIA H100 80GB HBM3", 81559, 90, "h100-80gb"),
        ("NVIDIA H800", 81559, 90, "h100-80gb"),
        ("NVIDIA A100-SXM4-80GB", 81920, 80, "a100-80gb"),
        ("NVIDIA A100-PCIE-40GB", 40960, 80, "a100-40gb"),
        ("Tesla V100-SXM2-16GB", 16160, 70, "v100-16gb"),
        ("Tesla V100-SXM2-32GB", 32510, 70, "v100-32gb"),
        ("Tesla T4", 15360, 75, "t4-16gb"),
        ("NVIDIA A10G", 23028, 86, "a10g-24gb"),
        ("NVIDIA L4", 23034, 89, "l4-24gb"),
        ("NVIDIA GeForce RTX 4090", 24564, 89, "rtx4090-24gb"),
    ],
)
def test_match_profile_known_names(name, mib, sm, expected):
    assert match_profile(name, mib * MiB, sm).name == expected


@pytest.mark.parametrize(
    ("name", "mib", "sm", "expected"),
    [
        ("NVIDIA L40S", 46068, 89, "cuda-89-45gb"),  # L40S is not an L4
        ("NVIDIA H100 NVL", 95830, 90, "cuda-90-94gb"),  # an H100 with 94 GB: not 80 GB
        ("NVIDIA GH200 480GB", 97871, 90, "cuda-90-96gb"),  # GH200 is not an H200
        ("NVIDIA H200", 143771, 80, "cuda-80-140gb"),  # sm disagrees with the name
        ("Some Future GPU", 200 * 1024, 100, "cuda-100-200gb"),
    ],
)
def test_match_profile_falls_back_to_device_properties(name, mib, sm, expected):
    p = match_profile(name, mib * MiB, sm)
    assert p.name == expected
    assert p.name not in PROFILES
    assert p.total_bytes == mib * MiB and p.sm == sm and p.kind == "cuda"


def test_generic_profile_terms_follow_sm():
    hopper, ampere, volta = (generic_profile(64 * GiB, sm) for sm in (90, 80, 70))
    assert hopper.cublas_workspace_bytes == 32 * MiB
    assert ampere.cublas_workspace_bytes == volta.cublas_workspace_bytes == 8_519_680
    assert hopper.bf16 and ampere.bf16 and not volta.bf16
    assert hopper.context_bytes == PROFILES["h100-80gb"].context_bytes
    with pytest.raises(ValueError):
        generic_profile(0, 90)
    with pytest.raises(ValueError):
        match_profile("NVIDIA H100", 0, 90)


def test_nearest_known():
    assert nearest_known(PROFILES["a100-40gb"]) is PROFILES["a100-40gb"]
    assert nearest_known(generic_profile(94 * GiB, 90)).name == "h100-80gb"
    assert nearest_known(generic_profile(200 * GiB, 100)).name == "b200-180gb"
    assert nearest_known(generic_profile(150 * GiB, 90)).name == "h200-141gb"
    assert nearest_known(generic_profile(48 * GiB, 89)).name == "l40s-48gb"
    assert nearest_known(generic_profile(24 * GiB, 89)).name == "rtx4090-24gb"


def test_category_bytes_counts_each_storage_once_and_only_on_the_device():
    t = torch.zeros(10)
    u = torch.zeros(3, dtype=torch.float64)
    assert category_bytes({"a": [t, t[2:], t.view(2, 5)], "b": [u]}, "cpu") == {"a": 40, "b": 24}
    assert category_bytes({"a": [t]}, "cuda") == {"a": 0}


# ---- the measurement on the CPU, through a fake torch.cuda --------------------------------


class FakeCuda(CudaApi):
    """Peaks grow with every reset, so each phase reads distinct numbers."""

    TOTAL = 1000 * MiB

    def __init__(self) -> None:
        super().__init__()
        self.resets = 0
        self.cleans = 0
        self.history: list[str] = []
        self.stats = {"num_alloc_retries": 5, "num_ooms": 1}

    def synchronize(self) -> None:
        pass

    def peaks(self) -> tuple[int, int]:
        return 100 * self.resets, 200 * self.resets

    def current(self) -> tuple[int, int]:
        return 7, 9

    def reset_peaks(self) -> None:
        self.resets += 1

    def memory_stats(self) -> dict:
        return dict(self.stats, **{"inactive_split_bytes.all.peak": 3 * self.resets})

    def mem_get_info(self) -> tuple[int, int]:
        return self.TOTAL - 1000 - 10 * self.resets, self.TOTAL

    def nvml_used(self) -> int | None:
        return 2000 + self.resets

    def segments(self) -> list[dict]:
        blocks = [
            {"size": 512, "state": "inactive"},
            {"size": 4096, "state": "active_allocated"},
            {"size": 1536, "state": "inactive"},
        ]
        return [{"total_size": 6144, "allocated_size": 4096, "blocks": blocks}]

    def clean(self) -> None:
        self.cleans += 1

    def start_history(self) -> None:
        self.history.append("start")

    def dump_history(self, path: str) -> None:
        self.history.append(f"dump {path}")

    def stop_history(self) -> None:
        self.history.append("stop")


class _MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(16, 16) for _ in range(2))
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = torch.relu(block(x))
        return self.head(x)


def _inputs(sizes, device, dtype):
    return {
        "x": torch.randn(sizes["B"], 16, device=device, dtype=dtype),
        "y": torch.randint(0, 3, (sizes["B"],), device=device),
    }


class CountingLoss:
    """The loss, counting calls; raises a CUDA-style OOM on call `oom_at` (1-based)."""

    def __init__(self, oom_at: int | None = None) -> None:
        self.calls, self.oom_at = 0, oom_at

    def __call__(self, model, inputs):
        self.calls += 1
        if self.calls == self.oom_at:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore")
        return F.cross_entropy(model(inputs["x"]), inputs["y"])


def _bundle(loss: CountingLoss) -> ModelBundle:
    return ModelBundle(
        name="fake-mlp", family="mlp", build=_MLP, make_inputs=_inputs, loss=loss, dims={"B": 8}
    )


def _measure(loss: CountingLoss, api: FakeCuda | None = None, **kwargs):
    api = api or FakeCuda()
    train = kwargs.pop("train", TrainSpec.of(optimizer="adamw", optimizer_impl="foreach"))
    out = measure_step(
        _bundle(loss), train, {"B": 8}, api=api, torch_device=torch.device("cpu"), **kwargs
    )
    return out, api


def test_measure_step_first_and_steady_with_a_warmup_step():
    loss = CountingLoss()
    out, api = _measure(loss, warmup_steps=1)
    assert loss.calls == 3  # step 0 measured, one unmeasured steady step, step 1 measured
    bd = out["breakdown"]
    assert set(bd["phases"]) == PHASES
    assert bd["measured_steps"] == [0, 1] and bd["unmeasured_steps"] == [1]
    first, steady = bd["first_step"], bd["steady_state"]
    assert 0 < first["allocated"] < steady["allocated"]  # the fake's peaks grow per reset
    assert out["peak_allocated_bytes"] == steady["allocated"]
    assert out["peak_reserved_bytes"] == steady["reserved"] == 2 * steady["allocated"]
    assert bd["phases"]["zero_grad"] == steady  # the last phase closed last: the largest
    # device used = total - free, sampled at each phase end; the max is the last sample
    assert out["device_total_bytes"] == 1000 + 10 * api.resets - 10
    stats = out["stats"]
    assert stats["oom"] is False and stats["oom_message"] is None
    assert stats["num_alloc_retries"] == 0 and stats["num_ooms"] == 0  # deltas over the run
    assert stats["fragmentation_at_end"] == pytest.approx(1536 / 2048)
    assert stats["free_reserved_bytes"] == 2048 and stats["largest_free_block_bytes"] == 1536
    assert stats["nvml_used_bytes"] > 2000 and stats["inactive_split_bytes"] > 0
    assert api.cleans == 2  # before the run and after it


def test_measure_step_categories_after_the_optimizer_update():
    out, _ = _measure(CountingLoss(), warmup_steps=0)
    tensors = list(_MLP().parameters())
    params = sum(p.numel() * 4 for p in tensors)
    cats = out["breakdown"]["categories"]
    assert cats["parameter"] == params
    assert cats["gradient"] == params  # gradients are still alive after the update
    # AdamW's two moments, plus its fp32 step counters (on the CPU, so counted here)
    assert cats["optimizer_state"] == 2 * params + 4 * len(tensors)


def test_measure_step_without_warmup_and_steady_only_plans():
    loss = CountingLoss()
    out, _ = _measure(loss, warmup_steps=0)
    assert loss.calls == 2 and out["breakdown"]["unmeasured_steps"] == []
    loss = CountingLoss()
    out, _ = _measure(loss, warmup_steps=2, train=TrainSpec.of(steps="steady", grad_accum=3))
    # warm-up step 0 and two extra steady steps, unmeasured; then step 1; 2 micro-steps each
    assert loss.calls == 2 * 4
    bd = out["breakdown"]
    assert bd["first_step"] is None and bd["steady_state"] is not None
    assert bd["unmeasured_steps"] == [0, 1, 1]


def test_measure_step_reports_an_oom_with_the_peaks_so_far():
    loss = CountingLoss(oom_at=2)  # forward of the measured steady step
    out, api = _measure(loss, warmup_steps=0)
    stats = out["stats"]
    assert stats["oom"] is True and stats["would_oom"] is True
    assert stats["oom_message"] == "CUDA out of memory. Tried to allocate 2.00 GiB"
    bd = out["breakdown"]
    assert bd["first_step"] is not None
    assert bd["steady_state"] is not None  # its input and forward phases, up to the OOM
    assert out["peak_allocated_bytes"] >= bd["steady_state"]["allocated"]
    assert api.cleans == 2


def test_measure_step_oom_in_an_unmeasured_step_keeps_the_peak():
    out, _ = _measure(CountingLoss(oom_at=2), warmup_steps=1)
    assert out["stats"]["oom"] is True
    assert out["breakdown"]["steady_state"] is None
    assert out["peak_allocated_bytes"] > out["breakdown"]["first_step"]["allocated"]


def test_measure_step_cleans_up_after_an_error():
    class Broken(CountingLoss):
        def __call__(self, model, inputs):
            raise RuntimeError("model bug")

    api = FakeCuda()
    with pytest.raises(RuntimeError, match="model bug"):
        _measure(Broken(), api)
    assert api.cleans == 2


def test_measure_step_snapshot_history(tmp_path):
    path = str(tmp_path / "snap.pickle")
    _, api = _measure(CountingLoss(), snapshot_path=path)
    assert api.history == ["start", f"dump {path}", "stop"]
    with pytest.raises(ValueError, match="warmup_steps"):
        _measure(CountingLoss(), warmup_steps=-1)


def test_no_cuda_message_names_the_alternative():
    assert "--backend sim" in NO_CUDA


# ---- the real thing -----------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_profile_cuda_tiny_mlp(tmp_path):
    bundle = _bundle(CountingLoss())
    params = sum(p.numel() * p.element_size() for p in _MLP().parameters())
    device = detect_profile()
    snap = tmp_path / "snap.pickle"
    out = profile_cuda(bundle, TrainSpec(), {"B": 64}, device, snapshot_path=str(snap))
    assert out["peak_reserved_bytes"] >= out["peak_allocated_bytes"] > params
    bd = out["breakdown"]
    assert bd["first_step"] is not None and bd["steady_state"] is not None
    assert set(bd["phases"]) == PHASES
    assert bd["categories"]["parameter"] == params
    assert out["device_total_bytes"] >= out["peak_reserved_bytes"]
    assert out["stats"]["oom"] is False and out["device_name"]
    assert snap.exists()
    assert torch.cuda.memory_allocated() <= 64 * MiB  # released, bar library workspaces
