"""What model an answer is about: identity, parameter count and dtypes, and structure.

`describe(model, bundle, train)` reads a built module (real, fake or meta tensors alike:
only shapes and dtypes are read) and says what a user needs to recognise the model they
asked about: the spec, the module class, layers and hidden size where the model's config
names them, the repeated blocks activation checkpointing wraps, the parameter count, and
the dtypes parameters are kept in under the training spec (the master weights; AMP
computes in its autocast dtype). `describe_bundle` builds the model on fake tensors, as
capture does, so no weight is ever allocated.

`structure(model)` is everything about a built module that decides its training step's
graph besides its code: modules (class and `extra_repr`, which holds strides, paddings,
dropout rates), parameters and buffers (name, shape, dtype, requires_grad, ties), and a
transformers config when the model has one. The capture cache keys on its digest.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from memgnn.predictor.emulate.float8 import float8_label
from memgnn.predictor.emulate.peft import adapter_label
from memgnn.predictor.emulate.quant import QUANTIZED_TYPES, Linear4bitSim, compute_dtype
from memgnn.predictor.spec.bundle import ModelBundle, default_blocks
from memgnn.predictor.spec.train import ParallelSpec, TrainSpec
from torch import nn

__all__ = ["ModelInfo", "describe", "describe_bundle", "structure", "spec_kind"]

_LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers")
_HIDDEN_KEYS = ("hidden_size", "n_embd", "d_model")


@dataclass(kw_only=True, slots=True)
class ModelInfo:
    spec: str  # the model spec as given (zoo name, hf:PATH, py:module:factory)
    kind: str  # zoo | hf | py
    family: str
    module_class: str
    parameters: int  # unique parameters (tied weights once)
    trainable_parameters: int
    parameter_bytes: int
    buffer_bytes: int
    param_dtypes: dict[str, int] = field(default_factory=dict)  # dtype -> parameters
    precision: str = "fp32"
    compute_dtype: str = "float32"  # the autocast dtype under AMP, else the param dtype
    blocks: int = 0  # repeated blocks (what checkpointing wraps)
    layers: int | None = None  # from the model's config, where it names them
    hidden: int | None = None
    attention: str | None = None  # transformers' attention implementation
    # under an adapter: the modules it adapted, by their name in a block (`q_proj`) ->
    # how many (peft's tuner layers; empty for a full fine-tune)
    adapted: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in ("zoo", "hf", "py"):
            raise ValueError(f"unknown model kind {self.kind!r}")
        if self.parameters < 0 or self.trainable_parameters > self.parameters:
            raise ValueError("parameter counts must satisfy 0 <= trainable <= total")

    @property
    def param_dtype(self) -> str:
        """The dtype most parameters are in (the master weights)."""
        if not self.param_dtypes:
            return "none"
        return max(self.param_dtypes.items(), key=lambda kv: kv[1])[0]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"param_dtype": self.param_dtype}


def spec_kind(spec: str) -> str:
    return "hf" if spec.startswith("hf:") else "py" if spec.startswith("py:") else "zoo"


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _config_int(config: Any, keys: tuple[str, ...]) -> int | None:
    for key in keys:
        value = getattr(config, key, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _class_name(model: nn.Module, train: TrainSpec) -> str:
    """The model's class; under --peft the wrapped class and the adapter, e.g.
    `LlamaForCausalLM + LoRA r=16`, `... + prefix tuning tokens=20` (not peft's PeftModel)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    quant = f" on {train.quant.base}" if train.quant.base != "none" else ""
    return f"{type(base).__name__}{adapter_label(model, train)}{quant}{float8_label(model, train)}"


def _adapted(model: nn.Module) -> dict[str, int]:
    """peft's tuner layers by their last name (`q_proj` -> 24): what an adapter wraps."""
    if not hasattr(model, "peft_config"):
        return {}
    from peft.tuners.tuners_utils import BaseTunerLayer  # deferred: peft is optional

    found: Counter[str] = Counter(
        name.rsplit(".", 1)[-1]
        for name, m in model.named_modules()
        if isinstance(m, BaseTunerLayer) and name
    )
    return dict(sorted(found.items()))


def _quantised_weights(model: nn.Module) -> dict[int, tuple[str, int]]:
    """id(weight) -> (format, logical parameters) of the `--quantize-base` stand-ins: a
    packed nf4 weight holds two parameters a byte."""
    return {
        id(m.weight): (
            "nf4" if isinstance(m, Linear4bitSim) else "int8",
            m.in_features * m.out_features,
        )
        for m in model.modules()
        if isinstance(m, QUANTIZED_TYPES)
    }


def describe(model: nn.Module, bundle: ModelBundle, train: TrainSpec) -> ModelInfo:
    """The identity of a built model (see the module docstring)."""
    params = list(model.parameters())  # unique: tied weights once
    quantised = _quantised_weights(model)
    numel = {id(p): quantised.get(id(p), ("", p.numel()))[1] for p in params}
    dtypes: Counter[str] = Counter()
    for p in params:
        dtypes[quantised.get(id(p), (_dtype_name(p.dtype),))[0]] += numel[id(p)]
    config = getattr(model, "config", None)
    autocast = train.numerics.autocast_dtype
    info = ModelInfo(
        spec=bundle.name,
        kind=bundle.origin or spec_kind(bundle.name),
        family=bundle.family,
        module_class=_class_name(model, train),
        parameters=sum(numel.values()),
        trainable_parameters=sum(p.numel() for p in params if p.requires_grad),
        parameter_bytes=sum(p.numel() * p.element_size() for p in params),
        buffer_bytes=sum(b.numel() * b.element_size() for b in model.buffers()),
        param_dtypes=dict(dtypes),
        precision=train.numerics.precision,
        blocks=len((bundle.blocks or default_blocks)(model)),
        layers=_config_int(config, _LAYER_KEYS),
        hidden=_config_int(config, _HIDDEN_KEYS),
        attention=getattr(config, "_attn_implementation", None),
        adapted=_adapted(model),
    )
    info.compute_dtype = _dtype_name(autocast) if autocast is not None else info.param_dtype
    if quantised and autocast is None:  # bnb_4bit_compute_dtype (predictor.emulate.quant)
        info.compute_dtype = _dtype_name(compute_dtype(train))
    gathered = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}.get(
        train.parallel.fsdp_param_dtype
    )
    if gathered is not None and autocast is None:  # FSDP's mixed precision: gathered dtype
        info.compute_dtype = _dtype_name(gathered)
    return info


