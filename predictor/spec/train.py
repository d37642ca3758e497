"""How one training step runs: the training spec, nested by concern (torchtitan's style).

    TrainSpec
      numerics     NumericsSpec(precision, float8, float8_filter_fqns, float8_fsdp_all_gather,
                   float8_precompute_scale)
      optim        OptimSpec(name, impl, lr, set_to_none)
      activations  ActivationSpec(checkpointing)
      kernels      KernelSpec(attention, compile, loss)
      adapter      AdapterSpec(method, r, alpha, dropout, targets, dtype, args, config)
      quant        QuantSpec(base, bnb_version, quant_storage)
      parallel     ParallelSpec(gpus, sharding, reshard_after_forward, hsdp_shard_size, tp, pp,
                                pp_schedule, microbatches, grad_sync,
                                fsdp1_*: FSDP1's own arguments, fsdp_*_dtype: its MixedPrecision)
      loop         LoopSpec(grad_accum, steps, hold_outputs)
      offload      OffloadSpec(activations, optimizer, gradients)

Each leaf is declared once with `opt` (`predictor.spec.options`): its default, its flat
option name (the CLI flag's dest, the key of a record), its help and allowed values;
`OPTIONS` lists them. Each group checks its own fields in `__post_init__`; `TrainSpec`
checks the rules across groups. `TrainSpec.of(precision="bf16", lora_r=16)` builds one
from flat options, `flat()` gives them back (the form graphs and corpus records store),
`to_dict()` is the nested form answers show. Defaults are what a plain PyTorch loop does.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from memgnn.predictor.ir.vocab import SHARDINGS
from memgnn.predictor.spec import peft_args
from memgnn.predictor.spec.choices import (
    ATTENTIONS,
    BNB_4BIT_INPUT_FIX,
    BNB_FIRST_4BIT,
    BNB_INT8_REWRITE,
    BNB_VERSION,
    COMPILES,
    FLOAT8_RECIPES,
    FSDP1_BACKWARD_PREFETCHES,
    FSDP1_STRATEGIES,
    FSDP1_WRAPS,
    FSDP_DTYPES,
    GRAD_SYNCS,
    LORA_DTYPES,
    OFFLOAD_ACTIVATIONS,
    OFFLOAD_OPTIMIZERS,
    OPTIMIZER_IMPLS,
    PEFT_BNB_LAYERS,
    PEFT_METHODS,
    PEFT_NOT_MODELLED,
    PEFT_ON_QUANTIZED,
    PP_MULTI_STAGE,
    PP_SCHEDULES,
    PP_SCHEDULES_MODELLED,
    PP_SHARDINGS,
    PRECISIONS,
    QUANT_STORAGES,
    QUANTIZE_BASES,
    STEP_KINDS,
    TP_SHARDINGS,
    bnb_version_tuple,
)
from memgnn.predictor.spec.optimizer_names import OPTIMIZER_PATTERN, check_optimizer
from memgnn.predictor.spec.options import Option, group_options, opt

__all__ = [
    "OPTIONS",
    "ActivationSpec",
    "AdapterSpec",
    "KernelSpec",
    "LoopSpec",
    "NumericsSpec",
    "OffloadSpec",
    "OptimSpec",
    "ParallelSpec",
    "QuantSpec",
    "TrainSpec",
]

# none | full | blocks:N (memgnn's wrapper around the first N blocks) | every:N (every N-th
# block: the N-th, 2N-th, ...; torchtitan's selective_ac_option N) | selective-op (every block
# under torchtitan's op-level selective policy, `emulate.selective`) | hf (transformers' own
# gradient checkpointing of every decoder layer, non-reentrant)
_CKPT_RE = re.compile(r"^(none|full|hf|selective-op|blocks:(\d+)|every:([1-9]\d*))$")
# --float8-filter-fqns: comma-separated module-name substrings (may be empty)
_FQNS_PATTERN = r"^([A-Za-z0-9_.]+(,[A-Za-z0-9_.]+)*)?$"
# --loss: the model's own, or torchtune's chunked cross entropy over N chunks
_LOSS_PATTERN = r"^(model|chunked-ce:([0-9]{1,4}))$"


def _choice(value: Any, choices: tuple, what: str) -> None:
    if value not in choices:
        raise ValueError(f"unknown {what} {value!r}; expected one of {choices}")


@dataclass(kw_only=True, slots=True)
class NumericsSpec:
    """The dtypes of the step: parameters (the master weights) and compute."""

    precision: str = opt(
        "fp32", name="precision", choices=PRECISIONS,
        help="fp32; bf16/fp16: weights, gradients and optimizer states in that dtype, no "
        "fp32 master copy; amp-bf16/amp-fp16: fp32 master weights, autocast compute",
    )  # fmt: skip

    # torchao's float8 training (`emulate.float8`): Linear layers swapped for Float8Linear
    # with the recipe's casts (torchtitan's float8 converter)
    float8: str = opt(
        "none", name="float8", choices=FLOAT8_RECIPES,
        help="torchao float8 training: Linear layers become Float8Linear with this recipe "
        "(convert_to_float8_training; skips the output head and Linears with a dim not "
        "divisible by 16, as torchtitan does)",
    )  # fmt: skip
    float8_filter_fqns: str = opt(
        "output", name="float8_filter_fqns", pattern=_FQNS_PATTERN, max_length=400,
        help="--float8: comma-separated module-name substrings to keep out of float8 "
        "(torchtitan's filter_fqns); 'output' means the output head (lm_head / output)",
    )  # fmt: skip
    # torchao's FSDP2 extension (`Float8LinearConfig.enable_fsdp_float8_all_gather`): the
    # weights are cast to float8 before the all-gather (one byte an element gathered and
    # unsharded), and torchtitan's `precompute_float8_dynamic_scale_for_fsdp` after the
    # optimizer step (one all-reduce of every weight's amax)
    float8_fsdp_all_gather: bool = opt(
        False, name="float8_fsdp_all_gather", cli="bool",
        help="--float8 tensorwise with --sharding fsdp|hsdp: FSDP2 all-gathers the weights "
        "in float8 (torchao's enable_fsdp_float8_all_gather): the unsharded weights are "
        "float8 with a scale, the sharded ones stay in the training dtype",
    )  # fmt: skip
    float8_precompute_scale: bool = opt(
        False, name="float8_precompute_scale", cli="bool",
        help="--float8-fsdp-all-gather: compute every weight's float8 scale after the "
        "optimizer step in one all-reduce (torchtitan's "
        "precompute_float8_dynamic_scale_for_fsdp) instead of one per weight in each "
        "all-gather",
    )  # fmt: skip

    def __post_init__(self) -> None:
        _choice(self.precision, PRECISIONS, "precision")
        _choice(self.float8, FLOAT8_RECIPES, "--float8")
        if not re.fullmatch(_FQNS_PATTERN, self.float8_filter_fqns):
            raise ValueError(
                f"--float8-filter-fqns {self.float8_filter_fqns!r}: comma-separated module "
                "names (letters, digits, _ and .)"
            )
        if self.float8 == "none" and self.float8_filter_fqns != "output":
            raise ValueError("--float8-filter-fqns applies to --float8 tensorwise|rowwise|...")
        if self.float8_fsdp_all_gather and self.float8 != "tensorwise":
            raise ValueError(
                f"--float8-fsdp-all-gather applies to --float8 tensorwise, not {self.float8} "
                "(torchao casts a weight to float8 before the all-gather with one scale per "
                "tensor only)"
            )
        if self.float8_precompute_scale and not self.float8_fsdp_all_gather:
            raise ValueError(
                "--float8-precompute-scale applies to --float8-fsdp-all-gather true "
                "(torchtitan precomputes the scales of the weights FSDP gathers in float8)"
            )
        if self.float8 != "none" and self.precision in ("fp16", "amp-fp16"):
            raise ValueError(
                f"--float8 {self.float8} with --precision {self.precision} is not modelled: "
                "torchao's float8 training runs from bf16 or fp32 (torchtitan: bf16 compute)"
            )

    @property
    def float8_filters(self) -> tuple[str, ...]:
        """--float8-filter-fqns as a tuple of substrings."""
        return tuple(f for f in self.float8_filter_fqns.split(",") if f)

    @property
    def param_dtype(self) -> torch.dtype:
        return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.precision, torch.float32)

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        return {"amp-bf16": torch.bfloat16, "amp-fp16": torch.float16}.get(self.precision)

    @property
    def uses_grad_scaler(self) -> bool:
        return self.precision == "amp-fp16"


@dataclass(kw_only=True, slots=True)
class OptimSpec:
    """The optimizer and how its step and zero_grad run."""

    name: str = opt(
        "adamw", name="optimizer", pattern=OPTIMIZER_PATTERN, max_length=80,
        help="sgd (momentum 0.9), adam, adamw, adafactor, adamw8bit (bitsandbytes'); any "
        "torch.optim class by name (torch.optim.RMSprop: its defaults); bitsandbytes' "
        "bnb.PagedAdamW8bit, bnb.PagedAdamW, bnb.Lion8bit, ...; torchao.AdamW8bit, "
        "torchao.AdamW4bit, torchao.AdamWFp8; lion_pytorch.Lion",
    )  # fmt: skip
    impl: str = opt(
        "auto", name="optimizer_impl", choices=OPTIMIZER_IMPLS,
        help="auto: what PyTorch picks for the target device; foreach, fused or for-loop",
    )  # fmt: skip
    lr: float = opt(1e-3, name="lr", cli="none", lo=0, lo_open=True, hi=1e6,
                    help="learning rate (no memory effect)")  # fmt: skip
    set_to_none: bool = opt(
        True, name="set_to_none", flag="--zero-grad", cli_values={"none": True, "zero": False},
        help="zero_grad(set_to_none=True) ('none', the default) or keep zeroed grads ('zero')",
    )  # fmt: skip
    # torchtune's optimizer_in_bwd: one optimizer per parameter, stepped in the parameter's
    # post-accumulate-grad hook, which then frees the gradient (`emulate.optimizers`)
    in_backward: bool = opt(
        False, name="optimizer_in_bwd", cli="switch",
        help="the optimizer steps inside backward, each parameter in its post-accumulate-"
        "grad hook, its gradient freed at once (torchtune's optimizer_in_bwd)",
    )  # fmt: skip

    def __post_init__(self) -> None:
        check_optimizer(self.name, self.impl)
        if not isinstance(self.in_backward, bool):
            raise ValueError(f"--optimizer-in-bwd must be true or false, got {self.in_backward!r}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")


@dataclass(kw_only=True, slots=True)
class ActivationSpec:
    """What the step keeps of its activations for backward."""

    checkpointing: str = opt(
        "none", name="checkpointing",
        pattern=r"^(none|full|hf|selective-op|blocks:[0-9]{1,6}|every:[1-9][0-9]{0,5})$",
        help="none | full | blocks:N (the first N blocks) | every:N (every N-th block, the "
        "last of each N: torchtitan's selective_ac_option N) | selective-op (every block, "
        "torchtitan's op-level selective policy: mm outputs but every second, attention, "
        "max and reduce-scatter saved, the rest recomputed) | hf (transformers' own, every "
        "layer)",
    )  # fmt: skip

    def __post_init__(self) -> None:
        if not isinstance(self.checkpointing, str) or not _CKPT_RE.match(self.checkpointing):
            raise ValueError(
                f"bad checkpointing {self.checkpointing!r}; expected none, full, hf, "
                "selective-op, blocks:N or every:N (N >= 1)"
            )

    @property
    def checkpoint_blocks(self) -> int | None:
        """None: no checkpointing; -1: every block wrapped (full, hf, selective-op,
        every:1); N: the first N blocks; every:N (N > 1): -N (`checkpointed` says which)."""
        if self.checkpointing == "none":
            return None
        if self.checkpointing in ("full", "hf", "selective-op", "every:1"):
            return -1
        n = int(self.checkpointing.split(":", 1)[1])
        return -n if self.checkpointing.startswith("every:") else n

    @property
    def selective(self) -> bool:
        """torchtitan's op-level selective checkpointing (`emulate.selective`)."""
        return self.checkpointing == "selective-op"

    def checkpointed(self, n_blocks: int) -> list[int]:
        """Indices of the blocks wrapped in checkpointing, of `n_blocks` (hf: every layer,
        by transformers' own wrapper). every:N is torchtitan's `_apply_layer_sac`: a
        counter from 1 over the blocks, the block checkpointed where it is a multiple of N
        (blocks N-1, 2N-1, ...: the last block is one when N divides the depth)."""
        ck = self.checkpoint_blocks
        if ck is None:
            return []
        if ck == -1:
            return list(range(n_blocks))
        if ck < 0:
            return [i for i in range(n_blocks) if (i + 1) % -ck == 0]
        return list(range(min(ck, n_blocks)))


