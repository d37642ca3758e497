"""The user's own training step, run as memgnn runs its built-in one (`step.TrainingStep`).

`UserStep` has `TrainingStep`'s face (model, optimizer, state_tensors, host_state, run), so
capture (`capture.capture(..., make_step=)`, fake tensors: no weight is ever allocated)
and the CPU recorder (`dataset.cpu_backend`, real tensors) run it the same way. What it
runs is the user's code: `make_model()`, `make_optimizer(params)` and, per step,
`step_fn(model, optimizer, make_batch(**sizes))`: forward, a custom loss, backward,
`optimizer.step()`, `zero_grad`, hooks, anything. Nothing in the step tells memgnn where
its phases start, so they are watched (`_PhaseWatch`): the model's forward (a forward
pre-hook on the root module), backward (`torch.autograd.backward`, which `Tensor.backward`
calls), the optimizer's step (its step hooks) and `zero_grad` (the optimizer's and the
model's). The loop around the step is `for step in (0, 1): out = step_fn(model,
optimizer, make_batch(**sizes))`, each step's batch and return value dropped before the
next: step 0 is the first step (optimizer state is created in it), step 1 steady state.

PyTorch's by-device choices are made as on the target's real tensors (`on_target`): the
default `foreach` of torch.optim classes and of `clip_grad_norm_` (which fake tensors
would otherwise turn off), and on a CUDA target foreach on the device and
`torch.autocast("cuda")` as the autocast of the device the fake tensors are on.
A float read of a tensor's value outside the optimizer's step (`loss.item()` for logging,
GradScaler's `found_inf`) is taken as 0.0: it decides values, not sizes (the answer says
so when it happened); an integer read is an error, as in any capture.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from memgnn.predictor.capture.step import NullObserver, StepObserver
from memgnn.predictor.emulate.optimizers import host_state
from torch import nn

log = logging.getLogger(__name__)

__all__ = [
    "MakeOptimizer",
    "StepFn",
    "UserStep",
    "capture_user_step",
    "fake_weights",
    "on_target",
    "user_bundle",
]

StepFn = Callable[[nn.Module, Any, Any], Any]
MakeOptimizer = Callable[[list[nn.Parameter]], Any]


class _PhaseWatch:
    """Tells `observer` where the user's step is: forward, backward, optimizer, zero_grad
    (see the module docstring). Micro-steps count the model's forwards in the step."""

    def __init__(self, step: UserStep, observer: StepObserver, index: int):
        self.step, self.obs, self.index = step, observer, index
        self.micro = -1
        self.depth = 0  # nested backward (reentrant checkpointing) is one backward
        self.handles: list[Any] = []
        self.patched: list[tuple[Any, str, Any]] = []

    def _forward(self, module: nn.Module, args: Any) -> None:
        if self.depth:  # a recomputation inside backward
            return
        self.micro += 1
        self.obs.on_phase("forward", self.index, self.micro)

    def _backward(self, inner: Callable[..., Any]) -> Callable[..., Any]:
        def backward(*args: Any, **kwargs: Any) -> Any:
            outer = self.depth == 0
            if outer:  # what every forward of the step left alive is saved for backward
                for micro in range(max(self.micro, 0) + 1):  # (a contrastive step: two)
                    self.obs.on_phase("backward", self.index, micro)
            self.depth += 1
            try:
                return inner(*args, **kwargs)
            finally:
                self.depth -= 1
                if outer:
                    self.obs.on_backward_end(self.step.model, self.index, max(self.micro, 0))

        return backward

    def _zero_grad(self, inner: Callable[..., Any]) -> Callable[..., Any]:
        def zero_grad(*args: Any, **kwargs: Any) -> Any:
            self.obs.on_phase("zero_grad", self.index, 0)
            return inner(*args, **kwargs)

        return zero_grad

    def _patch(self, owner: Any, name: str, value: Any) -> None:
        self.patched.append((owner, name, owner.__dict__.get(name, _ABSENT)))
        setattr(owner, name, value)

    def __enter__(self) -> _PhaseWatch:
        model, optimizer = self.step.model, self.step.local_optimizer
        self.handles.append(model.register_forward_pre_hook(self._forward))
        self._patch(torch.autograd, "backward", self._backward(torch.autograd.backward))
        self._patch(model, "zero_grad", self._zero_grad(model.zero_grad))
        if optimizer is not None:
            pre = lambda opt, args, kwargs: self.obs.on_phase("optimizer", self.index, 0)  # noqa: E731
            post = lambda opt, args, kwargs: self.obs.on_optimizer_end(opt, self.index)  # noqa: E731
            if hasattr(optimizer, "register_step_pre_hook"):
                self.handles.append(optimizer.register_step_pre_hook(pre))
                self.handles.append(optimizer.register_step_post_hook(post))
            self._patch(optimizer, "zero_grad", self._zero_grad(optimizer.zero_grad))
        return self

    def __exit__(self, *exc: Any) -> None:
        for h in self.handles:
            h.remove()
        for owner, name, old in reversed(self.patched):
            if old is _ABSENT:
                delattr(owner, name)
            else:
                setattr(owner, name, old)


