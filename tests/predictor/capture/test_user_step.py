"""The user's own training step (`capture.user_step`): captured on fake tensors, it equals
the same step function run for real on the CPU (memgnn's CPU recorder) to the byte; its
phases are watched; a CUDA target runs PyTorch's CUDA defaults (by hand)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from memgnn.dataset.cpu_backend import profile_cpu
from memgnn.predictor.capture.branches import CaptureError
from memgnn.predictor.capture.user_step import (
    UserStep,
    capture_user_step,
    on_target,
    user_bundle,
)
from memgnn.predictor.ir.vocab import CATEGORIES, PHASES
from memgnn.predictor.memory.analytic import sweep
from memgnn.predictor.spec.train import TrainSpec
from torch import nn

SIZES = {"B": 12}


class HookedNet(nn.Module):
    """An MLP whose forward hook keeps the hidden activation (alive across steps) for a
    custom loss term, and whose output weight's gradient is doubled by a tensor hook."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden = nn.Linear(24, 48)
        self.out = nn.Linear(48, 5)
        self.kept: dict[str, torch.Tensor] = {}
        self.hidden.register_forward_hook(lambda m, args, out: self.kept.__setitem__("h", out))
        self.out.weight.register_hook(lambda g: g * 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.hidden(x)))


def custom_step(model, optimizer, batch):
    x, y = batch
    logits = model(x)
    smooth = F.cross_entropy(logits, y, label_smoothing=0.1)
    loss = smooth + 1e-3 * model.kept["h"].pow(2).sum(dim=1).mean()  # the hook's tensor
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()  # a float read: logging


def make_batch(B):  # noqa: N803 - the size's name
    return torch.randn(B, 24), torch.randint(0, 5, (B,))


def adamw(params):
    return torch.optim.AdamW(params, lr=1e-3)


def _real(model=HookedNet, step=custom_step, batch=make_batch, opt=adamw, sizes=SIZES):
    def make(target):
        return UserStep(model, step, batch, opt, device=torch.device("cpu"), target=target)

    return profile_cpu(user_bundle(model, sizes), TrainSpec(), sizes, make_step=make)


def test_a_hand_written_step_equals_a_real_cpu_step_to_the_byte():
    graph = capture_user_step(HookedNet, custom_step, make_batch, adamw, sizes=SIZES,
                              target="cpu")  # fmt: skip
    real = _real()
    swept = sweep(graph, SIZES)
    assert swept.peak_bytes == real["peak_allocated_bytes"] > 0
    assert swept.best.breakdown == real["breakdown"]["categories"]
    assert swept.best.phase_peaks == real["breakdown"]["tensor_phase_peaks"]
    assert set(swept.best.phase_peaks) == {"input", "forward", "backward", "optimizer",
                                           "zero_grad"}  # fmt: skip
    assert graph.meta["user_step"]["value_reads"] == 2  # loss.item() in each step
    assert graph.train == {} and graph.model["name"] == f"py:{__name__}.HookedNet"


def test_phases_and_categories_are_watched_from_the_step():
    graph = capture_user_step(HookedNet, custom_step, make_batch, adamw, sizes=SIZES,
                              target="cpu")  # fmt: skip
    p = graph.paths[0]
    phases = [PHASES[k] for k in p.nodes["phase"]]
    ops = list(p.nodes["op"])
    first_mm = next(i for i, op in enumerate(ops) if op.startswith("addmm"))
    assert phases[first_mm] == "forward"
    assert {"backward", "optimizer"} <= set(phases)
    # the optimizer's ops run in the optimizer phase, both steps
    assert all(phases[i] == "optimizer" for i, op in enumerate(ops) if op.startswith("lerp"))
    sizes = graph.resolve_sizes(SIZES)
    nbytes = graph.storage_bytes(0, sizes)
    by = {c: 0 for c in CATEGORIES}
    for b, c in zip(nbytes, p.storages["category"], strict=True):
        by[CATEGORIES[c]] += int(b)
    params = (24 * 48 + 48 + 48 * 5 + 5) * 4
    assert by["parameter"] == params  # by hand: the two Linear layers in fp32
    assert by["optimizer_state"] == 2 * params + 4 * 4  # exp_avg, exp_avg_sq, 4 step counters


