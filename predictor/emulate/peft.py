"""Any peft method, applied to a built model as `peft.get_peft_model` does it.

The method's config is peft's own class (`LoraConfig`, `IA3Config`, `PrefixTuningConfig`,
...) built from the spec (`AdapterSpec.config_fields`: the --lora-* options where the
method has those fields, `--peft-arg`s, `use_dora` for dora), and peft's own modules then
run in the step under capture, so every method peft implements is modelled by running it:
frozen base, the method's trainable weights (their gradients and optimizer states), what
its forward saves for backward.

What memgnn adds around peft:
- targets: `--lora-targets` names are checked against the model (a ValueError lists the
  names it has); for lora and dora, and over a quantised base, `all-linear` is expanded
  here (`lora.all_linear`: memgnn's quantised stand-ins are no nn.Linear for peft).
- prompt learning (prefix_tuning, prompt_tuning, p_tuning, cartridge) needs peft's
  task wrapper: its `task_type` is read from the model's class (`...ForCausalLM` ->
  CAUSAL_LM, ...) unless `--peft-arg task_type=...` names it. Methods that put virtual
  tokens in the sequence lengthen `labels` (peft pads them with -100); memgnn's causal-LM
  batches also carry `shift_labels` (see `predictor.zoo.hf`), lengthened here the same way
  (`_lengthen_shift_labels`) so the loss sees one sequence.
- two of peft's data-dependent steps fake tensors cannot take: LoHa's and LoKr's
  `torch.rand(1) > module_dropout` (whether an adapted module runs this step) is taken
  (`_keep_lycoris_modules`: exact at module_dropout 0, peft's default, where it is taken
  but with probability 2^-24; above 0 the answer is the step where no module is dropped,
  the largest); BOFT's permutation matrix, built element by element with a scalar read per
  element, is built in one `index_put` (`_fake_safe_boft`: the same matrix).
- dtypes: peft builds adapters in torch's default dtype, fp32 in a user's script that
  loads the model in bf16/fp16 with `torch_dtype=`: with `--lora-dtype fp32` (the default)
  it runs under fp32; adapter layers are then moved to the base layer's dtype and, with
  `autocast_adapter_dtype=True`, upcast to fp32 again; prompt encoders stay as built.
  `--lora-dtype model`: built in the model's dtype, not upcast.

peft is optional: imported here only when a spec asks for a method; a missing install is a
ValueError telling the user to install memgnn[peft].
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import torch
from memgnn.predictor.emulate.lora import all_linear, lora_targets, module_names
from memgnn.predictor.spec import peft_args
from memgnn.predictor.spec.choices import PEFT_PROMPTS
from memgnn.predictor.spec.train import TrainSpec
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor

logger = logging.getLogger(__name__)

__all__ = ["adapter_label", "apply_peft", "blocks_unsafe", "build_config", "task_type"]

# transformers class-name suffixes -> peft's TaskType (the wrapper prompt learning needs)
_TASKS = (
    ("ForCausalLM", "CAUSAL_LM"),
    ("ForConditionalGeneration", "SEQ_2_SEQ_LM"),
    ("ForSeq2SeqLM", "SEQ_2_SEQ_LM"),
    ("ForSequenceClassification", "SEQ_CLS"),
    ("ForTokenClassification", "TOKEN_CLS"),
    ("ForQuestionAnswering", "QUESTION_ANS"),
)
# prompt learning methods whose virtual tokens go into the input sequence (labels padded)
_IN_SEQUENCE = ("prompt_tuning", "p_tuning")
# fields that pick layers by index or by name pattern: a capture at fewer blocks adapts
# other layers than the model has
_LAYER_FIELDS = ("layers_to_transform", "layers_pattern", "layer_replication")
_NAMES = {
    "lora": "LoRA", "dora": "DoRA", "adalora": "AdaLoRA", "ia3": "IA3", "loha": "LoHa",
    "lokr": "LoKr", "vera": "VeRA", "oft": "OFT", "boft": "BOFT", "hra": "HRA",
    "fourierft": "FourierFT", "ln_tuning": "LN tuning", "prefix_tuning": "prefix tuning",
    "prompt_tuning": "prompt tuning", "p_tuning": "P-tuning", "miss": "MiSS",
}  # fmt: skip


def _import_peft() -> Any:
    try:
        import peft  # heavy optional dependency (memgnn[peft])
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ValueError("--peft needs the peft library: install memgnn[peft]") from exc
    return peft


def task_type(model: nn.Module) -> str:
    """peft's TaskType for a model, from its class name (FEATURE_EXTRACTION otherwise)."""
    name = type(model).__name__
    return next((task for suffix, task in _TASKS if name.endswith(suffix)), "FEATURE_EXTRACTION")