_ABSENT = object()


@contextlib.contextmanager
def on_target(target: str) -> Iterator[None]:
    """PyTorch's by-device choices as on `target`'s real tensors. Fake tensors are not of
    the types PyTorch's default `foreach` accepts (torch.optim's, clip_grad_norm_'s): they
    are made to count as tensors. On "cuda" (capture's tensors are CPU ones), foreach
    kernels are supported on the device, as on CUDA, and `torch.autocast("cuda")` is the
    autocast of the device the tensors are on."""
    import torch.optim.optimizer as optim_mod
    import torch.utils._foreach_utils as foreach_utils
    from torch._subclasses.fake_tensor import FakeTensor

    lists = [optim_mod._foreach_supported_types, foreach_utils._foreach_supported_types]
    added = [types for types in lists if FakeTensor not in types]
    for types in added:
        types.append(FakeTensor)
    saved: list[tuple[Any, str, Any]] = []
    if target == "cuda":
        devices = optim_mod._get_foreach_kernels_supported_devices
        real_autocast = torch.autocast

        class autocast(real_autocast):  # type: ignore[misc,valid-type]
            def __init__(self, device_type: str, *args: Any, **kwargs: Any) -> None:
                device_type = "cpu" if device_type == "cuda" else device_type
                super().__init__(device_type, *args, **kwargs)

        def supported() -> list[str]:
            return [*devices(), "cpu"]

        saved = [
            (optim_mod, "_get_foreach_kernels_supported_devices", devices),
            (torch, "autocast", real_autocast),
            (torch.amp, "autocast", torch.amp.autocast),
        ]
        for owner, name, _ in saved:
            setattr(owner, name, autocast if name == "autocast" else supported)
    try:
        yield
    finally:
        for owner, name, old in saved:
            setattr(owner, name, old)
        for types in added:
            types.remove(FakeTensor)