def test_a_cuda_target_runs_pytorchs_cuda_defaults():
    # AdamW with foreach=None: foreach on CUDA tensors (for-loop on the CPU), its step
    # counters on the host; torch.autocast("cuda") casts the matmuls to bf16
    def amp_step(model, optimizer, batch):
        x, y = batch
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    model = lambda: nn.Sequential(nn.Linear(24, 48), nn.ReLU(), nn.Linear(48, 5))  # noqa: E731
    cuda = capture_user_step(model, amp_step, make_batch, adamw, sizes=SIZES, target="cuda")
    cpu = capture_user_step(model, amp_step, make_batch, adamw, sizes=SIZES, target="cpu")
    cuda_ops, cpu_ops = set(cuda.paths[0].nodes["op"]), set(cpu.paths[0].nodes["op"])
    assert any(op.startswith("_foreach_") for op in cuda_ops)
    assert not any(op.startswith("_foreach_lerp") for op in cpu_ops)
    params = (24 * 48 + 48 + 48 * 5 + 5) * 4
    assert sweep(cuda, SIZES).best.breakdown["optimizer_state"] == 2 * params  # by hand
    # the CUDA autocast ran on the capture's (CPU) tensors: bf16 copies and matmuls
    assert "bfloat16" in set(cuda.paths[0].storages["dtype"])
    assert "bfloat16" not in set(cpu.paths[0].storages["dtype"])  # a CPU run: no CUDA autocast


def test_on_target_puts_back_what_it_patched():
    import torch.optim.optimizer as optim_mod
    import torch.utils._foreach_utils as foreach_utils

    before = (list(optim_mod._foreach_supported_types), torch.autocast,
              list(foreach_utils._foreach_supported_types),
              optim_mod._get_foreach_kernels_supported_devices)  # fmt: skip
    with on_target("cuda"):
        assert "cpu" in optim_mod._get_foreach_kernels_supported_devices()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            assert torch.mm(torch.ones(2, 2), torch.ones(2, 2)).dtype == torch.bfloat16
    after = (list(optim_mod._foreach_supported_types), torch.autocast,
             list(foreach_utils._foreach_supported_types),
             optim_mod._get_foreach_kernels_supported_devices)  # fmt: skip
    assert after == before


def test_no_weight_is_built_and_an_integer_read_is_an_error():
    seen = []

    def make_model():
        model = nn.Linear(24, 5)
        seen.append(model.weight)
        return model

    def step(model, optimizer, batch):
        x, _ = batch
        loss = model(x).sum()
        loss.backward()
        optimizer.step()

    capture_user_step(make_model, step, make_batch, adamw, sizes=SIZES, target="cpu")
    from torch._subclasses.fake_tensor import FakeTensor

    assert seen and all(isinstance(w, FakeTensor) for w in seen)

    def reads_an_int(model, optimizer, batch):
        x, y = batch
        n = int(y.max().item())  # a size decided by data: not capturable
        model(x[:n]).sum().backward()

    with pytest.raises(CaptureError, match="data-dependent"):
        capture_user_step(make_model, reads_an_int, make_batch, adamw, sizes=SIZES,
                          target="cpu")  # fmt: skip


def test_a_symbolic_capture_answers_other_sizes_as_a_real_step_there():
    graph = capture_user_step(HookedNet, custom_step, make_batch, adamw, sizes=SIZES,
                              target="cpu", symbolic=True)  # fmt: skip
    assert graph.meta["user_step"]["symbolic"] and graph.symbols == SIZES
    at = {"B": 40}
    real = _real(sizes=at)
    assert sweep(graph, at).peak_bytes == real["peak_allocated_bytes"]
    assert sweep(graph, at).best.breakdown == real["breakdown"]["categories"]


def test_a_built_model_is_captured_on_fake_weights_and_left_as_it_was():
    model = HookedNet()
    weight = model.hidden.weight
    graph = capture_user_step(model, custom_step, make_batch, adamw, sizes=SIZES, target="cpu")
    built = capture_user_step(HookedNet, custom_step, make_batch, adamw, sizes=SIZES,
                              target="cpu")  # fmt: skip
    assert model.hidden.weight is weight and weight.grad is None  # untouched
    assert sweep(graph, SIZES).peak_bytes == sweep(built, SIZES).peak_bytes


def test_what_every_forward_of_a_step_saves_for_backward_is_an_activation():
    def two_views(model, optimizer, batch):  # two forwards, one backward (contrastive)
        x, _ = batch
        a, b = model(x), model(x.flip(0))
        (a - b).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()

    graph = capture_user_step(HookedNet, two_views, make_batch, adamw, sizes=SIZES,
                              target="cpu")  # fmt: skip
    p = graph.paths[0]
    phases, steps, micros = (list(p.nodes[k]) for k in ("phase", "step", "micro"))
    backward = PHASES.index("backward")
    first_bwd = next(i for i, ph in enumerate(phases) if ph == backward)
    saved = {0: 0, 1: 0}  # forward micro-step -> its storages alive into backward
    for alloc, free, cat in zip(p.storages["alloc"], p.storages["free"], p.storages["category"],
                                strict=True):  # fmt: skip
        if alloc < 0 or steps[alloc] != 0 or phases[alloc] != PHASES.index("forward"):
            continue
        if free < 0 or free >= first_bwd:  # alive when backward starts
            assert CATEGORIES[cat] == "activation", (alloc, micros[alloc], CATEGORIES[cat])
            saved[micros[alloc]] += 1
    assert saved[0] > 0 and saved[1] > 0  # both forwards' saved tensors seen
