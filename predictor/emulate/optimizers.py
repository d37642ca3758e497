"""Optimizers by name, run by their libraries' own code on whatever tensors the step has.

- `torch.optim.<Class>`: the class with its defaults; `--optimizer-impl auto` is what
  PyTorch picks on the target (foreach on CUDA where the class has it, else the for-loop).
  Its state is whatever the class creates in its first step: memgnn reads it from the
  optimizer, it keeps no table.
- `bnb.*`: bitsandbytes' classes (0.50.2 registers fake kernels for its optimizer updates,
  so its own `step` runs on fake tensors). Capture runs on one (fake) CPU device, where
  bitsandbytes would not page and would keep its quantisation maps on the host; for a CUDA
  target two things are put as CUDA runs them: a paged optimizer's `state1`/`state2` of a
  parameter of >= 1e5 elements go to unified memory (`get_state_buffer`: `F.get_paged`,
  cudaMallocManaged, outside PyTorch's allocator: place `managed`), and the two 256-entry
  maps are copied to the device at the first 8-bit parameter (`init_state`'s
  `name2qmap[...].to(p.device)`; the host maps of `__init__` are built outside fake mode).
- `torchao.AdamW8bit|AdamW4bit|AdamWFp8`: torchao's own `step` creates its states (tensor
  subclasses whose codes, scales and maps are plain tensors the recorder sees) and its
  host step counter; its update is `torch.compile(single_param_adam)`, one compiled kernel
  per parameter, which capture runs as one in-place op (what the compiled kernel's own
  temporaries are is not modelled).
- `lion_pytorch.Lion`: lion-pytorch's eager step (its state `exp_avg` like the parameter).

`host_state` lists the state tensors a CUDA run keeps on the host (torch.optim's `step`
counters outside fused/capturable; torchao's `step`): the class is probed once on fake
CUDA tensors and the keys of its state that stay on the CPU are read off it.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import types
from collections.abc import Iterable
from typing import Any
from unittest import mock

import torch
from memgnn.predictor.ir.recorder import mark_place, placed
from memgnn.predictor.spec.optimizer_names import BNB_OPTIMIZERS, TORCHAO_OPTIMIZERS, impl_support
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

log = logging.getLogger(__name__)

__all__ = [
    "OptimizerInBackward",
    "bnb_optimizer",
    "host_state",
    "library_optimizer",
    "torch_optimizer",
]

PAGED_MIN_NUMEL = 100_000  # bitsandbytes' get_state_buffer pages states of this size up


def torch_optimizer(
    params: list[torch.nn.Parameter], cls: type, impl: str, lr: float, target: str
) -> torch.optim.Optimizer:
    """`cls(params, lr, foreach=/fused=)` as PyTorch would run it on `target`."""
    foreach, fused = impl_support(cls)
    if impl == "auto":
        impl = "foreach" if target == "cuda" and foreach else "for-loop"
    flags: dict[str, Any] = {}
    if foreach:
        flags["foreach"] = impl == "foreach"
    if fused:
        flags["fused"] = impl == "fused"
    if target == "cuda" and impl == "fused":
        error = _probe(cls, tuple(sorted(flags.items())))[1]
        if error:
            raise ValueError(f"--optimizer torch.optim.{cls.__name__} fused on CUDA: {error}")
    optimizer = cls(params, lr=lr, **flags)
    if cls is torch.optim.ASGD and impl == "for-loop":
        _asgd_mu_is_one(optimizer)
    return optimizer


def _asgd_mu_is_one(optimizer: torch.optim.Optimizer) -> None:
    """ASGD's for-loop branches on `mu.item() != 1` (average into `ax` through a temporary,
    or copy the parameter into it). `mu = 1 / max(1, step - t0)` is 1 for the first `t0`
    steps (10^6 by default): a fake tensor has no value, so the read is answered so."""
    step = optimizer.step

    def step_with_mu(*args: Any, **kwargs: Any) -> Any:
        mus = {
            id(s["mu"]) for s in optimizer.state.values() if isinstance(s.get("mu"), torch.Tensor)
        }
        t0s = {g["t0"] for g in optimizer.param_groups}
        if any(t0 < 10 for t0 in t0s):  # memgnn runs two steps: mu is 1 while step <= t0
            return step(*args, **kwargs)
        with _Scalars(mus, 1.0):
            return step(*args, **kwargs)

    optimizer.step = step_with_mu  # type: ignore[method-assign]


def library_optimizer(
    params: list[torch.nn.Parameter], name: str, lr: float, target: str
) -> torch.optim.Optimizer:
    """bitsandbytes', torchao's or lion-pytorch's optimizer `name` over `params`."""
    if name in BNB_OPTIMIZERS:
        return bnb_optimizer(params, name, lr, target)
    if name in TORCHAO_OPTIMIZERS:
        return _torchao_optimizer(params, name, lr)
    if name == "lion_pytorch.Lion":
        try:
            from lion_pytorch import Lion  # deferred: optional dependency (memgnn[lion])
        except ImportError:
            raise ValueError(
                "--optimizer lion_pytorch.Lion needs lion-pytorch: pip install lion-pytorch"
            ) from None
        return Lion(params, lr=lr)
    raise ValueError(f"unknown library optimizer {name!r}")