def describe_bundle(bundle: ModelBundle, train: TrainSpec, target: str = "cuda") -> ModelInfo:
    """`describe` of the model built as capture builds it: on fake tensors, no weights."""
    return describe(fake_step(bundle, train, target).model, bundle, train)


def fake_step(bundle: ModelBundle, train: TrainSpec, target: str = "cuda") -> Any:
    """The `TrainingStep` capture would run, built on fake tensors (nothing allocated);
    for a sharded spec, the whole model (what one would describe), not one rank's wrap."""
    from memgnn.predictor.capture.step import TrainingStep
    from torch._subclasses.fake_tensor import FakeTensorMode

    if train.parallel.distributed:
        train = dataclasses.replace(train, parallel=ParallelSpec())
    with FakeTensorMode(allow_non_fake_inputs=True):
        return TrainingStep(bundle, train, device=torch.device("cpu"), target=target, fake=True)


def structure(model: nn.Module) -> dict[str, Any]:
    """Modules, parameters, buffers and config of a built module, as plain JSON data."""
    first_name: dict[int, str] = {}
    params = []
    for name, p in model.named_parameters(remove_duplicate=False):
        tied = first_name.setdefault(id(p), name)
        params.append(
            [
                name,
                list(p.shape),
                _dtype_name(p.dtype),
                p.requires_grad,
                tied if tied != name else "",
            ]
        )
    buffers = [
        [name, list(b.shape), _dtype_name(b.dtype)]
        for name, b in model.named_buffers(remove_duplicate=False)
    ]
    modules = [
        [name, f"{type(m).__module__}.{type(m).__qualname__}", m.extra_repr()]
        for name, m in model.named_modules(remove_duplicate=False)
    ]
    out: dict[str, Any] = {"modules": modules, "parameters": params, "buffers": buffers}
    config = getattr(model, "config", None)
    if config is not None and callable(getattr(config, "to_dict", None)):
        out["config"] = json.loads(json.dumps(config.to_dict(), sort_keys=True, default=str))
    return out


def module_classes(model: nn.Module) -> list[type]:
    """The distinct module classes of a model, in first-seen order."""
    return list(dict.fromkeys(type(m) for m in model.modules()))
