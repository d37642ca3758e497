"""The memory-capped emulated device: allocations, OOM at the right op, stats, recovery."""

from __future__ import annotations

import pytest
import torch
from memgnn.predictor.capture.step import build_optimizer
from memgnn.predictor.sim.allocator import SimulatedOOM
from memgnn.predictor.spec.train import TrainSpec
from memgnn.serving.governor.devices import CpuDevice, EmulatedDevice, resolve_device

MiB = 1 << 20


def test_oom_raises_at_the_op_that_does_not_fit():
    dev = EmulatedDevice(64 * MiB)
    with dev:
        a = torch.empty(30 * MiB, dtype=torch.uint8)
        b = torch.empty(30 * MiB, dtype=torch.uint8)
        assert dev.memory_allocated() == 60 * MiB
        assert dev.memory_reserved() == 60 * MiB  # >= 10 MiB: segments rounded to 2 MiB
        with pytest.raises(torch.OutOfMemoryError) as info:
            torch.ones(10 * MiB, dtype=torch.uint8)  # 60 + 10 > 64
        assert isinstance(info.value, SimulatedOOM)
        assert "aten.ones" in str(info.value) or "aten.fill" in str(info.value)
        assert dev.memory_stats()["num_ooms"] == 1
        del a  # its 30 MiB segment stays cached; the 10 MiB block is split from it
        c = torch.ones(10 * MiB, dtype=torch.uint8)
        assert dev.memory_reserved() == 60 * MiB
        assert dev.memory_allocated() == 40 * MiB
    del b, c
    assert dev.memory_allocated() == 0
    assert dev.max_memory_allocated() == 60 * MiB
    dev.reset_peak_memory_stats()
    assert dev.max_memory_allocated() == 0
    assert dev.max_memory_reserved() == 60 * MiB  # cached segments stay reserved
    dev.empty_cache()
    assert dev.memory_reserved() == 0


def test_views_and_inplace_ops_do_not_allocate():
    dev = EmulatedDevice(64 * MiB)
    with dev:
        x = torch.zeros(1024, 1024)  # 4 MiB
        before = dev.memory_allocated()
        y = x.view(-1)[10:]
        x.add_(1.0)
        y.mul_(2.0)
        assert dev.memory_allocated() == before
        z = x + 1  # a new storage
        assert dev.memory_allocated() == before + 4 * MiB
    del z
    assert dev.memory_allocated() == before


def test_small_requests_round_to_blocks_and_small_segments():
    dev = EmulatedDevice(64 * MiB)
    with dev:
        t = torch.empty(10, dtype=torch.float32)  # 40 B -> one 512 B block, 2 MiB segment
    assert dev.memory_allocated() == 512
    assert dev.memory_reserved() == 2 * MiB
    stats = dev.memory_stats()
    assert stats["free_reserved_bytes"] == 2 * MiB - 512
    assert stats["largest_free_block_bytes"] == 2 * MiB - 512
    assert stats["fragmentation"] == pytest.approx(1.0)
    free, total = dev.mem_get_info()
    assert (free, total) == (62 * MiB, 64 * MiB)
    del t


def test_fragmentation_is_largest_free_block_over_free_reserved():
    dev = EmulatedDevice(256 * MiB)
    with dev:
        keep = [torch.empty(12 * MiB, dtype=torch.uint8) for _ in range(4)]
    del keep[0], keep[1]  # two separate 12 MiB segments free (whole segments, not merged)
    stats = dev.memory_stats()
    assert stats["free_reserved_bytes"] == 24 * MiB
    assert stats["largest_free_block_bytes"] == 12 * MiB
    assert stats["fragmentation"] == pytest.approx(0.5)


def test_byte_scale_counts_every_storage_k_times():
    dev = EmulatedDevice(1 << 30, byte_scale=16)
    with dev:
        t = torch.empty(MiB, dtype=torch.uint8)
    assert dev.memory_allocated() == 16 * MiB
    del t
    with pytest.raises(ValueError):
        EmulatedDevice(1 << 30, byte_scale=0)


def test_training_step_oom_is_recoverable(tiny_gpt):
    dev = EmulatedDevice(64 * MiB)
    with dev:
        model = tiny_gpt.build()
        opt = build_optimizer(list(model.parameters()), TrainSpec(), "cpu")
    params = dev.memory_allocated()

    def step(b: int, s: int) -> None:
        with dev:
            inputs = tiny_gpt.make_inputs({"B": b, "S": s}, torch.device("cpu"), torch.float32)
            tiny_gpt.loss(model, inputs).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    step(2, 8)
    state = dev.memory_allocated()  # + Adam state
    assert state > params
    failed = False
    try:
        step(256, 512)  # logits alone are 256 x 512 x 50 x 4 B = 25 MiB, several copies
    except torch.OutOfMemoryError:
        failed = True
    assert failed
    opt.zero_grad(set_to_none=True)
    assert dev.recover() == state  # everything the failed step held is free again
    step(2, 8)  # and training goes on
    assert dev.memory_allocated() == state