@dataclass(kw_only=True, slots=True)
class KernelSpec:
    """Which kernels run the model's ops where the choice changes memory."""

    attention: str = opt(
        "auto", name="attention", choices=ATTENTIONS,
        help="HF attn_implementation: eager | sdpa | flash (flash_attention_2, CUDA sm80+); "
        "auto: the model class's default",
    )  # fmt: skip
    compile: str = opt(
        "none", name="compile", choices=COMPILES,
        help="torch.compile (inductor): none | full (the whole model) | blocks (each repeated "
        "block, regional compilation as torchtune/torchtitan apply it)",
    )  # fmt: skip
    compile_dynamic: bool = opt(
        True, name="compile_dynamic", cli="bool",
        help="with --compile: true: inductor lowers with symbolic batch and sequence sizes "
        "(torch.compile(dynamic=True), or after a recompile under automatic dynamic shapes): "
        "one capture answers every size; false: a static-shape compile (torch.compile's "
        "first compile of fixed shapes): the capture is fixed to its sizes, another size "
        "captures anew",
    )  # fmt: skip
    compile_loss: bool = opt(
        False, name="compile_loss", cli="bool",
        help="with --compile blocks: the model's loss compiled too (torchtune's compile_loss, "
        "torchtitan's compile.components 'loss'): transformers' loss_function (upcast, shift, "
        "cross entropy) as one compiled region",
    )  # fmt: skip

    # how the loss is computed from the model's last hidden states (`emulate.loss`)
    loss: str = opt(
        "model", name="loss", pattern=_LOSS_PATTERN, max_length=24,
        help="model: the model's own loss; chunked-ce:N: torchtune's CEWithChunkedOutputLoss "
        "(num_output_chunks=N): the output head on each of N chunks of the sequence, cross "
        "entropy per chunk upcast to fp32 and summed (under --compile blocks each chunk's "
        "cross entropy is compiled, as torchtune's compile_loss); causal LMs",
    )  # fmt: skip

    def __post_init__(self) -> None:
        _choice(self.attention, ATTENTIONS, "--attention")
        _choice(self.compile, COMPILES, "--compile")
        m = re.fullmatch(_LOSS_PATTERN, self.loss)
        if m is None or (m[2] is not None and not 1 <= int(m[2]) <= 1024):
            raise ValueError(
                f"--loss {self.loss!r}: expected model or chunked-ce:N (N chunks, 1..1024)"
            )

    @property
    def loss_chunks(self) -> int | None:
        """--loss chunked-ce:N -> N; None: the model's own loss."""
        return None if self.loss == "model" else int(self.loss.split(":", 1)[1])


