"""One training step as real code runs it: the single runner behind capture and profiling.

`TrainingStep` builds the model in the caller's tensor mode (real, fake or meta), applies
the `TrainSpec` (dtype, attention implementation, non-reentrant activation checkpointing
per block or transformers' own (`hf`), optimizer and its implementation, autocast +
GradScaler), then runs steps: micro-batches of forward and
backward, the optimizer update, `zero_grad`. Step 0 is the first step (optimizer state is
created in it); step 1 is steady state. An observer hears every phase boundary, so the
recorder, the CPU tracker and the CUDA backend all see the same step.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Mapping
from typing import Any, Protocol

import torch
from memgnn.predictor.emulate.attention import apply_attention, check_attention
from memgnn.predictor.emulate.compile import apply_compile
from memgnn.predictor.emulate.float8 import apply_float8, check_float8, precompute_scales
from memgnn.predictor.emulate.fsdp_offload import HostOptimizer, offloads_params
from memgnn.predictor.emulate.loss import apply_chunked_loss, compile_model_loss
from memgnn.predictor.emulate.offload import apply_activation_offload
from memgnn.predictor.emulate.offload_optim import CPUOffloadOptimizer
from memgnn.predictor.emulate.optim8bit import AdamW8bit
from memgnn.predictor.emulate.optimizers import (
    OptimizerInBackward,
    host_state,
    library_optimizer,
    torch_optimizer,
)
from memgnn.predictor.emulate.parallel import (
    World,
    gradient_sync,
    parallelize,
    resident_tensors,
    zero_optimizer,
)
from memgnn.predictor.emulate.peft import apply_peft
from memgnn.predictor.emulate.quant import hold_quant_state, quant_state_tensors, quantize_model
from memgnn.predictor.emulate.selective import op_sac_context_fn
from memgnn.predictor.errors import UserError
from memgnn.predictor.spec.bundle import ModelBundle, default_blocks
from memgnn.predictor.spec.optimizer_names import LIBRARY_OPTIMIZERS, torch_class
from memgnn.predictor.spec.train import TrainSpec
from torch import nn

log = logging.getLogger(__name__)


class StepObserver(Protocol):
    def on_phase(self, phase: str, step: int, micro: int) -> None: ...
    def on_backward_end(self, model: nn.Module, step: int, micro: int) -> None: ...
    def on_optimizer_end(self, optimizer: torch.optim.Optimizer, step: int) -> None: ...


class NullObserver:
    def on_phase(self, phase: str, step: int, micro: int) -> None:
        pass

    def on_backward_end(self, model: nn.Module, step: int, micro: int) -> None:
        pass

    def on_optimizer_end(self, optimizer: torch.optim.Optimizer, step: int) -> None:
        pass


def resolve_optimizer_impl(train: TrainSpec, target: str) -> str:
    """What PyTorch picks when the user does not say: foreach on CUDA, for-loop on CPU."""
    if train.optim.impl != "auto":
        return train.optim.impl
    if train.optim.name == "adafactor":
        return "foreach" if target == "cuda" else "for-loop"
    return "foreach" if target == "cuda" else "for-loop"


def build_optimizer(params: list[nn.Parameter], train: TrainSpec, target: str):
    if train.optim.name == "adamw8bit":
        return AdamW8bit(params, lr=train.optim.lr)
    if train.optim.name in LIBRARY_OPTIMIZERS:  # bitsandbytes', torchao's, lion-pytorch's
        return library_optimizer(params, train.optim.name, train.optim.lr, target)
    cls = torch_class(train.optim.name)  # torch.optim.<Class> by name
    if cls is not None:
        return torch_optimizer(params, cls, train.optim.impl, train.optim.lr, target)
    impl = resolve_optimizer_impl(train, target)
    flags: dict[str, Any] = {"foreach": impl == "foreach"}
    if train.optim.name in ("adam", "adamw"):
        flags["fused"] = impl == "fused"
        if impl == "fused":
            flags["foreach"] = False
    cls = {
        "sgd": functools.partial(torch.optim.SGD, momentum=0.9),
        "adam": torch.optim.Adam,
        "adamw": torch.optim.AdamW,
        "adafactor": torch.optim.Adafactor,
    }[train.optim.name]
    if train.optim.name == "sgd" and impl == "fused":
        flags["fused"], flags["foreach"] = True, False
    return cls(params, lr=train.optim.lr, **flags)


def _offload_make(train: TrainSpec, target: str):
    """torchao's CPUOffloadOptimizer builds its optimizers with the same arguments on the
    host and the device: AdamW with `fused=True` (its default), any other class with what
    PyTorch picks on each (`--optimizer-impl` where the user set one)."""
    adamw = train.optim.name in ("adamw", "torch.optim.AdamW") and train.optim.impl == "auto"

    def make(tensors: list[torch.Tensor], on_host: bool) -> torch.optim.Optimizer:
        if adamw:
            return torch.optim.AdamW(tensors, lr=train.optim.lr, fused=True)
        return build_optimizer(tensors, train, "cpu" if on_host else target)

    return make


class _FakeSafeGradScaler(torch.amp.GradScaler):
    """GradScaler whose inf check does not read a tensor value (fake tensors have none).

    Memory is the same as the real scaler's: same scale/found_inf tensors, same unscale
    and update kernels; only the Python-level `found_inf.item()` skip check is assumed 0.
    """

    def _maybe_opt_step(self, optimizer, optimizer_state, *args, **kwargs):
        return optimizer.step(*args, **kwargs)


def _apply_checkpointing(blocks: list[nn.Module], train: TrainSpec) -> list[nn.Module]:
    """Wrap the forward of the blocks `train` names (`ActivationSpec.checkpointed`) in
    non-reentrant checkpointing; under `selective-op` with torchtitan's op-level policy
    (`emulate.selective`). Returns the wrapped blocks."""
    from torch.utils.checkpoint import checkpoint

    chosen = [blocks[i] for i in train.activations.checkpointed(len(blocks))]
    extra = {"context_fn": op_sac_context_fn} if train.activations.selective else {}
    for block in chosen:
        inner = block.forward

        def forward(*args, _inner=inner, **kwargs):
            return checkpoint(_inner, *args, use_reentrant=False, **extra, **kwargs)

        forward.checkpointed = inner  # what a compiled region traces (emulate.compile)
        forward.context_fn = extra.get("context_fn")
        block.forward = forward
    return chosen


def _no_kv_cache(model: nn.Module) -> None:
    """Turn a transformers model's KV cache off under memgnn's checkpointing, as HF's own
    gradient checkpointing does (`use_cache=True` is incompatible with it). With the cache
    on, every recomputed layer appends its keys and values to the DynamicCache a second
    time and attends over 2 x S keys (eager attention fails, SDPA silently computes and
    stores twice the bytes), and the cache keeps every layer's keys and values alive
    through backward. Every submodule's config: T5's decoder stack keeps its own copy
    (`copy.deepcopy(config)`), which fills `use_cache=None` from itself."""
    for module in model.modules():
        config = getattr(module, "config", None)
        if getattr(config, "use_cache", False):
            log.debug("%s: use_cache off under checkpointing", type(module).__name__)
            config.use_cache = False


def _apply_hf_checkpointing(model: nn.Module, name: str) -> int:
    """transformers' own gradient checkpointing, as `Trainer(gradient_checkpointing=True)`
    runs it: `activation_checkpointing_enable` (the 5.x name of `gradient_checkpointing_enable`,
    whose default is non-reentrant since 5.0; 4.x defaulted to reentrant) with
    use_reentrant=False. Every `GradientCheckpointingLayer` (the decoder layers) wraps its
    forward in `torch.utils.checkpoint`; a model whose main input is input_ids also gets
    `enable_input_require_grads` (a no-op when the embedding trains, a gradient for the
    embedding output when it is frozen, e.g. under LoRA). Returns the layers wrapped."""
    enable = getattr(model, "activation_checkpointing_enable", None) or getattr(
        model, "gradient_checkpointing_enable", None
    )
    if enable is None or not getattr(model, "supports_gradient_checkpointing", False):
        raise ValueError(
            f"--checkpointing hf: {type(model).__name__} ({name}) is not a transformers model "
            "with gradient checkpointing; use --checkpointing full or blocks:N"
        )
    kwarg = (
        "activation_checkpointing_kwargs"
        if enable.__name__ == "activation_checkpointing_enable"
        else "gradient_checkpointing_kwargs"
    )
    enable(**{kwarg: {"use_reentrant": False}})
    from transformers.modeling_layers import GradientCheckpointingLayer

    return sum(
        isinstance(m, GradientCheckpointingLayer) and m.gradient_checkpointing
        for m in model.modules()
    )


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype):
    """Build parameters directly in the training dtype (pure bf16/fp16), as `.to()` would."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def check_cuda_only(train: TrainSpec, target: str) -> None:
    """bitsandbytes' CUDA paths are what `--quantize-base` and `--optimizer adamw8bit`
    model: on a CPU target they are an error that names the option."""
    if target == "cuda":
        return
    if train.quant.base != "none":
        raise ValueError(
            f"--quantize-base {train.quant.base} (QLoRA) models bitsandbytes' CUDA kernels: "
            "pick a GPU --device, not cpu"
        )
    if train.optim.name == "adamw8bit":
        raise ValueError(
            "--optimizer adamw8bit models bitsandbytes' CUDA kernel: pick a GPU --device, not cpu"
        )