def _targets(model: nn.Module, train: TrainSpec) -> Any:
    """`--lora-targets` checked against the model (None: peft's default for it)."""
    targets = lora_targets(train)
    if targets == ["all-linear"]:
        expand = train.adapter.method in ("lora", "dora") or train.quant.base != "none"
        return all_linear(model) if expand else "all-linear"
    if targets is not None:
        have = set(module_names(model))
        leaves = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
        missing = [t for t in targets if t not in have and t not in leaves]
        if missing:
            raise ValueError(
                f"--lora-targets: {type(model).__name__} has no module named "
                f"{', '.join(missing)}; its Linear/Conv/Embedding module names: "
                f"{', '.join(sorted(have)) or 'none'}"
            )
    return targets


def build_config(model: nn.Module, train: TrainSpec) -> Any:
    """The method's peft config for `model` under `train`."""
    _import_peft()
    method = train.adapter.method
    fields = train.adapter.config_fields()
    if train.adapter.targets:
        fields["target_modules"] = _targets(model, train)
    if method in PEFT_PROMPTS and "task_type" not in fields:
        fields["task_type"] = task_type(model)
    try:
        return peft_args.config_class(method)(**fields)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"--peft {method}: {exc}") from exc


def apply_peft(model: nn.Module, train: TrainSpec) -> nn.Module:
    """`peft.get_peft_model(model, config)` for `train` (see the module docstring)."""
    peft = _import_peft()
    method = train.adapter.method
    config = build_config(model, train)
    if train.quant.base != "none":
        from memgnn.predictor.emulate.quant_lora import register_quant_layers

        register_quant_layers(config)
    default_targets = getattr(config, "target_modules", "") is None
    upcast = train.adapter.dtype == "fp32"
    dtype = torch.float32 if upcast else train.numerics.param_dtype
    try:
        with _fake_safe_adapter_moves(), _fake_safe_boft(), _default_dtype(dtype):
            wrapped: Any = peft.get_peft_model(model, config, autocast_adapter_dtype=upcast)
    except (ValueError, TypeError, AttributeError, KeyError) as exc:
        hint = ""
        if default_targets:
            hint = f"; name them with --lora-targets (modules: {', '.join(module_names(model))})"
        raise ValueError(f"--peft {method} on {type(model).__name__}: {exc}{hint}") from exc
    _keep_lycoris_modules(wrapped)
    if method in _IN_SEQUENCE:
        wrapped.register_forward_pre_hook(_lengthen_shift_labels, with_kwargs=True)
    trainable = sum(p.numel() for p in wrapped.parameters() if p.requires_grad)
    logger.debug("%s: %d trainable parameters", adapter_label(wrapped, train), trainable)
    return wrapped


def _lengthen_shift_labels(module: nn.Module, args: tuple, kwargs: dict) -> tuple | None:
    """A batch's `shift_labels` for the sequence with the virtual tokens in front: peft
    pads `labels` with T x -100 in front, so their shift is T-1 x -100, the labels, one
    -100 (what transformers' loss would derive from the padded labels)."""
    shift, labels = kwargs.get("shift_labels"), kwargs.get("labels")
    if shift is None or labels is None:
        return None
    tokens = module.active_peft_config.num_virtual_tokens
    b = labels.shape[0]
    pad = torch.full((b, tokens - 1), -100, dtype=labels.dtype, device=labels.device)
    end = torch.full((b, 1), -100, dtype=labels.dtype, device=labels.device)
    return args, kwargs | {"shift_labels": torch.cat([pad, labels, end], dim=1)}


def blocks_unsafe(train: TrainSpec) -> str | None:
    """Why a capture at fewer blocks, replicated, would not be this method's step (None:
    it may be tried; `predictor.capture.replicate` checks the rest)."""
    method = train.adapter.method
    if method in ("prefix_tuning", "cartridge"):
        return f"--peft {method}: its prompt encoder is sized by the number of layers"
    args = peft_args.args_dict(train.adapter.args)
    named = [k for k in args if k in _LAYER_FIELDS or k.endswith("_pattern")]
    if isinstance(args.get("target_modules"), str) and args["target_modules"] != "all-linear":
        named.append("target_modules (a pattern)")
    if named:
        return f"--peft-arg {', '.join(named)} picks layers by index or name"
    return None