@dataclass(kw_only=True, slots=True)
class AdapterSpec:
    """Parameter-efficient fine-tuning through the peft library (`emulate.peft`).

    `method` is any peft method (`choices.PEFT_METHODS`); `args` its config's own fields
    (`predictor.spec.peft_args`: a canonical JSON object text); `config` a saved PEFT
    config, resolved here into `method` and `args` and then cleared, so a spec never holds
    a path. The --lora-* options set the fields of that name where the method has them
    (r; lora_alpha / alpha / <method>_alpha; lora_dropout / <method>_dropout;
    target_modules): always for lora and dora (their defaults are memgnn's), for the
    other methods only away from their defaults (else peft's default stands)."""

    method: str = opt(
        "none", name="peft", choices=PEFT_METHODS,
        help="a peft method: lora, dora, ia3, loha, lokr, vera, oft, boft, adalora, "
        "prefix_tuning, prompt_tuning, p_tuning, ln_tuning, ...",
    )  # fmt: skip
    r: int = opt(8, name="lora_r", lo=1, hi=65_536, help="LoRA rank (r of other methods)")
    alpha: float = opt(16.0, name="lora_alpha", lo=0, lo_open=True, hi=1e6, help="LoRA alpha")
    dropout: float = opt(0.0, name="lora_dropout", lo=0, hi=1, hi_open=True,
                         help="LoRA dropout (peft's LoraConfig default 0)")  # fmt: skip
    targets: str = opt("", name="lora_targets", max_length=4096,
                       help="q_proj,v_proj,...; default: peft's for the model")  # fmt: skip
    # fp32 = peft's default (get_peft_model(autocast_adapter_dtype=True) upcasts bf16/fp16
    # adapters and each adapted input with them); model = the base model's dtype
    # (autocast_adapter_dtype=False; LitGPT's own LoRA under bf16-true)
    dtype: str = opt(
        "fp32", name="lora_dtype", choices=LORA_DTYPES,
        help="adapters in fp32 (peft's default upcast) or in the model's dtype (LitGPT's LoRA)",
    )  # fmt: skip
    # --- peft methods beyond LoRA (issue 23): the method's config fields, a saved config
    args: str = opt(
        "", name="peft_args", flag="--peft-arg", cli="append", max_length=16_384,
        help="a field of the --peft method's peft config, NAME=VALUE (repeatable; VALUE read "
        "as JSON where it parses: 20, true, [\"q_proj\"]); records keep one JSON object",
    )  # fmt: skip
    config: str = opt(
        "", name="peft_config", max_length=4096, pattern=r"^$",
        help="a saved PEFT config (adapter_config.json or its folder): its peft_type sets "
        "--peft and its fields --peft-arg (a --peft-arg overrides one); read once, not kept",
    )  # fmt: skip

    def __post_init__(self) -> None:
        if self.method in PEFT_NOT_MODELLED:
            why = PEFT_NOT_MODELLED[self.method]
            raise ValueError(f"--peft {self.method} is not modelled: {why}")
        _choice(self.method, PEFT_METHODS, "--peft")
        self.args = peft_args.args_text(self.args)
        if self.config:
            self._read_config()
        if self.method == "none" and self.args:
            raise ValueError("--peft-arg needs --peft METHOD")
        if self.method != "none":
            self._fold_lora_fields()
        if self.r < 1:
            raise ValueError(f"--lora-r must be >= 1, got {self.r}")
        if not self.alpha > 0:
            raise ValueError(f"--lora-alpha must be > 0, got {self.alpha}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"--lora-dropout must be in [0, 1), got {self.dropout}")
        _choice(self.dtype, LORA_DTYPES, "--lora-dtype")
        if self.dtype != "fp32" and self.method == "none":
            raise ValueError(
                f"--lora-dtype {self.dtype} applies to --peft lora (or another method), "
                "not to --peft none"
            )
        if self.method not in ("none", "lora", "dora") or self.args:
            typed = peft_args.args_dict(self.args)
            peft_args.check_args(self.method, self.config_fields(), typed)

    def _read_config(self) -> None:
        """`config` (a path, or a saved config's mapping) -> method and args."""
        source: Any = self.config
        method, saved = peft_args.read_saved_config(source)
        # --peft lora with a DoRA config is DoRA (predictor.frameworks' reader says lora)
        if self.method not in ("none", method) and (self.method, method) != ("lora", "dora"):
            named = source if isinstance(source, str) else "(a saved config)"
            raise ValueError(
                f"--peft {self.method} but --peft-config {named} is a {method} config: give one"
            )
        self.method = method
        self.args = peft_args.args_text(saved | peft_args.args_dict(self.args))
        self.config = ""

    def _fold_lora_fields(self) -> None:
        """An arg the --lora-* options carry moves into them (one spelling per setting, so
        `--peft-arg r=16` and `--lora-r 16` make the same spec); a --lora-* option away
        from its default on a method without that field is refused."""
        args = peft_args.args_dict(self.args)
        always = self.method in ("lora", "dora")
        for option, check in _LORA_CHECKS.items():
            default = _ADAPTER_DEFAULTS[option]
            current = getattr(self, option)
            flag = "--" + _LORA_OPTION_NAMES[option].replace("_", "-")
            if not always and current == default and not _has_candidate(self.method, args):
                continue
            field = peft_args.lora_option_field(self.method, option)
            if field is None:
                if current != default:
                    raise ValueError(
                        f"{flag} {current}: --peft {self.method} has no such field "
                        f"({', '.join(peft_args.known_fields(self.method))}); use --peft-arg"
                    )
                continue
            if field not in args:
                continue
            value = check(args[field], field)
            if value is None:  # not what the option holds (a regex target): stays an arg
                if current != default:
                    raise ValueError(f"{flag} {current} and {field} (--peft-arg): give one")
                continue
            if current != default and current != value:
                raise ValueError(
                    f"{flag} {current} and {field}={args[field]!r} (--peft-arg or "
                    "--peft-config): give one"
                )
            if value == default and not always:
                continue  # explicit, and equal to memgnn's default: only the arg says so
            setattr(self, option, value)
            del args[field]
        self.args = peft_args.args_text(args)

    def config_fields(self) -> dict[str, Any]:
        """The peft config fields this spec sets (targets as named, not yet matched
        against a model): what `emulate.peft` builds the method's config from."""
        out: dict[str, Any] = {}
        always = self.method in ("lora", "dora")
        for option in _LORA_CHECKS:
            value = getattr(self, option)
            if not always and value == _ADAPTER_DEFAULTS[option]:
                continue
            field = peft_args.lora_option_field(self.method, option)
            if field is None:
                continue
            if option == "targets":
                names = [t.strip() for t in value.split(",") if t.strip()]
                value = None if not names else "all-linear" if names == ["all-linear"] else names
            out[field] = value
        if self.method == "dora":
            out["use_dora"] = True
        return out | peft_args.args_dict(self.args)


def _as_rank(value: Any, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"--peft-arg {field} must be an integer >= 1, got {value!r}")
    return value


def _as_alpha(value: Any, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"--peft-arg {field} must be a number > 0, got {value!r}")
    return float(value)


def _as_dropout(value: Any, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1:
        raise ValueError(f"--peft-arg {field} must be a number in [0, 1), got {value!r}")
    return float(value)


def _as_targets(value: Any, field: str) -> str | None:
    """Module names (a list, or all-linear) -> the --lora-targets text; None: a regex or
    another form --lora-targets does not hold (it stays an arg)."""
    if value == "all-linear":
        return value
    if (
        isinstance(value, list)
        and value
        and all(isinstance(v, str) and v.isidentifier() for v in value)
    ):
        return ",".join(value)
    return None


_LORA_CHECKS = {"r": _as_rank, "alpha": _as_alpha, "dropout": _as_dropout, "targets": _as_targets}
_LORA_OPTION_NAMES = {"r": "lora_r", "alpha": "lora_alpha", "dropout": "lora_dropout",
                      "targets": "lora_targets"}  # fmt: skip
_ADAPTER_DEFAULTS = {f.name: f.default for f in dataclasses.fields(AdapterSpec)}


def _has_candidate(method: str, args: Mapping[str, Any]) -> bool:
    """Whether an arg might be one a --lora-* option carries (before peft is imported)."""
    names = {"r", "lora_alpha", "alpha", "lora_dropout", "target_modules"}
    return any(k in names or k in (f"{method}_alpha", f"{method}_dropout") for k in args)


@dataclass(kw_only=True, slots=True)
class QuantSpec:
    """A bitsandbytes-quantised frozen base (QLoRA; `emulate.quant`)."""

    # nf4 = Linear4bit NF4 (BitsAndBytesConfig's default, LitGPT's bnb.nf4), nf4-dq = with
    # double quantisation (bnb_4bit_use_double_quant, LitGPT's bnb.nf4-dq), int8 = LLM.int8()
    base: str = opt(
        "none", name="quantize_base", choices=QUANTIZE_BASES,
        help="QLoRA: the frozen base's Linears in bitsandbytes nf4 (nf4-dq: double quant) "
        "or int8; GPU devices, with --peft lora",
    )  # fmt: skip
    # the bitsandbytes release whose kernels run the quantised base: before 0.43.2 every
    # 4-bit matmul kept its input as `ctx.tensors` until its autograd graph was freed
    bnb_version: str = opt(
        BNB_VERSION, name="bnb_version", max_length=16,
        help=f"bitsandbytes release of --quantize-base's kernels (default {BNB_VERSION}); "
        "before 0.43.2 every 4-bit matmul kept its input until the graph was freed",
    )  # fmt: skip
    # bnb_4bit_quant_storage: the packed codes' dtype (same bytes); a float storage is what
    # FSDP-QLoRA needs (fsdp_qlora, HF's FSDP-QLoRA): FSDP1 flattens a unit's weights into
    # one FlatParameter of one dtype, and accelerate's FSDP2 leaves uint8 codes unsharded
    quant_storage: str = opt(
        "uint8", name="bnb_quant_storage", choices=QUANT_STORAGES,
        help="--quantize-base nf4/nf4-dq: dtype the 4-bit codes are stored in "
        "(bnb_4bit_quant_storage; bf16 for FSDP-QLoRA)",
    )  # fmt: skip

    def __post_init__(self) -> None:
        _choice(self.base, QUANTIZE_BASES, "--quantize-base")
        _choice(self.quant_storage, QUANT_STORAGES, "--bnb-quant-storage")
        if self.quant_storage != "uint8" and self.base not in ("nf4", "nf4-dq"):
            raise ValueError(
                f"--bnb-quant-storage {self.quant_storage} applies to --quantize-base nf4 or "
                f"nf4-dq (the 4-bit codes' storage), not {self.base}"
            )
        version = bnb_version_tuple(self.bnb_version)
        if self.bnb_version != BNB_VERSION and self.base == "none":
            raise ValueError(
                f"--bnb-version {self.bnb_version} applies to --quantize-base nf4|nf4-dq|int8 "
                "(the quantised base's kernels)"
            )
        if self.base != "none" and version < BNB_FIRST_4BIT:
            raise ValueError(
                f"--bnb-version {self.bnb_version}: bitsandbytes' 4-bit storage came in 0.39.0"
            )
        if self.base == "int8" and version < BNB_INT8_REWRITE:
            raise ValueError(
                f"--bnb-version {self.bnb_version} with --quantize-base int8 is not modelled: "
                "LLM.int8 before bitsandbytes 0.45.0 ran col32 / tiled layouts (other "
                "temporaries); memgnn models 0.45.0 and later"
            )

    @property
    def keeps_input(self) -> bool:
        """4-bit matmuls keep their input alive with their graph node (bitsandbytes < 0.43.2:
        `MatMul4Bit` stored `ctx.tensors = (A, B)`; backward never reads A)."""
        return (
            self.base in ("nf4", "nf4-dq")
            and bnb_version_tuple(self.bnb_version) < BNB_4BIT_INPUT_FIX
        )


@dataclass(kw_only=True, slots=True)
class ParallelSpec:
    """Data, tensor and pipeline parallelism and sharding (`emulate.parallel`,
    `emulate.tensor_parallel`, `emulate.pipeline`): the answer is one rank's peak."""

    gpus: int = opt(1, name="gpus", lo=1, hi=65_536, help="world size; the answer is one rank's")
    sharding: str = opt("none", name="sharding", choices=SHARDINGS, help="how ranks split")
    reshard_after_forward: bool = opt(
        True, name="fsdp_reshard_after_forward", cli="bool",
        help="fsdp/hsdp: free all-gathered parameters after forward (default true; with "
        "--pp, torchtitan's default policy is false)",
    )  # fmt: skip
    fsdp_cpu_offload: bool = opt(
        False, name="fsdp_cpu_offload", cli="bool",
        help="fsdp: FSDP2 CPUOffloadPolicy() (torchtune's fsdp_cpu_offload): parameter and "
        "gradient shards in pinned host memory, the optimizer steps on the CPU (its state in "
        "host memory); the answer gives the device peak and the host bytes apart",
    )  # fmt: skip
    hsdp_shard_size: int = opt(0, name="hsdp_shard_size", lo=0, hi=65_536,
                               help="hsdp: ranks per shard group (0: the default)")  # fmt: skip
    # tensor parallelism (predictor/emulate/tensor_parallel.py): DTensor parallelize_module
    # with the model's TP plan over `tp` ranks; --gpus = data-parallel ranks x tp
    tp: int = opt(
        1, name="tp", lo=1, hi=65_536,
        help="tensor-parallel degree: each block's linears split over this many ranks "
        "(PyTorch's ColwiseParallel/RowwiseParallel, the model's tp plan); --gpus is "
        "data-parallel ranks x --tp (--sharding none: --gpus = --tp; fsdp: 2-D, FSDP2 "
        "over --gpus/--tp ranks; x --pp with pipeline stages)",
    )  # fmt: skip
    # pipeline parallelism (predictor/emulate/pipeline.py): torch.distributed.pipelining's
    # PipelineStage + schedule, each stage (L/pp blocks) on one rank (--gpus = --pp), or
    # split by --tp and/or sharded by FSDP2 over dp ranks (--sharding fsdp, --gpus = --pp x
    # dp x tp: torchtitan's (pp, dp_shard, tp) mesh)
    pp: int = opt(
        1, name="pp", lo=1, hi=4_096,
        help="pipeline-parallel degree (torchtitan's pipeline_parallel_degree): the blocks "
        "split evenly into this many stages (the first with the embeddings, the last with "
        "the final norm, lm_head and loss); the answer is the worst stage's peak, every "
        "stage's listed; --sharding none: one stage per rank, --gpus = --pp; --sharding "
        "fsdp: each stage sharded by FSDP2 over dp >= 2 ranks, --gpus = --pp x dp "
        "(torchtitan's PP x FSDP); with --tp T each stage's linears split over T ranks "
        "too (--gpus = --pp x dp x T)",
    )  # fmt: skip
    pp_schedule: str = opt(
        "1f1b", name="pp_schedule", choices=PP_SCHEDULES,
        help="--pp: the schedule (torchtitan's pipeline_parallel_schedule): gpipe "
        "(ScheduleGPipe), 1f1b (Schedule1F1B) or interleaved1f1b (ScheduleInterleaved1F1B, "
        "two stages per rank: ranks r and r + pp, torchtitan's default); the looped, "
        "zero-bubble and V schedules are not modelled yet",
    )  # fmt: skip
    microbatches: int = opt(
        0, name="microbatches", lo=0, hi=65_536,
        help="--pp: micro-batches per step, each of --batch samples (torchtitan: "
        "local_batch_size / pipeline_parallel_microbatch_size); 0: as many as --pp",
    )  # fmt: skip
    # every micro-step (the default), or the last only: DDP no_sync(), FSDP2
    # set_requires_gradient_sync(False), FSDP1 no_sync() (Lightning's no_backward_sync),
    # which keep unsharded gradients until then
    grad_sync: str = opt(
        "every", name="grad_sync", choices=GRAD_SYNCS,
        help="with --grad-accum on several GPUs: sync gradients every micro-step, or the last "
        "only (DDP/FSDP no_sync: unsharded gradients kept until then)",
    )  # fmt: skip
    # --sharding fsdp1: FullyShardedDataParallel's own arguments (PyTorch's defaults), as
    # accelerate's fsdp_config names them (predictor/emulate/fsdp1.py)
    fsdp1_strategy: str = opt(
        "FULL_SHARD", name="fsdp1_sharding_strategy", choices=FSDP1_STRATEGIES,
        help="fsdp1: ShardingStrategy (HYBRID_*: sharded within --hsdp-shard-size ranks)",
    )  # fmt: skip
    fsdp1_use_orig_params: bool = opt(
        False, name="fsdp1_use_orig_params", cli="bool",
        help="fsdp1: use_orig_params (true: frozen and trainable weights may share a flat "
        "parameter, whose gradient shard then spans both)",
    )  # fmt: skip
    fsdp1_limit_all_gathers: bool = opt(
        True, name="fsdp1_limit_all_gathers", cli="bool",
        help="fsdp1: limit_all_gathers (rate-limits the CPU thread; allocated bytes unchanged)",
    )  # fmt: skip
    fsdp1_backward_prefetch: str = opt(
        "BACKWARD_PRE", name="fsdp1_backward_prefetch", choices=FSDP1_BACKWARD_PREFETCHES,
        help="fsdp1: BackwardPrefetch (NO_PREFETCH: None)",
    )  # fmt: skip
    fsdp1_forward_prefetch: bool = opt(
        False, name="fsdp1_forward_prefetch", cli="bool", help="fsdp1: forward_prefetch"
    )  # fmt: skip
    fsdp1_wrap: str = opt(
        "auto", name="fsdp1_wrap", choices=FSDP1_WRAPS,
        help="fsdp1 auto-wrap policy: blocks (transformer_auto_wrap_policy on the repeated "
        "block class), peft (peft's fsdp_auto_wrap_policy: each trainable leaf its own unit "
        "too), auto (peft's under --peft lora, as the HF Trainer does; else blocks)",
    )  # fmt: skip
    fsdp1_cpu_offload: bool = opt(
        False, name="fsdp1_cpu_offload", cli="bool",
        help="fsdp1: CPUOffload(offload_params=True): parameter and gradient shards in pinned "
        "host memory, the optimizer steps on the CPU (its state in host memory); the answer "
        "gives the device peak and the host bytes apart",
    )  # fmt: skip
    # the mixed-precision policy: FSDP1's MixedPrecision, FSDP2's (fsdp/hsdp)
    # MixedPrecisionPolicy(param_dtype, reduce_dtype) as torchtitan passes it to fully_shard
    fsdp_param_dtype: str = opt(
        "none", name="fsdp_param_dtype", choices=FSDP_DTYPES,
        help="fsdp1, fsdp, hsdp: the dtype parameters are all-gathered and computed in "
        "(FSDP1 MixedPrecision / FSDP2 MixedPrecisionPolicy param_dtype; none: the "
        "parameters' own)",
    )  # fmt: skip
    fsdp_reduce_dtype: str = opt(
        "none", name="fsdp_reduce_dtype", choices=FSDP_DTYPES,
        help="fsdp1, fsdp, hsdp: the dtype gradients are reduced in (reduce_dtype; none: "
        "param_dtype's)",
    )  # fmt: skip
    fsdp_buffer_dtype: str = opt(
        "none", name="fsdp_buffer_dtype", choices=FSDP_DTYPES,
        help="fsdp1: MixedPrecision.buffer_dtype (none: the buffers' own)",
    )  # fmt: skip

    def __post_init__(self) -> None:
        if isinstance(self.gpus, bool) or not isinstance(self.gpus, int) or self.gpus < 1:
            raise ValueError(f"--gpus must be an integer >= 1, got {self.gpus!r}")
        _choice(self.sharding, SHARDINGS, "--sharding")
        self._check_tp()
        self._check_pp()
        if self.sharding == "none" and self.dp > 1 and self.tp > 1 and self.pp == 1:
            raise ValueError(
                f"--gpus {self.gpus} with --tp {self.tp} leaves {self.dp} data-parallel "
                f"ranks: add --sharding fsdp (2-D, as torchtitan), or --tp {self.gpus}"
            )
        if self.sharding == "none" and self.dp > 1 and self.pp == 1:
            raise ValueError(
                f"--gpus {self.gpus} needs --sharding (one of {SHARDINGS[1:]}): "
                "how the ranks split the model"
                + (f", or --tp {self.gpus} (tensor parallel)" if self.tp == 1 else "")
            )
        if self.sharding != "none" and self.dp < 2:
            if self.tp > 1:
                raise ValueError(
                    f"--sharding {self.sharding} with --tp {self.tp} needs --gpus >= "
                    f"{2 * self.tp} (>= 2 data-parallel ranks of --tp ranks each), "
                    f"got {self.gpus}"
                )
            raise ValueError(f"--sharding {self.sharding} needs --gpus >= 2, got {self.gpus}")
        if not self.reshard_after_forward and self.sharding not in ("fsdp", "hsdp"):
            raise ValueError(
                "--fsdp-reshard-after-forward false applies to --sharding fsdp or hsdp, "
                f"not {self.sharding} (zero3 always reshards; zero2 keeps parameters whole; "
                "fsdp1: --fsdp1-sharding-strategy SHARD_GRAD_OP)"
            )
        _choice(self.grad_sync, GRAD_SYNCS, "--grad-sync")
        if self.grad_sync != "every" and self.sharding == "none":
            raise ValueError(
                f"--grad-sync {self.grad_sync} applies to several GPUs (--gpus N --sharding ...)"
            )
        if self.hsdp_shard_size < 0:
            raise ValueError(f"--hsdp-shard-size must be >= 0, got {self.hsdp_shard_size}")
        self._check_fsdp1()
        if self.hsdp_shard_size and not self.hybrid:
            raise ValueError(
                "--hsdp-shard-size applies to --sharding hsdp or fsdp1 with a HYBRID_* "
                f"--fsdp1-sharding-strategy, not {self.sharding}"
            )
        if self.hybrid:
            shard = self.shard_group_size
            if not (2 <= shard < self.gpus and self.gpus % shard == 0):
                raise ValueError(
                    f"--sharding {self.sharding} (sharded within groups) needs --gpus split "
                    "into >= 2 shard groups of >= 2 ranks "
                    f"each (--hsdp-shard-size dividing --gpus); got --gpus {self.gpus}, "
                    f"shard group size {shard}"
                )

    def _check_tp(self) -> None:
        """--tp: an integer dividing --gpus; with data parallelism, FSDP2 only (2-D)."""
        if isinstance(self.tp, bool) or not isinstance(self.tp, int) or self.tp < 1:
            raise ValueError(f"--tp must be an integer >= 1, got {self.tp!r}")
        if self.gpus % self.tp:
            raise ValueError(
                f"--tp {self.tp} must divide --gpus {self.gpus} (--gpus = data-parallel "
                "ranks x --tp)"
            )
        if self.tp > 1 and self.sharding not in TP_SHARDINGS:
            raise ValueError(
                f"--tp {self.tp} with --sharding {self.sharding} is not modelled: tensor "
                f"parallelism runs alone (--sharding none, --gpus {self.tp}) or 2-D under "
                "FSDP2 (--sharding fsdp, --gpus = data-parallel ranks x --tp)"
            )

    def _check_pp(self) -> None:
        """--pp: one stage per rank, alone (--gpus = --pp) or each stage sharded by FSDP2
        over its data-parallel ranks (--sharding fsdp, --gpus = --pp x dp, dp >= 2), each
        split over --tp ranks too where --tp > 1 (--gpus = --pp x dp x --tp); its schedule
        and micro-batches."""
        for name, value, lo in (("pp", self.pp, 1), ("microbatches", self.microbatches, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < lo:
                raise ValueError(f"--{name} must be an integer >= {lo}, got {value!r}")
        _choice(self.pp_schedule, PP_SCHEDULES, "--pp-schedule")
        if self.pp == 1:
            if self.microbatches:
                raise ValueError("--microbatches applies to --pp N (pipeline parallel)")
            return
        if self.sharding not in PP_SHARDINGS:
            raise ValueError(
                f"--pp {self.pp} with --sharding {self.sharding} is not modelled yet: each "
                "stage runs whole (--sharding none) or sharded by FSDP2 over its "
                "data-parallel ranks (--sharding fsdp, torchtitan's PP x FSDP)"
            )
        # ranks per stage: --tp x data-parallel ranks (torchtitan's (pp, dp_shard, tp) mesh)
        tp, per = self.tp, self.pp * self.tp
        with_tp = f" x --tp {tp}" if tp > 1 else ""
        if self.sharding == "fsdp" and (self.gpus % per or self.gpus < 2 * per):
            raise ValueError(
                f"--pp {self.pp}{with_tp} with --sharding fsdp needs --gpus a multiple of "
                f"{per} (--pp{' x --tp' if tp > 1 else ''}) >= {2 * per} (>= 2 data-parallel "
                f"ranks per stage), got {self.gpus}"
            )
        if self.sharding == "none" and self.gpus % per:
            raise ValueError(
                f"--pp {self.pp}{with_tp} needs --gpus {per} (one stage per "
                f"{'--tp ranks' if tp > 1 else 'rank'})"
            )
        if self.sharding == "none" and self.gpus != per:
            raise ValueError(
                f"--pp {self.pp}{with_tp} --gpus {self.gpus} leaves {self.dp} data-parallel "
                "ranks per stage: add --sharding fsdp (each stage sharded by FSDP2 over them, "
                f"as torchtitan's PP x FSDP), or --gpus {per}"
            )
        if self.fsdp_cpu_offload:
            raise ValueError(f"--pp {self.pp} with --fsdp-cpu-offload is not modelled yet")
        if self.grad_sync != "every":
            raise ValueError(
                f"--grad-sync {self.grad_sync} with --pp {self.pp}: PyTorch's PipelineStage "
                "itself defers every micro-batch's gradient sync to the step's end"
            )
        if self.pp_schedule not in PP_SCHEDULES_MODELLED:
            raise ValueError(
                f"--pp-schedule {self.pp_schedule} is not modelled yet (memgnn runs "
                f"{', '.join(PP_SCHEDULES_MODELLED)}; the looped, zero-bubble and V schedules "
                "are not run)"
            )
        rounds = max(1, self.pp_microbatches // self.pp)
        if self.pp_schedule in PP_MULTI_STAGE and self.pp_microbatches % rounds:
            raise ValueError(
                f"--pp-schedule {self.pp_schedule} needs --microbatches a multiple of "
                f"max(1, microbatches // --pp) = {rounds}, got {self.pp_microbatches} "
                "(PyTorch's ScheduleInterleaved1F1B refuses others)"
            )
        if self.pp_schedule == "1f1b" and self.pp_microbatches < self.pp:
            raise ValueError(
                f"--pp-schedule 1f1b needs --microbatches >= --pp {self.pp}, got "
                f"{self.microbatches} (PyTorch's Schedule1F1B refuses fewer)"
            )

    @property
    def pp_stages_per_rank(self) -> int:
        """Stages each rank holds: 2 for an interleaved schedule (torchtitan's default for
        multi-stage schedules), else 1."""
        return 2 if self.pp > 1 and self.pp_schedule in PP_MULTI_STAGE else 1

    @property
    def pp_microbatches(self) -> int:
        """Micro-batches per pipeline step: --microbatches, or --pp where 0."""
        return self.microbatches or self.pp

    @property
    def dp(self) -> int:
        """Data-parallel ranks: --gpus / (--tp x --pp)."""
        return self.gpus // (self.tp * self.pp) if self.tp >= 1 and self.pp >= 1 else self.gpus

    @property
    def distributed(self) -> bool:
        """Several ranks (data- or tensor-parallel): the answer is one rank's, captured in a
        fake process group."""
        return self.gpus > 1

    def _check_fsdp1(self) -> None:
        """FSDP1's options: each only with --sharding fsdp1 (a ValueError names it)."""
        _choice(self.fsdp1_strategy, FSDP1_STRATEGIES, "--fsdp1-sharding-strategy")
        prefetch = self.fsdp1_backward_prefetch
        _choice(prefetch, FSDP1_BACKWARD_PREFETCHES, "--fsdp1-backward-prefetch")
        _choice(self.fsdp1_wrap, FSDP1_WRAPS, "--fsdp1-wrap")
        for flag, value in (
            ("--fsdp-param-dtype", self.fsdp_param_dtype),
            ("--fsdp-reduce-dtype", self.fsdp_reduce_dtype),
            ("--fsdp-buffer-dtype", self.fsdp_buffer_dtype),
        ):
            _choice(value, FSDP_DTYPES, flag)
        if self.sharding != "fsdp1":
            for o in OPTIONS_FSDP1:
                if getattr(self, o.field) == o.default:
                    continue
                if self.sharding in ("fsdp", "hsdp") and o.name in MP_POLICY_OPTIONS:
                    continue  # FSDP2's MixedPrecisionPolicy (emulate.parallel)
                also = " or fsdp/hsdp (FSDP2's MixedPrecisionPolicy)"
                raise ValueError(
                    f"--{o.name.replace('_', '-')} applies to --sharding fsdp1 "
                    f"(FullyShardedDataParallel){also if o.name in MP_POLICY_OPTIONS else ''}"
                    f", not {self.sharding}"
                )
        if self.fsdp1_cpu_offload and self.fsdp1_strategy not in OFFLOAD_FSDP1_STRATEGIES:
            raise ValueError(
                f"--fsdp1-cpu-offload true with --fsdp1-sharding-strategy "
                f"{self.fsdp1_strategy} is not modelled (FSDP1's NO_SHARD and HYBRID_* "
                f"offload paths); use one of {', '.join(OFFLOAD_FSDP1_STRATEGIES)}"
            )
        if self.fsdp_cpu_offload and self.sharding != "fsdp":
            raise ValueError(
                f"--fsdp-cpu-offload applies to --sharding fsdp (FSDP2 CPUOffloadPolicy), "
                f"not {self.sharding}"
                + ("; FSDP1: --fsdp1-cpu-offload true" if self.sharding == "fsdp1" else "")
            )
        if self.fsdp_cpu_offload and (self.fsdp_param_dtype, self.fsdp_reduce_dtype) != (
            "none",
            "none",
        ):
            raise ValueError(
                "--fsdp-cpu-offload with --fsdp-param-dtype/--fsdp-reduce-dtype (FSDP2's "
                "MixedPrecisionPolicy) is not modelled yet: each was checked alone"
            )
        if self.fsdp_cpu_offload and self.tp > 1:
            raise ValueError("--fsdp-cpu-offload with --tp is not modelled")

    @property
    def hybrid(self) -> bool:
        """Sharded within groups, replicated across them: hsdp, fsdp1's HYBRID_* strategies."""
        return self.sharding == "hsdp" or (
            self.sharding == "fsdp1" and self.fsdp1_strategy.startswith("HYBRID")
        )

    @property
    def shard_group_size(self) -> int:
        """Ranks one copy of the model is sharded over: the world for fsdp/zero*/fsdp1, the
        shard group for hsdp and fsdp1's HYBRID_* (default: the largest divisor <= 8 of
        --gpus leaving >= 2 replicas, i.e. shard inside an 8-GPU node, replicate across
        nodes), 1 for none/ddp and fsdp1's NO_SHARD."""
        if self.sharding in ("none", "ddp"):
            return 1
        if self.sharding == "fsdp1" and self.fsdp1_strategy == "NO_SHARD":
            return 1
        if not self.hybrid:
            return self.dp
        if self.hsdp_shard_size:
            return self.hsdp_shard_size
        fits = [d for d in range(2, 9) if self.gpus % d == 0 and self.gpus // d >= 2]
        return max(fits, default=1)


@dataclass(kw_only=True, slots=True)
class LoopSpec:
    """The training loop around the step: accumulation, which steps, what it keeps."""

    grad_accum: int = opt(1, name="grad_accum", lo=1, hi=1_000_000,
                          help="gradient accumulation micro-steps per optimizer step")  # fmt: skip
    steps: str = opt(
        "both", name="steps", choices=STEP_KINDS,
        help="the first step (optimizer state created), the steady one, or both",
    )  # fmt: skip
    # the loop keeps each micro-step's model outputs and loss until the next forward has
    # made its own: `for b in loader: outputs = model(**b); loss = outputs.loss;
    # loss.backward()` (accelerate's no_trainer examples), LitGPT's `logits = model(...)`.
    # They live through backward and the optimizer step, and hold the autograd graph: what
    # its nodes keep outside saved tensors (custom Functions' ctx attributes, e.g.
    # bitsandbytes') outlives backward. Off: the outputs go with the forward, the loss after
    # backward (HF Trainer: compute_loss returns the loss alone, training_step `loss.detach()`)
    hold_outputs: bool = opt(
        False, name="hold_outputs", cli="switch",
        help="the loop keeps the last micro-step's loss/outputs (and graph) until the next "
        "forward's (`loss = model(b).loss` in a for loop; LitGPT); default: freed after backward",
    )  # fmt: skip

    def __post_init__(self) -> None:
        if self.grad_accum < 1:
            raise ValueError(f"grad_accum must be >= 1, got {self.grad_accum}")
        _choice(self.steps, STEP_KINDS, "steps")
        if not isinstance(self.hold_outputs, bool):
            raise ValueError(f"--hold-outputs must be true or false, got {self.hold_outputs!r}")


@dataclass(kw_only=True, slots=True)
class OffloadSpec:
    """What the step keeps on the host instead of the GPU (`emulate.offload`): the answer
    gives the device peak and the host bytes (pinned, pageable) as figures of their own."""

    activations: str = opt(
        "none", name="offload_activations", choices=OFFLOAD_ACTIVATIONS,
        help="tensors saved for backward kept in pinned host memory: save_on_cpu "
        "(torch.autograd.graph.save_on_cpu(pin_memory=True) around the forward) or torchtune "
        "(enable_activation_offloading: OffloadActivations with streams, the output head kept)",
    )  # fmt: skip
    optimizer: str = opt(
        "none", name="offload_optimizer", choices=OFFLOAD_OPTIMIZERS,
        help="torchao: torchao.optim.CPUOffloadOptimizer (pinned host copies of parameters "
        "and gradients, the optimizer's state and step on the CPU; parameters under 4096 "
        "elements stay on the GPU)",
    )  # fmt: skip
    gradients: bool = opt(
        False, name="offload_gradients", cli="switch",
        help="with --offload-optimizer torchao: free each GPU gradient once copied to the "
        "host (CPUOffloadOptimizer(offload_gradients=True); no gradient accumulation)",
    )  # fmt: skip

    def __post_init__(self) -> None:
        _choice(self.activations, OFFLOAD_ACTIVATIONS, "--offload-activations")
        _choice(self.optimizer, OFFLOAD_OPTIMIZERS, "--offload-optimizer")
        if not isinstance(self.gradients, bool):
            raise ValueError(f"--offload-gradients must be true or false, got {self.gradients!r}")
        if self.gradients and self.optimizer != "torchao":
            raise ValueError("--offload-gradients applies to --offload-optimizer torchao")


@dataclass(kw_only=True, slots=True)
class TrainSpec:
    """How one training step runs (see the module docstring for its groups)."""

    numerics: NumericsSpec = field(default_factory=NumericsSpec)
    optim: OptimSpec = field(default_factory=OptimSpec)
    activations: ActivationSpec = field(default_factory=ActivationSpec)
    kernels: KernelSpec = field(default_factory=KernelSpec)
    adapter: AdapterSpec = field(default_factory=AdapterSpec)
    quant: QuantSpec = field(default_factory=QuantSpec)
    parallel: ParallelSpec = field(default_factory=ParallelSpec)
    loop: LoopSpec = field(default_factory=LoopSpec)
    offload: OffloadSpec = field(default_factory=OffloadSpec)

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            if not isinstance(getattr(self, f.name), _GROUPS[f.name]):
                raise ValueError(f"TrainSpec.{f.name} must be a {_GROUPS[f.name].__name__}")
        base, sharding = self.quant.base, self.parallel.sharding
        _check_float8(self)
        if base == "int8" and sharding != "none":
            raise ValueError(
                f"--quantize-base int8 with --sharding {sharding} is not modelled (LLM.int8's "
                "Int8Params keep their scales on the parameter, which FSDP/DDP do not carry); "
                "drop one, or use nf4 (FSDP-QLoRA)"
            )
        if base.startswith("nf4") and sharding == "fsdp1" and self.quant.quant_storage == "uint8":
            raise ValueError(
                f"--quantize-base {base} with --sharding fsdp1 needs the 4-bit codes in a float "
                "storage: FSDP1 flattens a unit's weights into one FlatParameter and cannot "
                "flatten uint8; add --bnb-quant-storage bf16 (the model's dtype; what "
                "fsdp_qlora and HF's FSDP-QLoRA set)"
            )
        method = self.adapter.method
        self._check_tp()
        self._check_pp()
        if base != "none" and method == "none":
            raise ValueError(
                f"--quantize-base {base} needs --peft lora: a bitsandbytes-"
                "quantised base is frozen (its weights take no gradient), so only adapters train"
            )
        if base != "none" and method not in PEFT_ON_QUANTIZED:
            why = (
                "peft runs it over bitsandbytes layers, but memgnn does not model those yet"
                if method in PEFT_BNB_LAYERS
                else "peft has no bitsandbytes layer for it"
            )
            raise ValueError(
                f"--quantize-base {base} with --peft {method} is not modelled: {why}; "
                f"methods over a quantised base: {', '.join(PEFT_ON_QUANTIZED)}"
            )
        _check_offload(self)
        _check_compile(self)
        _check_loss(self)

    def _check_pp(self) -> None:
        """--pp with what memgnn has not run under pipeline parallelism: named, refused."""
        pp = self.parallel.pp
        if pp == 1:
            return
        others = {
            f"--grad-accum {self.loop.grad_accum}": self.loop.grad_accum != 1,
            f"--checkpointing {self.activations.checkpointing}": (
                self.activations.checkpointing.split(":")[0] not in PP_CHECKPOINTING
            ),
            f"--attention {self.kernels.attention}": self.kernels.attention != "auto",
            f"--compile {self.kernels.compile}": self.kernels.compile != "none",
            f"--loss {self.kernels.loss}": self.kernels.loss != "model",
            f"--float8 {self.numerics.float8}": self.numerics.float8 != "none",
            f"--peft {self.adapter.method}": self.adapter.method != "none",
            f"--quantize-base {self.quant.base}": self.quant.base != "none",
            f"--offload-activations {self.offload.activations}": self.offload.activations != "none",
            f"--offload-optimizer {self.offload.optimizer}": self.offload.optimizer != "none",
            "--optimizer-in-bwd true": self.optim.in_backward,
            "--hold-outputs": self.loop.hold_outputs,
            f"--precision {self.numerics.precision} (a GradScaler)": (
                self.numerics.uses_grad_scaler
            ),
        }
        named = [flag for flag, on in others.items() if on]
        if named:
            raise ValueError(
                f"--pp {pp} with {', '.join(named)} is not modelled yet: memgnn runs a pipeline "
                "stage with a plain optimizer and precision (checked against real gloo runs); "
                "drop one"
            )

    def _check_tp(self) -> None:
        """--tp with what memgnn has not run under tensor parallelism: named, refused."""
        tp = self.parallel.tp
        if tp == 1:
            return
        others = {
            f"--peft {self.adapter.method}": self.adapter.method != "none",
            f"--offload-activations {self.offload.activations}": self.offload.activations != "none",
            f"--offload-optimizer {self.offload.optimizer}": self.offload.optimizer != "none",
        }
        named = [flag for flag, on in others.items() if on]
        if named:
            raise ValueError(
                f"--tp {tp} with {', '.join(named)} is not modelled: tensor parallelism splits "
                "plain nn.Linear weights into DTensors, which adapters, activation offloading "
                "and offloading optimizers do not take as memgnn runs them; drop one"
            )

    @classmethod
    def of(cls, **options: Any) -> TrainSpec:
        """A spec from flat options (`TrainSpec.of(precision="bf16", lora_r=16)`); a
        ValueError names an option that does not exist."""
        groups: dict[str, dict[str, Any]] = {name: {} for name in _GROUPS}
        for name, value in options.items():
            o = BY_NAME.get(name)
            if o is None:
                raise ValueError(f"unknown training option {name!r}; known: {', '.join(BY_NAME)}")
            groups[o.group][o.field] = value
        return cls(**{g: _GROUPS[g](**kw) for g, kw in groups.items()})

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrainSpec:
        """From `to_dict()`'s nested form or `flat()`'s (a stored graph's or record's)."""
        if not isinstance(data, Mapping):
            raise ValueError(f"a training spec is a mapping, got {type(data).__name__}")
        nested = {k: v for k, v in data.items() if k in _GROUPS and isinstance(v, Mapping)}
        flat = {k: v for k, v in data.items() if k not in nested}
        for group, values in nested.items():
            for name, value in values.items():
                o = _BY_FIELD.get((group, name))
                if o is None:
                    raise ValueError(f"unknown training option {group}.{name}")
                flat[o.name] = value
        return cls.of(**flat)

    def flat(self) -> dict[str, Any]:
        """{option name: value} for every option, in declaration order."""
        return {o.name: getattr(getattr(self, o.group), o.field) for o in OPTIONS}

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """{group: {field: value}}, the nested form answers show."""
        return dataclasses.asdict(self)

    def with_options(self, **options: Any) -> TrainSpec:
        """A copy with some flat options changed (checked like a new spec)."""
        return TrainSpec.of(**(self.flat() | options))

    def changed(self) -> dict[str, Any]:
        """The options that differ from their defaults (what a user set)."""
        return {n: v for n, v in self.flat().items() if v != BY_NAME[n].default}


# --checkpointing modes run per stage under --pp (each stage's own blocks, every:N counted
# from the stage's first block, as torchtitan applies AC to each model part after the
# split), checked against real gloo runs
PP_CHECKPOINTING = ("none", "full", "every")


def _check_float8(train: TrainSpec) -> None:
    """--float8 with the options that swap or wrap the same Linear layers."""
    recipe = train.numerics.float8
    if recipe == "none":
        return
    if train.quant.base != "none":
        raise ValueError(
            f"--float8 {recipe} with --quantize-base {train.quant.base}: both replace the "
            "Linear layers; pick one"
        )
    if train.adapter.method != "none":
        raise ValueError(
            f"--float8 {recipe} with --peft {train.adapter.method} is not modelled (float8 "
            "training converts the trained Linear layers of a full fine-tune or pre-training)"
        )
    if train.parallel.sharding not in ("none", "ddp", "fsdp", "hsdp"):
        raise ValueError(
            f"--float8 {recipe} with --sharding {train.parallel.sharding} is not modelled; "
            "float8 training is modelled on one GPU, with ddp, fsdp or hsdp"
        )
    if train.numerics.float8_fsdp_all_gather and train.parallel.sharding not in ("fsdp", "hsdp"):
        raise ValueError(
            f"--float8-fsdp-all-gather with --sharding {train.parallel.sharding}: it changes "
            "what FSDP2 all-gathers; use --sharding fsdp or hsdp, or drop it"
        )
    if train.parallel.tp > 1:
        raise ValueError(
            f"--float8 {recipe} with --tp {train.parallel.tp} is not modelled yet (torchao's "
            "float8 tensor-parallel styles are not run)"
        )


def _check_compile(train: TrainSpec) -> None:
    """The options `--compile` is modelled with (`predictor.emulate.compile`); checked
    against real compiled CPU steps (tests/predictor/emulate/test_compile.py, and for DDP
    and FSDP2 over 2 gloo ranks, test_compile_sharded.py)."""
    mode = train.kernels.compile
    if train.kernels.compile_loss and mode != "blocks":
        raise ValueError(
            f"--compile-loss with --compile {mode}: the loss is compiled with the blocks "
            "(--compile blocks); --compile full compiles the model's loss with the model"
        )
    if train.kernels.compile_loss and train.kernels.loss != "model":
        raise ValueError(
            f"--compile-loss with --loss {train.kernels.loss}: the chunked loss is compiled "
            "per chunk under --compile blocks already"
        )
    if mode == "none":
        return
    why = []
    if train.activations.checkpointing == "hf":
        why.append(f"--checkpointing {train.activations.checkpointing}")
    elif mode == "full" and train.activations.checkpointing != "none":
        why.append(f"--checkpointing {train.activations.checkpointing} (use --compile blocks)")
    sharding = train.parallel.sharding
    if sharding != "none":  # each block compiled, then wrapped: DDP and FSDP2 are checked
        if mode == "full" or sharding not in ("ddp", "fsdp"):
            why.append(f"--sharding {sharding} (--compile blocks runs with ddp and fsdp)")
        else:
            if train.parallel.grad_sync != "every":
                why.append(f"--grad-sync {train.parallel.grad_sync}")
    if train.quant.base != "none":
        why.append(f"--quantize-base {train.quant.base}")
    if train.offload.activations == "save_on_cpu":
        # torch's save_on_cpu packs each saved tensor contiguous; a compiled backward
        # asserts the strides it saved (a real compiled CPU step fails)
        why.append("--offload-activations save_on_cpu (torchtune's offloading is modelled)")
    elif train.offload.activations != "none" and mode == "full":
        why.append(f"--offload-activations {train.offload.activations} (use --compile blocks)")
    elif train.offload.activations != "none" and sharding != "none":
        # checked on one device (tests/predictor/emulate/test_compile.py), not sharded yet
        why.append(f"--offload-activations {train.offload.activations} and --sharding {sharding}")
    if mode == "full" and train.kernels.loss != "model":
        why.append(f"--loss {train.kernels.loss} (use --compile blocks)")
    if train.numerics.float8 != "none" and train.kernels.compile_dynamic:
        # symbolic lowering schedules float8's amaxes otherwise (docs/how-to/compile.md)
        why.append(f"--float8 {train.numerics.float8} and --compile-dynamic true")
    if train.parallel.tp > 1:
        why.append(f"--tp {train.parallel.tp}")
    if train.parallel.fsdp_cpu_offload or train.parallel.fsdp1_cpu_offload:
        why.append("FSDP CPU offload")
    if why:
        raise ValueError(f"--compile {mode} with {', '.join(why)} is not modelled yet")


def _check_loss(train: TrainSpec) -> None:
    """--loss chunked-ce:N is modelled on one GPU and with ddp or fsdp (the head's weight a
    plain tensor, or FSDP2's unsharded one while the root group runs; checked against real
    2-rank gloo jobs, tests/predictor/emulate/test_compile_sharded.py)."""
    if train.kernels.loss == "model":
        return
    if train.parallel.sharding not in ("none", "ddp", "fsdp") or train.parallel.tp > 1:
        raise ValueError(
            f"--loss {train.kernels.loss} with --sharding {train.parallel.sharding} --tp "
            f"{train.parallel.tp} is not modelled yet: the chunked loss is modelled on one "
            "GPU and with ddp or fsdp"
        )


def _check_offload(train: TrainSpec) -> None:
    """Rules across groups for the optimizer in backward and the offloaded optimizer."""
    optim, off, loop = train.optim, train.offload, train.loop
    if optim.in_backward:
        if loop.grad_accum > 1:
            raise ValueError(
                "--optimizer-in-bwd steps each parameter as its gradient is ready: no "
                "gradient accumulation (torchtune refuses it too); drop --grad-accum"
            )
        if train.numerics.uses_grad_scaler:
            raise ValueError(
                "--optimizer-in-bwd with amp-fp16: a GradScaler cannot unscale or skip a "
                "step that already ran inside backward; use amp-bf16 or bf16"
            )
        if train.parallel.sharding != "none":
            raise ValueError("--optimizer-in-bwd is modelled on one GPU (--sharding none)")
        if off.optimizer != "none":
            raise ValueError("--optimizer-in-bwd and --offload-optimizer: pick one")
        if not optim.set_to_none:
            raise ValueError(
                "--optimizer-in-bwd frees each gradient after its step (zero_grad(set_to_none"
                "=True) in the hook): --zero-grad zero does not apply"
            )
    _check_param_offload(train)
    if off.optimizer == "torchao":
        if train.parallel.sharding != "none":
            raise ValueError(
                "--offload-optimizer torchao: CPUOffloadOptimizer is for single-GPU training"
            )
        if not (
            optim.name in ("sgd", "adam", "adamw", "adafactor")
            or optim.name.startswith("torch.optim.")
        ):
            raise ValueError(
                f"--offload-optimizer torchao steps a torch.optim optimizer on the CPU, not "
                f"--optimizer {optim.name}"
            )
        if not optim.set_to_none:
            raise ValueError("--offload-optimizer torchao: its zero_grad sets gradients to None")
        if train.numerics.uses_grad_scaler:
            raise ValueError(
                "--offload-optimizer torchao with amp-fp16 is not modelled (GradScaler's "
                "unscale of the host gradients); use amp-bf16 or bf16"
            )
        if off.gradients and loop.grad_accum > 1:
            raise ValueError(
                "--offload-gradients frees GPU gradients after each backward: no gradient "
                "accumulation (CPUOffloadOptimizer says so too)"
            )


def _check_param_offload(train: TrainSpec) -> None:
    """FSDP's CPU offload of parameters (`emulate.fsdp_offload`) with what memgnn has not
    run under it: named, refused."""
    p = train.parallel
    flag = "--fsdp1-cpu-offload true" if p.sharding == "fsdp1" else "--fsdp-cpu-offload true"
    if not ((p.sharding == "fsdp1" and p.fsdp1_cpu_offload) or p.fsdp_cpu_offload):
        return
    others = {
        "--offload-optimizer": train.offload.optimizer != "none",
        "--optimizer-in-bwd": train.optim.in_backward,
        "amp-fp16 (GradScaler over host gradients)": train.numerics.uses_grad_scaler,
        "--grad-sync last": p.grad_sync != "every",
    }
    named = [k for k, on in others.items() if on]
    if named:
        raise ValueError(f"{flag} with {', '.join(named)} is not modelled; drop one")
    torch_optim = train.optim.name in ("sgd", "adam", "adamw", "adafactor")
    if not (torch_optim or train.optim.name.startswith("torch.optim.")):
        raise ValueError(
            f"{flag}: the optimizer steps the host shards on the CPU; memgnn models "
            f"torch.optim's there, not --optimizer {train.optim.name}"
        )


_GROUPS: dict[str, type] = {
    "numerics": NumericsSpec,
    "optim": OptimSpec,
    "activations": ActivationSpec,
    "kernels": KernelSpec,
    "adapter": AdapterSpec,
    "quant": QuantSpec,
    "parallel": ParallelSpec,
    "loop": LoopSpec,
    "offload": OffloadSpec,
}
assert list(_GROUPS) == [f.name for f in dataclasses.fields(TrainSpec)]
OPTIONS: tuple[Option, ...] = tuple(o for g, c in _GROUPS.items() for o in group_options(g, c))
BY_NAME: dict[str, Option] = {o.name: o for o in OPTIONS}
_BY_FIELD: dict[tuple[str, str], Option] = {(o.group, o.field): o for o in OPTIONS}
OPTIONS_FSDP1: tuple[Option, ...] = tuple(
    o
    for o in OPTIONS
    if o.group == "parallel"
    and o.name.startswith(("fsdp1_", "fsdp_"))
    and o.name not in ("fsdp_reshard_after_forward", "fsdp_cpu_offload")
)
# FSDP1 strategies whose CPU offload memgnn models (predictor/emulate/fsdp_offload.py)
OFFLOAD_FSDP1_STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP")
assert len(BY_NAME) == len(OPTIONS), "option names must be unique"
# the FSDP1 options FSDP2 (--sharding fsdp|hsdp) takes too: its MixedPrecisionPolicy's dtypes
MP_POLICY_OPTIONS = ("fsdp_param_dtype", "fsdp_reduce_dtype")