def test_inputs_made_outside_are_adopted_and_transfer_copies():
    dev = EmulatedDevice(64 * MiB)
    host = torch.ones(1024, 256)  # 1 MiB on the host: not on the device yet
    assert dev.memory_allocated() == 0
    moved = dev.transfer({"x": host, "n": 3})
    assert moved["n"] == 3 and moved["x"].data_ptr() != host.data_ptr()
    assert dev.memory_allocated() == MiB
    with dev:
        y = host * 2  # reading a host tensor inside the device adopts it (an implicit copy)
    assert dev.memory_allocated() == 3 * MiB
    del y, moved


def test_cpu_device_counts_exact_bytes_and_resolve():
    dev = CpuDevice(1 << 30)
    with dev:
        t = torch.empty(1000, dtype=torch.uint8)
    assert dev.memory_allocated() == dev.memory_reserved() == 1000
    del t
    assert dev.max_memory_allocated() == 1000
    assert isinstance(resolve_device("emulated", 1 << 20), EmulatedDevice)
    assert resolve_device(dev) is dev
    with pytest.raises(ValueError):
        resolve_device("cpu")  # needs a budget
    with pytest.raises(ValueError):
        resolve_device("tpu", 1)


def test_cuda_device_reads_torch_cuda(monkeypatch):
    """No GPU here: torch.cuda's answers are faked to check what CudaDevice makes of them."""
    from types import SimpleNamespace

    from memgnn.serving.governor.cuda import CudaDevice

    cuda = torch.cuda
    props = SimpleNamespace(total_memory=80 * 1024 * MiB, major=8, minor=0)
    stats = {"allocated_bytes.all.current": 10 * MiB, "reserved_bytes.all.current": 40 * MiB}
    snapshot = [
        {"device": 0, "blocks": [{"state": "inactive", "size": 6 * MiB},
                                 {"state": "active_allocated", "size": 10 * MiB}]},
        {"device": 0, "blocks": [{"state": "inactive", "size": 24 * MiB}]},
    ]  # fmt: skip
    monkeypatch.setattr(cuda, "is_available", lambda: True)
    monkeypatch.setattr(cuda, "get_device_properties", lambda i: props)
    monkeypatch.setattr(cuda, "memory_stats", lambda i: dict(stats))
    monkeypatch.setattr(cuda, "memory_snapshot", lambda: snapshot)
    monkeypatch.setattr(cuda, "max_memory_reserved", lambda i: 40 * MiB)
    dev = CudaDevice(0)
    assert dev.profile == "a100-80gb" and dev.target == "cuda" and dev.sm == 80
    assert dev.capacity_bytes == 80 * 1024 * MiB and dev.max_memory_reserved() == 40 * MiB
    out = dev.memory_stats()
    assert out["largest_free_block_bytes"] == 24 * MiB
    assert out["free_reserved_bytes"] == 30 * MiB
    assert out["fragmentation"] == pytest.approx(0.8)
    assert CudaDevice(0, profile="h100-80gb").profile == "h100-80gb"


def test_fake_execution_counts_the_bytes_of_real_execution(tiny_gpt):
    """Fake tensors take the real CPU step's kernel choices and storages: same allocated,
    reserved and steady bytes, step after step, with no kernel run."""
    seen = {}
    for execute in ("cpu", "fake"):
        dev = EmulatedDevice(64 * MiB, execute=execute)
        torch.manual_seed(0)
        with dev:
            model = tiny_gpt.build()
            opt = build_optimizer(list(model.parameters()), TrainSpec(), "cpu")
        peaks = []
        for _ in range(2):
            host = tiny_gpt.make_inputs({"B": 4, "S": 16}, torch.device("cpu"), torch.float32)
            inputs = dev.transfer(host)
            with dev:
                loss = tiny_gpt.loss(model, inputs)
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
            peaks.append((dev.max_memory_allocated(), dev.max_memory_reserved()))
            dev.reset_peak_memory_stats()
            del inputs
        seen[execute] = (peaks, dev.memory_allocated(), type(loss).__name__)
    assert seen["fake"][:2] == seen["cpu"][:2]
    assert seen["cpu"][2] == "Tensor" and seen["fake"][2] == "FakeTensor"
    with pytest.raises(ValueError, match="execute"):
        EmulatedDevice(MiB, execute="meta")