class UserStep:
    """The user's model, optimizer and step function, ready to run steps (see the module
    docstring). Build it inside the tensor mode you want (capture: a FakeTensorMode).

    `model`: a built module (its weights already in the wanted mode) or `make_model()`;
    `make_optimizer(params)` gets the trainable parameters (None: no optimizer, `step_fn`
    gets None); `make_batch(**sizes)` builds one step's batch."""

    world = None  # one process: no sharding

    def __init__(
        self,
        model: nn.Module | Callable[[], nn.Module],
        step_fn: StepFn,
        make_batch: Callable[..., Any],
        make_optimizer: MakeOptimizer | None = None,
        *,
        device: torch.device,
        target: str,
    ):
        if target not in ("cpu", "cuda"):
            raise ValueError(f"target must be cpu or cuda, got {target!r}")
        self.device, self.target = device, target
        self.step_fn, self.make_batch = step_fn, make_batch
        if not isinstance(model, nn.Module):
            with torch.device(device):
                model = model()
            if not isinstance(model, nn.Module):
                raise ValueError(f"make_model() must return an nn.Module, got {type(model)}")
        model.train()
        self.model = model
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = make_optimizer(self.params) if make_optimizer is not None else None
        self.value_reads = 0  # float reads of tensor values taken as 0.0 (capture)

    @property
    def local_optimizer(self) -> Any:
        return self.optimizer

    def state_tensors(self) -> dict[str, list[torch.Tensor]]:
        """What lives across steps, by category: weights, gradients, optimizer state."""
        opt = self.optimizer
        state = getattr(opt, "state", {}) if opt is not None else {}
        return {
            "parameter": [*self.model.parameters(), *self.model.buffers()],
            "gradient": [p.grad for p in self.params if p.grad is not None],
            "optimizer_state": [
                v for s in state.values() for v in s.values() if isinstance(v, torch.Tensor)
            ],
        }

    def host_state(self) -> list[torch.Tensor]:
        """Optimizer state a CUDA run keeps on the host (`emulate.optimizers.host_state`)."""
        if not isinstance(self.optimizer, torch.optim.Optimizer):
            return []
        return host_state([self.optimizer], self.target)

    def dispatch_hooks(self, table: dict[Any, Any]) -> dict[Any, Any]:
        """Capture's dispatch hooks with float value reads outside the optimizer's step
        taken as 0.0 (`loss.item()`); everything else as capture answers it."""
        local = table.get(torch.ops.aten._local_scalar_dense.default)

        def local_scalar(rec: Any, func: Any, args: tuple, kwargs: dict) -> Any:
            (t,) = args
            if t.dtype.is_floating_point and rec.phase != "optimizer":
                try:
                    return func(*args, **kwargs)  # a constant fake tensors know
                except Exception:  # noqa: BLE001 - no data: the value is assumed
                    self.value_reads += 1
                    return 0.0
            assert local is not None
            return local(rec, func, args, kwargs)

        return table | {torch.ops.aten._local_scalar_dense.default: local_scalar}

    def run(
        self,
        sizes: Mapping[str, Any],
        observer: StepObserver | None = None,
        *,
        steps: tuple[int, ...] = (0, 1),
        micro_steps: int | None = None,
    ) -> None:
        """Run `step_fn` once per step in `steps` (0 = first, 1 = steady)."""
        obs = observer or NullObserver()
        with on_target(self.target):
            for step in steps:
                obs.on_phase("input", step, 0)
                batch = self.make_batch(**sizes)
                with _PhaseWatch(self, obs, step):
                    out = self.step_fn(self.model, self.optimizer, batch)
                del batch, out


@contextlib.contextmanager
def fake_weights(model: nn.Module) -> Iterator[dict[int, Any]]:
    """Inside a FakeTensorMode: `model`'s parameters and buffers replaced by fake CPU
    tensors of their shapes, dtypes and `requires_grad` (tied weights stay tied), the
    originals put back on exit. Yields id(original) -> its fake. Module hooks stay (the
    modules are the same); hooks on the weight tensors themselves (`p.register_hook`,
    `register_post_accumulate_grad_hook`) stay on the originals: a model that has them is
    captured faithfully only when built by the capture (`make_model`)."""
    swapped: list[tuple[nn.Module, str, str, Any]] = []
    fakes: dict[int, Any] = {}

    def fake(t: torch.Tensor) -> torch.Tensor:
        made = fakes.get(id(t))
        if made is None:
            with torch.no_grad():
                made = torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device="cpu")
            if isinstance(t, nn.Parameter):
                made = nn.Parameter(made, requires_grad=t.requires_grad)
            fakes[id(t)] = made
        return made

    try:
        for module in model.modules():
            for kind in ("_parameters", "_buffers"):
                table = getattr(module, kind)
                for name, t in list(table.items()):
                    if t is not None:
                        swapped.append((module, kind, name, t))
                        table[name] = fake(t)
        yield fakes
    finally:
        for module, kind, name, t in reversed(swapped):
            getattr(module, kind)[name] = t