def adapter_label(model: nn.Module, train: TrainSpec) -> str:
    """` + DoRA r=16`-like: the method and the size peft resolved (its config's r, or the
    virtual tokens); "" without an adapter."""
    method = train.adapter.method
    if method == "none":
        return ""
    if method == "lora":
        return f" + LoRA r={train.adapter.r}"
    name = _NAMES.get(method, method.upper())
    config = getattr(model, "peft_config", {}).get("default")
    if config is None:
        return f" + {name}"
    for field in ("r", "num_virtual_tokens", "n_frequency", "oft_block_size", "boft_block_size"):
        value = getattr(config, field, None)
        if isinstance(value, int) and value:
            short = {"num_virtual_tokens": "tokens"}.get(field, field)
            return f" + {name} {short}={value}"
    return f" + {name}"


class _AdapterKept:
    """A LyCORIS layer's `module_dropout` p, for which `torch.rand(1) > p` is True (the
    reflected comparison answers it): the adapted module runs (see the module docstring)."""

    __slots__ = ("p",)

    def __init__(self, p: float) -> None:
        self.p = float(p)

    def __lt__(self, other: Any) -> bool:
        return True

    def __float__(self) -> float:
        return self.p

    def __repr__(self) -> str:
        return repr(self.p)


def _keep_lycoris_modules(model: nn.Module) -> None:
    from peft.tuners.lycoris_utils import LycorisLayer

    for m in model.modules():
        if isinstance(m, LycorisLayer):
            for name, p in m.module_dropout.items():
                if not isinstance(p, _AdapterKept):
                    m.module_dropout[name] = _AdapterKept(p)


def _perm2mat(self: Any, indices: Any) -> torch.Tensor:
    """`BOFTLayer.perm2mat`: the n x n matrix with a 1 at (i, indices[i])."""
    indices = torch.as_tensor(indices, dtype=torch.long)
    n = len(indices)
    perm_mat = torch.zeros((n, n))
    perm_mat[torch.arange(n), indices] = 1
    return perm_mat


@contextlib.contextmanager
def _fake_safe_boft() -> Iterator[None]:
    from peft.tuners.boft.layer import BOFTLayer

    original = BOFTLayer.perm2mat
    BOFTLayer.perm2mat = _perm2mat  # type: ignore[method-assign]
    try:
        yield
    finally:
        BOFTLayer.perm2mat = original  # type: ignore[method-assign]


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def _recast(module: nn.Module, dtype: torch.dtype) -> None:
    """Floating parameters and buffers of `module` rebuilt in `dtype` (no-op where equal)."""
    for m in module.modules():
        for name, p in m._parameters.items():
            if p is not None and p.is_floating_point() and p.dtype != dtype:
                m._parameters[name] = nn.Parameter(p.detach().to(dtype), p.requires_grad)
        for name, b in m._buffers.items():
            if b is not None and b.is_floating_point() and b.dtype != dtype:
                m._buffers[name] = b.to(dtype)


@contextlib.contextmanager
def _fake_safe_adapter_moves() -> Iterator[None]:
    """peft moves each new adapter to its base layer's device and dtype with `Module.to`,
    which (torch 2.13) swaps FakeTensor parameters and fails on the weakrefs the fake mode
    holds. The step builds adapters on the base's device already, so on fake tensors that
    move is a cast at most: while peft wraps the model, a `Module.to` whose tensors are all
    fake and already on the device it asks recasts them in place and returns the module."""
    original = nn.Module.to

    def to(self: nn.Module, *args: Any, **kwargs: Any) -> nn.Module:
        device, dtype, _, _ = torch._C._nn._parse_to(*args, **kwargs)
        tensors = [*self.parameters(), *self.buffers()]
        if tensors and all(
            isinstance(t, FakeTensor) and (device is None or t.device == device) for t in tensors
        ):
            if dtype is not None:
                _recast(self, dtype)
            return self
        return original(self, *args, **kwargs)

    nn.Module.to = to  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.to = original  # type: ignore[method-assign]