@contextlib.contextmanager
def mixed_dtensor_refusal(train: TrainSpec):
    """--tp alone leaves DTensor weights (the split linears) next to plain ones (embeddings,
    norms, lm_head); torch.optim's foreach and fused kernels refuse the mix, in a real job
    as here: a UserError naming the options that run (`emulate.tensor_parallel`)."""
    try:
        yield
    except RuntimeError as exc:
        if "mixed torch.Tensor and DTensor" not in str(exc):
            raise
        raise UserError(
            f"--tp {train.parallel.tp} --optimizer-impl {train.optim.impl}: the split linears' "
            "weights are DTensors, the embeddings, norms and lm_head plain tensors, and the "
            f"optimizer's multi-tensor kernel refuses the mix as in a real job ({exc}); use "
            "--optimizer-impl for-loop, or --sharding fsdp (2-D: FSDP2 makes every weight a "
            "DTensor)"
        ) from exc


def step_plan(train: TrainSpec) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(unrecorded warm-up steps, measured steps) for the TrainSpec's `steps`."""
    return {"first": ((), (0,)), "steady": ((0,), (1,)), "both": ((), (0, 1))}[train.loop.steps]


class TrainingStep:
    """A model, optimizer and scaler set up for `train`, ready to run steps.

    Build it inside the tensor mode you want (e.g. under a FakeTensorMode). `target` is the
    device whose behaviour to reproduce ("cpu" or "cuda"): it picks the optimizer
    implementation PyTorch would use there and the autocast device type.
    """

    def __init__(
        self,
        bundle: ModelBundle,
        train: TrainSpec,
        *,
        device: torch.device,
        target: str,
        fake: bool = False,
        world: World | None = None,
    ):
        if target not in ("cpu", "cuda"):
            raise ValueError(f"target must be cpu or cuda, got {target!r}")
        if train.parallel.distributed != (world is not None):
            raise ValueError(
                f"--gpus {train.parallel.gpus} runs one rank inside a process group: "
                "build the step inside predictor.emulate.parallel.fake_world(train) and pass world="
                if world is None
                else "world= is for a sharded or tensor-parallel TrainSpec (--sharding, --tp)"
            )
        self.world = world
        check_cuda_only(train, target)
        self.bundle, self.train, self.device, self.target = bundle, train, device, target
        check_attention(train, target)
        check_float8(train, target)
        with torch.device(device), _default_dtype(train.numerics.param_dtype):
            model = bundle.build()
        model.train()
        self.model = model
        self.attention = apply_attention(model, train, fake=fake)
        self.quantized = quantize_model(model, train)
        self.float8 = apply_float8(model, train, device=device, target=target)
        self.checkpointed = 0
        blocks = (bundle.blocks or default_blocks)(model)
        wrapped: list[nn.Module] = []
        if train.activations.checkpointing == "hf":
            self.checkpointed = _apply_hf_checkpointing(model, bundle.name)
        elif train.activations.checkpoint_blocks is not None:
            if not blocks:
                raise ValueError(f"model {bundle.name!r} has no repeated blocks to checkpoint")
            wrapped = _apply_checkpointing(blocks, train)
            self.checkpointed = len(wrapped)
            _no_kv_cache(model)
        if train.adapter.method != "none":
            with torch.device(device):
                model = self.model = apply_peft(model, train)
        # torch.compile: the whole model or each block (emulate.compile); a compiled
        # transformers model runs without its KV cache (training does not read it)
        self.compiled = apply_compile(
            model, blocks, train.kernels.compile, fake=fake, checkpointed=wrapped,
            dynamic=train.kernels.compile_dynamic,
        )  # fmt: skip
        if self.compiled:
            _no_kv_cache(model)
        if train.kernels.compile_loss:  # the model's own loss, a region of its own
            compile_model_loss(model, fake=fake, dynamic=train.kernels.compile_dynamic)
        # --loss chunked-ce:N: the head per chunk, cross entropy per chunk (emulate.loss)
        self.loss_fn = bundle.loss
        n_chunks = train.kernels.loss_chunks
        if n_chunks is not None:
            compiled_loss = train.kernels.compile != "none"
            self.loss_fn = apply_chunked_loss(
                model, n_chunks, compiled=compiled_loss, fake=fake,
                dynamic=train.kernels.compile_dynamic,
            )  # fmt: skip
        if world is not None:
            hold_quant_state(model)  # bitsandbytes' quant state is no module state
            model = self.model = parallelize(model, blocks, train, world, target)
        # offloading: saved activations to the host (emulate.offload)
        offloaded = apply_activation_offload(model, train, target)
        if offloaded:
            log.info("%s: %s", bundle.name, offloaded)
        self.params = [p for p in model.parameters() if p.requires_grad]
        make = functools.partial(build_optimizer, train=train, target=target)
        if train.parallel.sharding == "zero1":
            self.optimizer = zero_optimizer(self.params, make)
        elif train.optim.in_backward:  # torchtune's optimizer_in_bwd
            self.optimizer = OptimizerInBackward(self.params, make)
        elif offloads_params(train):  # FSDP CPU offload: the optimizer steps host shards
            self.optimizer = HostOptimizer(build_optimizer(self.params, train, "cpu"))
        elif train.offload.optimizer == "torchao":
            self.optimizer = CPUOffloadOptimizer(
                self.params,
                _offload_make(train, target),
                offload_gradients=train.offload.gradients,
            )
        else:
            self.optimizer = build_optimizer(self.params, train, target)
        # TrainSpec.hold_outputs: the last micro-step's loss and model outputs, alive until
        # the next micro-step's replace them
        self._held_loss: torch.Tensor | None = None
        self._held_outputs: Any = None
        if train.loop.hold_outputs:
            model.register_forward_hook(self._hold_outputs)
        self.scaler = None
        if train.numerics.uses_grad_scaler:
            scaler_cls = _FakeSafeGradScaler if fake else torch.amp.GradScaler
            self.scaler = scaler_cls(device=device.type)

    def _hold_outputs(self, module: nn.Module, args: Any, output: Any) -> None:
        """The loop's `outputs = model(**batch)`: the new outputs replace the last ones once
        the forward returns (a root forward hook)."""
        self._held_outputs = output

    def state_tensors(self) -> dict[str, list[torch.Tensor]]:
        """What lives across steps, by category: weights, gradients, optimizer state."""
        opt_state = [
            v
            for s in self.local_optimizer.state.values()
            for v in s.values()
            if isinstance(v, torch.Tensor)
        ]
        resident = resident_tensors(self.model) if self.world is not None else []
        resident += quant_state_tensors(self.model)
        # an offloading optimizer's pinned host copies of parameters and gradients
        host = getattr(self.local_optimizer, "host_tensors", dict)()
        return {
            "parameter": [*self.model.parameters(), *self.model.buffers(), *resident]
            + host.get("parameter", []),
            "gradient": [p.grad for p in self.params if p.grad is not None]
            + host.get("gradient", []),
            "optimizer_state": opt_state,
        }

    @property
    def local_optimizer(self) -> torch.optim.Optimizer:
        """The optimizer holding this rank's state (ZeroRedundancyOptimizer's local one)."""
        return getattr(self.optimizer, "optim", self.optimizer)

    def host_state(self) -> list[torch.Tensor]:
        """Optimizer state PyTorch keeps on the host when training on CUDA (the `step`
        counters of non-fused, non-capturable torch.optim classes, Adafactor's, torchao's):
        read off each class's own state (`emulate.optimizers.host_state`)."""
        if offloads_params(self.train):  # all its state is on the host, counted there
            return []
        optimizer = self.local_optimizer
        optimizers = getattr(optimizer, "device_optimizers", [optimizer])
        return host_state(optimizers, self.target)

    def float_dtype(self) -> torch.dtype:
        return self.train.numerics.param_dtype

    def _autocast(self):
        dtype = self.train.numerics.autocast_dtype
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=dtype)

    def run(
        self,
        sizes: Mapping[str, Any],
        observer: StepObserver | None = None,
        *,
        steps: tuple[int, ...] = (0, 1),
        micro_steps: int | None = None,
    ) -> None:
        """Run the given steps (0 = first, 1 = steady). Micro-steps default to
        min(grad_accum, 2): micro-steps 2..G repeat micro-step 2 exactly (same live state).
        With `grad_sync="last"` every micro-step but the last runs without gradient sync
        (`parallel.gradient_sync`); micro-steps 2..G-1 of a longer run then hold what the
        last one holds (the accumulated unsharded gradients), less its collectives."""
        obs = observer or NullObserver()
        g = self.train.loop.grad_accum
        n_micro = micro_steps if micro_steps is not None else min(g, 2)
        for step in steps:
            for micro in range(n_micro):
                self._micro_step(sizes, obs, step, micro, g, last=micro == n_micro - 1)
            obs.on_phase("optimizer", step, 0)
            with mixed_dtensor_refusal(self.train):
                if self.scaler is not None:
                    self.scaler.step(self.optimizer)
                    self.scaler.update()
                else:
                    self.optimizer.step()
                precompute_scales(self.model, self.train)  # --float8-precompute-scale
            obs.on_optimizer_end(self.optimizer, step)
            obs.on_phase("zero_grad", step, 0)
            self.optimizer.zero_grad(set_to_none=self.train.optim.set_to_none)

    def _micro_step(
        self, sizes, obs: StepObserver, step: int, micro: int, g: int, last: bool = True
    ) -> None:
        obs.on_phase("input", step, micro)
        inputs = self.bundle.make_inputs(sizes, self.device, self.float_dtype())
        obs.on_phase("forward", step, micro)
        with gradient_sync(self.model, self.train, last):
            with self._autocast():
                loss = self.loss_fn(self.model, inputs)
                # the loop rebinds `loss`: the previous micro-step's goes now (its outputs
                # went when the forward returned, `_hold_outputs`)
                self._held_loss = None
                if g > 1:
                    loss = loss / g
            obs.on_phase("backward", step, micro)
            if self.scaler is not None:
                loss = self.scaler.scale(loss)
            loss.backward()
            if self.train.loop.hold_outputs:
                self._held_loss = loss
            del loss, inputs
        obs.on_backward_end(self.model, step, micro)