def bnb_optimizer(
    params: list[torch.nn.Parameter], name: str, lr: float, target: str
) -> torch.optim.Optimizer:
    """bitsandbytes' `name` (`bnb.PagedAdamW8bit`), adapted to a CUDA target (module doc)."""
    import bitsandbytes  # deferred: bitsandbytes is heavy and optional

    cls = getattr(bitsandbytes.optim, name.removeprefix("bnb."))
    with _host_tensors():  # the maps of __init__ read data (`create_dynamic_map`)
        optimizer = cls(params, lr=lr)
    if target != "cuda" or any(p.is_cuda for p in params):
        # on the CPU bitsandbytes does not page and keeps its maps on the host; on a real
        # GPU (the cuda backend) its own code pages and copies
        return optimizer
    mark_place(optimizer.name2qmap.values(), "pageable")
    original_init = optimizer.init_state

    def init_state(self: Any, group: dict, p: torch.Tensor, gindex: int, pindex: int) -> None:
        config = self.get_config(gindex, pindex, group)
        if config["optim_bits"] == 8 and p.numel() >= config["min_8bit_size"]:
            # name2qmap[...].to(p.device): the first 8-bit parameter copies them to the GPU
            for key, qmap in list(self.name2qmap.items()):
                if getattr(qmap, "_memgnn_host", True):
                    copy = torch.empty_like(qmap)
                    copy.copy_(qmap)
                    copy._memgnn_host = False  # type: ignore[attr-defined]
                    self.name2qmap[key] = copy
        original_init(group, p, gindex, pindex)

    def get_state_buffer(self: Any, p: torch.Tensor, dtype: torch.dtype = torch.float32):
        if not self.is_paged or p.numel() < PAGED_MIN_NUMEL:
            return torch.zeros_like(p, dtype=dtype)
        with placed("managed"):  # F.get_paged + F.fill: cudaMallocManaged, zero-filled
            buffer = torch.zeros_like(p, dtype=dtype)
        mark_place([buffer], "managed")
        return buffer

    optimizer.init_state = types.MethodType(init_state, optimizer)
    optimizer.get_state_buffer = types.MethodType(get_state_buffer, optimizer)
    return optimizer


def _torchao_optimizer(params: list[torch.nn.Parameter], name: str, lr: float):
    try:
        import torchao.optim  # deferred: optional dependency (memgnn[torchao])
    except ImportError:
        raise ValueError(f"--optimizer {name} needs torchao: pip install torchao") from None
    base = getattr(torchao.optim, name.removeprefix("torchao."))
    _torchao_qmaps()

    class Captured(base):  # type: ignore[misc, valid-type]
        """torchao's step with its compiled update run as one in-place op."""

        def step(self, closure: Any = None) -> Any:
            with mock.patch.object(torch, "compile", _compiled_update):
                return super().step(closure)

    Captured.__name__ = base.__name__
    Captured.__qualname__ = base.__qualname__
    return Captured(params, lr=lr)


def _torchao_qmaps() -> None:
    """torchao's low-bit states read their quantisation maps from `get_qmap_signed()` /
    `get_qmap_unsigned()`, Python floats computed once (`lru_cache`) from tensors with
    `.tolist()`: computed here on the host, before any state is made under capture (a
    first call on fake tensors reads no values: an error inside backward, where
    `--optimizer-in-bwd` steps, and maps of made-up values cached for the process)."""
    import importlib

    with _host_tensors():
        for module in ("torchao.optim.subclass_8bit", "torchao.optim.subclass_4bit"):
            try:
                qmaps = importlib.import_module(module)
            except ImportError:  # another torchao layout: its own step reads them
                continue
            for getter in ("get_qmap_signed", "get_qmap_unsigned"):
                if callable(get := getattr(qmaps, getter, None)):
                    get()


def _compiled_update(fn: Any, **_: Any) -> Any:
    """`torch.compile(single_param_adam, ...)`: one fused kernel reading the states and
    writing the parameter and the states in place; here one in-place op on the parameter."""

    def update(p: torch.Tensor, grad: torch.Tensor, *args: Any) -> None:
        p.add_(grad.to(p.dtype), alpha=-1e-3)

    return update