def _name(obj: Any) -> str:
    """`module.qualname` of a function or class (a lambda says `<lambda>`)."""
    target = (
        obj
        if isinstance(obj, type) or callable(obj) and hasattr(obj, "__qualname__")
        else type(obj)
    )
    return f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', repr(target))}"


def user_bundle(
    model: nn.Module | Callable[[], nn.Module], sizes: Mapping[str, int], name: str | None = None
) -> Any:
    """The `ModelBundle` that names a user's step for capture and the CPU recorder: its
    name (`py:` and the model's constructor or class), the sizes as its dims; building,
    batching and the loss are the user's step's (`UserStep`), never the bundle's."""
    from memgnn.predictor.spec.bundle import ModelBundle

    def unused(*args: Any) -> Any:
        raise AssertionError("a user's step is built by UserStep")

    label = name or (_name(model) if not isinstance(model, nn.Module) else _name(type(model)))
    return ModelBundle(
        name=f"py:{label}", family="custom", build=unused, make_inputs=unused, loss=unused,
        dims=dict(sizes), origin="py",
    )  # fmt: skip


def capture_user_step(
    model: nn.Module | Callable[[], nn.Module],
    step_fn: StepFn,
    make_batch: Callable[..., Any],
    make_optimizer: MakeOptimizer | None = None,
    *,
    sizes: Mapping[str, int],
    target: str = "cuda",
    sm: int = 80,
    symbolic: bool = False,
    name: str | None = None,
    prepare: Callable[[], contextlib.AbstractContextManager[Any]] | None = None,
) -> Any:
    """Capture two steps of the user's own training step on fake tensors (a `StepGraph`).

    `sizes` name the batch's dims (e.g. {"B": 8, "S": 128}), given to `make_batch` as
    keyword arguments: plain ints (`symbolic=False`, the default: the graph holds at these
    sizes) or symbols with these example values (`symbolic=True`: one graph for any size,
    where the user's code keeps sizes symbolic). `model` may be a built module: its
    weights are swapped for fake ones for the capture (`fake_weights`) and put back.
    `prepare()`, if given, is entered around
    each build (inside the fake mode), e.g. to put a built model's weights on fake tensors.
    The graph's `meta["user_step"]` says what ran; its `train` is empty (no TrainSpec)."""
    from memgnn.predictor.capture.capture import CaptureConfig, capture
    from memgnn.predictor.spec.train import TrainSpec

    if isinstance(model, nn.Module) and prepare is None:  # a built model: its weights
        built_model = model  # are swapped for fake ones for the capture, then put back
        prepare = lambda: fake_weights(built_model)  # noqa: E731
    built: list[UserStep] = []
    stack = contextlib.ExitStack()

    def make_step(tgt: str) -> UserStep:
        if prepare is not None:
            stack.enter_context(prepare())
        step = UserStep(model, step_fn, make_batch, make_optimizer,
                        device=torch.device("cpu"), target=tgt)  # fmt: skip
        built.append(step)
        return step

    bundle = user_bundle(model, sizes, name)
    config = CaptureConfig(symbolic=symbolic, sizes=dict(sizes), target=target, sm=sm,
                           scenario="worst", mode="full")  # fmt: skip
    with stack:
        graph = capture(bundle, TrainSpec(), config, make_step=make_step)
    step = built[-1]
    graph.train = {}
    graph.model = {"name": bundle.name, "family": "custom", "hparams": {}}
    graph.meta["user_step"] = {
        "step_fn": _name(step_fn),
        "optimizer": _name(step.optimizer) if step.optimizer is not None else None,
        "steps": ["first", "steady"],
        "sizes": dict(sizes),
        "symbolic": symbolic,
        "value_reads": step.value_reads,
    }
    return graph