@contextlib.contextmanager
def _host_tensors():
    """Outside fake mode and any recorder: what a library builds from data on the host."""
    with _disable_current_modes():
        yield


class OptimizerInBackward:
    """torchtune's `optimizer_in_bwd`: one optimizer per trained parameter, stepped in the
    parameter's post-accumulate-grad hook, then `zero_grad()` (set_to_none: the gradient
    is freed at once); the loop's `step()` and `zero_grad()` have nothing left to do.
    `make(params)` builds one optimizer."""

    def __init__(
        self,
        params: list[torch.nn.Parameter],
        make: Any,
    ) -> None:
        self.by_param = {p: make([p]) for p in params}
        for p in params:
            p.register_post_accumulate_grad_hook(self._step)

    def _step(self, p: torch.nn.Parameter) -> None:
        optimizer = self.by_param[p]
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def step(self, closure: Any = None) -> None:
        """Each parameter stepped in backward (torchtune's recipes skip the call)."""

    def zero_grad(self, set_to_none: bool = True) -> None:
        """The hooks freed every gradient already."""

    @property
    def optimizers(self) -> list[torch.optim.Optimizer]:
        return list(self.by_param.values())

    @property
    def device_optimizers(self) -> list[torch.optim.Optimizer]:
        return self.optimizers

    @property
    def param_groups(self) -> list[dict]:
        return [g for o in self.by_param.values() for g in o.param_groups]

    @property
    def state(self) -> dict:
        return {p: s for o in self.by_param.values() for p, s in o.state.items()}


# ---- state a CUDA run keeps on the host -------------------------------------------------


class _Scalars(TorchDispatchMode):
    """Answers `.item()` on fake tensors (the optimizers read step counters and norms):
    of the tensors in `only` (ids; None: every tensor) with `value`."""

    def __init__(self, only: set[int] | None = None, value: float = 1.0) -> None:
        super().__init__()
        self.only, self.value = only, value

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default and (
            self.only is None or id(args[0]) in self.only
        ):
            return self.value if args[0].dtype.is_floating_point else int(self.value)
        return func(*args, **(kwargs or {}))


@functools.cache
def _probe(cls: type, flags: tuple[tuple[str, Any], ...]) -> tuple[frozenset[str], str]:
    """(state keys a CUDA run of `cls(**flags)` keeps on the host, the error it raises on
    CUDA or ""): one step of one fake CUDA parameter. State is made before the update, so
    an update the fake CUDA device cannot run still shows where the state lives."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    error = ""
    with _disable_current_modes(), FakeTensorMode(allow_non_fake_inputs=True), _Scalars():
        p = torch.nn.Parameter(torch.empty(8, 8, device="cuda"))
        p.grad = torch.empty(8, 8, device="cuda")
        try:
            optimizer = cls([p], lr=1e-3, **dict(flags))
        except (RuntimeError, ValueError) as exc:
            return frozenset(), str(exc).splitlines()[0]
        try:
            optimizer.step()
        except Exception as exc:  # the update; the state is already made
            log.debug("probe of %s: %s", cls.__name__, exc)
            if "fused" in str(exc):
                error = str(exc).splitlines()[0]
        state = optimizer.state.get(p, {})
        keys = frozenset(
            k for k, v in state.items() if isinstance(v, torch.Tensor) and v.device.type == "cpu"
        )
    return keys, error


def _host_keys(optimizer: torch.optim.Optimizer, group: dict) -> frozenset[str]:
    cls = type(optimizer)
    if cls.__module__.startswith("torchao") or any(
        c.__module__.startswith("torchao") for c in cls.__mro__
    ):
        return frozenset({"step"})  # `state["step"] = torch.tensor(0.0)`: no device
    if not cls.__module__.startswith("torch.optim"):
        return frozenset()  # bitsandbytes (a Python int), lion-pytorch, memgnn's emulations
    foreach, fused = impl_support(cls)
    flags = {"capturable": group.get("capturable")} if "capturable" in group else {}
    if foreach:
        flags["foreach"] = group.get("foreach")
    if fused:
        flags["fused"] = group.get("fused")
    return _probe(cls, tuple(sorted(flags.items())))[0]


def host_state(optimizers: Iterable[torch.optim.Optimizer], target: str) -> list[torch.Tensor]:
    """State tensors a CUDA run keeps on the host (their bytes count 0 on the device)."""
    if target != "cuda":
        return []
    out = []
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            keys = _host_keys(optimizer, group)
            for p in group["params"]:
                state = optimizer.state.get(p, {})
                out.extend(state[k] for k in keys if isinstance(state.get(k), torch.Tensor))
    return out
