"""Specs shared by capture, profiling and prediction: what model, which sizes, how it trains.

`ModelBundle` is everything needed to run one training step of a model: how to build it,
how to make a batch at any sizes (concrete ints or symbolic sizes alike), and the loss.
`TrainSpec` is how the step runs (precision, optimizer, checkpointing, accumulation).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch
from memgnn.predictor.ir.vocab import SHARDINGS

PRECISIONS = ("fp32", "bf16", "fp16", "amp-bf16", "amp-fp16")
TORCH_OPTIMIZERS = ("sgd", "adam", "adamw", "adafactor")  # torch.optim's
OPTIMIZERS = (
    *TORCH_OPTIMIZERS,
    "adamw8bit",
)  # + bitsandbytes' AdamW8bit (predictor/emulate/optim8bit.py)
PEFT_METHODS = ("none", "lora")
# LoRA adapters' dtype: fp32 = peft's default (get_peft_model(autocast_adapter_dtype=True)
# upcasts bf16/fp16 adapters to fp32 and each adapted input with them); model = the base
# model's dtype (autocast_adapter_dtype=False; LitGPT's own LoRA under bf16-true)
LORA_DTYPES = ("fp32", "model")
# bitsandbytes-quantised frozen base (QLoRA): see predictor/emulate/quant.py
QUANTIZE_BASES = ("none", "nf4", "nf4-dq", "int8")
# gradient sync under accumulation on several GPUs (predictor/emulate/parallel.py): every micro-step
# (the default), or the last only: DDP no_sync(), FSDP2 set_requires_gradient_sync(False),
# FSDP1 no_sync() (Lightning's no_backward_sync), which keep unsharded gradients until then
GRAD_SYNCS = ("every", "last")
# bitsandbytes versions (`TrainSpec.bnb_version`): the one whose kernels predictor/emulate/quant.py
# models by default, the first with 4-bit matmuls, the fix that stopped 4-bit matmuls keeping
# their input (PR #1270), the LLM.int8 rewrite (PR #1401) whose kernels quant.py models
BNB_VERSION = "0.50.2"
BNB_FIRST_4BIT = (0, 39, 0)
BNB_4BIT_INPUT_FIX = (0, 43, 2)
BNB_INT8_REWRITE = (0, 45, 0)
_VERSION_RE = re.compile(r"^(\d+)\.(\d+)(?:\.(\d+))?$")
OPTIMIZER_IMPLS = ("auto", "foreach", "fused", "for-loop")
STEP_KINDS = ("first", "steady", "both")
# HF's attn_implementation: auto = the model class's default (sdpa where it supports it)
ATTENTIONS = ("auto", "eager", "sdpa", "flash")
# none | full | blocks:N (our wrapper around the first N blocks) | hf (transformers' own
# gradient checkpointing of every decoder layer, non-reentrant)
_CKPT_RE = re.compile(r"^(none|full|hf|blocks:(\d+))$")


def bnb_version_tuple(version: str) -> tuple[int, int, int]:
    """'0.42.0' -> (0, 42, 0); a ValueError naming --bnb-version for anything else."""
    m = _VERSION_RE.match(version) if isinstance(version, str) else None
    if m is None:
        raise ValueError(f"--bnb-version must look like 0.42.0, got {version!r}")
    return int(m[1]), int(m[2]), int(m[3] or 0)


@dataclass(kw_only=True, slots=True)
class TrainSpec:
    """How one training step runs. Defaults are what a plain PyTorch loop does."""

    precision: str = "fp32"
    optimizer: str = "adamw"
    optimizer_impl: str = "auto"  # auto = what PyTorch picks for the target device
    lr: float = 1e-3
    checkpointing: str = "none"  # none | full | hf | blocks:N (the first N blocks)
    grad_accum: int = 1
    set_to_none: bool = True  # optimizer.zero_grad(set_to_none=...)
    steps: str = "both"  # first | steady | both
    # parameter-efficient fine-tuning through the peft library (see predictor/emulate/lora.py)
    peft: str = "none"  # none | lora
    lora_r: int = 8
    lora_alpha: float = 16.0
    lora_dropout: float = 0.0  # peft's LoraConfig default
    lora_targets: str = ""  # comma-separated module names; "" = peft's default for the model
    lora_dtype: str = "fp32"  # fp32 (peft's default) | model (adapters in the model's dtype)
    # data/model parallelism (predictor/emulate/parallel.py): the answer is one rank's peak
    gpus: int = 1  # world size
    sharding: str = "none"  # none | ddp | fsdp | hsdp | zero1 | zero2 | zero3
    fsdp_reshard_after_forward: bool = True  # fully_shard(reshard_after_forward=...)
    hsdp_shard_size: int = 0  # hsdp: ranks per shard group; 0 = the default (see below)
    grad_sync: str = "every"  # every | last (accumulate unsynced, sync on the last micro-step)
    # the frozen base's Linear layers in bitsandbytes storage (CUDA targets, with peft lora):
    # nf4 = Linear4bit NF4 (BitsAndBytesConfig's default, LitGPT's bnb.nf4), nf4-dq = with
    # double quantisation (bnb_4bit_use_double_quant, LitGPT's bnb.nf4-dq), int8 = LLM.int8()
    quantize_base: str = "none"  # none | nf4 | nf4-dq | int8
    attention: str = (
        "auto"  # eager | sdpa | flash (flash_attention_2); see predictor/emulate/attention.py
    )
    # the bitsandbytes release whose kernels run the quantised base: before 0.43.2 every 4-bit
    # matmul kept its input as `ctx.tensors` until its autograd graph was freed
    bnb_version: str = BNB_VERSION
    # the loop keeps each micro-step's model outputs and loss until the next forward has
    # made its own: `for b in loader: outputs = model(**b); loss = outputs.loss;
    # loss.backward()` (accelerate's no_trainer examples), LitGPT's `logits = model(...)`.
    # They live through backward and the optimizer step, and hold the autograd graph: what its
    # nodes keep outside saved tensors (custom Functions' ctx attributes, e.g. bitsandbytes')
    # outlives backward. Off: the outputs go with the forward, the loss after backward (HF
    # Trainer: compute_loss returns the loss alone, training_step `loss.detach()`)
    hold_outputs: bool = False

    def __post_init__(self) -> None:
        self._check_parallel()
        if self.peft not in PEFT_METHODS:
            raise ValueError(f"unknown --peft {self.peft!r}; expected one of {PEFT_METHODS}")
        if self.lora_r < 1:
            raise ValueError(f"--lora-r must be >= 1, got {self.lora_r}")
        if not self.lora_alpha > 0:
            raise ValueError(f"--lora-alpha must be > 0, got {self.lora_alpha}")
        if not 0.0 <= self.lora_dropout < 1.0:
            raise ValueError(f"--lora-dropout must be in [0, 1), got {self.lora_dropout}")
        if self.lora_dtype not in LORA_DTYPES:
            raise ValueError(
                f"unknown --lora-dtype {self.lora_dtype!r}; expected one of {LORA_DTYPES}"
            )
        if self.lora_dtype != "fp32" and self.peft != "lora":
            raise ValueError(f"--lora-dtype {self.lora_dtype} applies to --peft lora only")
        if self.quantize_base not in QUANTIZE_BASES:
            raise ValueError(
                f"unknown --quantize-base {self.quantize_base!r}; expected one of {QUANTIZE_BASES}"
            )
        if self.quantize_base != "none" and self.sharding != "none":
            raise ValueError(
                f"--quantize-base {self.quantize_base} with --sharding {self.sharding} is not "
                "modelled (FSDP/DDP over bitsandbytes storage is not captured); drop one"
            )
        if self.quantize_base != "none" and self.peft != "lora":
            raise ValueError(
                f"--quantize-base {self.quantize_base} needs --peft lora: a bitsandbytes-"
                "quantised base is frozen (its weights take no gradient), so only adapters train"
            )
        self._check_bnb()
        if not isinstance(self.hold_outputs, bool):
            raise ValueError(f"--hold-outputs must be true or false, got {self.hold_outputs!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"unknown precision {self.precision!r}; expected one of {PRECISIONS}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"unknown optimizer {self.optimizer!r}; expected one of {OPTIMIZERS}")
        if self.optimizer_impl not in OPTIMIZER_IMPLS:
            raise ValueError(
                f"unknown optimizer implementation {self.optimizer_impl!r}; "
                f"expected one of {OPTIMIZER_IMPLS}"
            )
        if self.optimizer == "adamw8bit" and self.optimizer_impl != "auto":
            raise ValueError(
                "--optimizer adamw8bit runs bitsandbytes' own kernel: "
                f"--optimizer-impl must be auto, got {self.optimizer_impl!r}"
            )
        if self.optimizer in ("sgd", "adafactor") and self.optimizer_impl == "fused":
            if self.optimizer == "adafactor":
                raise ValueError("adafactor has no fused implementation")
        if not _CKPT_RE.match(self.checkpointing):
            raise ValueError(
                f"bad checkpointing {self.checkpointing!r}; expected none, full, hf or blocks:N"
            )
        if self.attention not in ATTENTIONS:
            raise ValueError(
                f"unknown --attention {self.attention!r}; expected one of {ATTENTIONS}"
            )
        if self.grad_accum < 1:
            raise ValueError(f"grad_accum must be >= 1, got {self.grad_accum}")
        if self.steps not in STEP_KINDS:
            raise ValueError(f"unknown steps {self.steps!r}; expected one of {STEP_KINDS}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")

    def _check_bnb(self) -> None:
        version = bnb_version_tuple(self.bnb_version)
        if self.bnb_version != BNB_VERSION and self.quantize_base == "none":
            raise ValueError(
                f"--bnb-version {self.bnb_version} applies to --quantize-base nf4|nf4-dq|int8 "
                "(the quantised base's kernels)"
            )
        if self.quantize_base != "none" and version < BNB_FIRST_4BIT:
            raise ValueError(
                f"--bnb-version {self.bnb_version}: bitsandbytes' 4-bit storage came in 0.39.0"
            )
        if self.quantize_base == "int8" and version < BNB_INT8_REWRITE:
            raise ValueError(
                f"--bnb-version {self.bnb_version} with --quantize-base int8 is not modelled: "
                "LLM.int8 before bitsandbytes 0.45.0 ran col32 / tiled layouts (other "
                "temporaries); memgnn models 0.45.0 and later"
            )

    @property
    def bnb_keeps_input(self) -> bool:
        """4-bit matmuls keep their input alive with their graph node (bitsandbytes < 0.43.2:
        `MatMul4Bit` stored `ctx.tensors = (A, B)`; backward never reads A)."""
        return (
            self.quantize_base in ("nf4", "nf4-dq")
            and bnb_version_tuple(self.bnb_version) < BNB_4BIT_INPUT_FIX
        )

    def _check_parallel(self) -> None:
        if isinstance(self.gpus, bool) or not isinstance(self.gpus, int) or self.gpus < 1:
            raise ValueError(f"--gpus must be an integer >= 1, got {self.gpus!r}")
        if self.sharding not in SHARDINGS:
            raise ValueError(f"unknown --sharding {self.sharding!r}; expected one of {SHARDINGS}")
        if self.sharding == "none" and self.gpus > 1:
            raise ValueError(
                f"--gpus {self.gpus} needs --sharding (one of {SHARDINGS[1:]}): "
                "how the ranks split the model"
            )
        if self.sharding != "none" and self.gpus < 2:
            raise ValueError(f"--sharding {self.sharding} needs --gpus >= 2, got {self.gpus}")
        if not self.fsdp_reshard_after_forward and self.sharding not in ("fsdp", "hsdp"):
            raise ValueError(
                "--fsdp-reshard-after-forward false applies to --sharding fsdp or hsdp, "
                f"not {self.sharding} (zero3 always reshards; zero2 keeps parameters whole)"
            )
        if self.grad_sync not in GRAD_SYNCS:
            raise ValueError(
                f"unknown --grad-sync {self.grad_sync!r}; expected one of {GRAD_SYNCS}"
            )
        if self.grad_sync != "every" and self.sharding == "none":
            raise ValueError(
                f"--grad-sync {self.grad_sync} applies to several GPUs (--gpus N --sharding ...)"
            )
        if self.hsdp_shard_size < 0:
            raise ValueError(f"--hsdp-shard-size must be >= 0, got {self.hsdp_shard_size}")
        if self.hsdp_shard_size and self.sharding != "hsdp":
            raise ValueError(f"--hsdp-shard-size applies to --sharding hsdp, not {self.sharding}")
        if self.sharding == "hsdp":
            shard = self.shard_group_size
            if not (2 <= shard < self.gpus and self.gpus % shard == 0):
                raise ValueError(
                    f"--sharding hsdp needs --gpus split into >= 2 shard groups of >= 2 ranks "
                    f"each (--hsdp-shard-size dividing --gpus); got --gpus {self.gpus}, "
                    f"shard group size {shard}"
                )

    @property
    def shard_group_size(self) -> int:
        """Ranks one copy of the model is sharded over: the world for fsdp/zero*, the shard
        group for hsdp (default: the largest divisor <= 8 of --gpus leaving >= 2 replicas,
        i.e. shard inside an 8-GPU node, replicate across nodes), 1 for none/ddp."""
        if self.sharding in ("none", "ddp"):
            return 1
        if self.sharding != "hsdp":
            return self.gpus
        if self.hsdp_shard_size:
            return self.hsdp_shard_size
        fits = [d for d in range(2, 9) if self.gpus % d == 0 and self.gpus // d >= 2]
        return max(fits, default=1)

    @property
    def checkpoint_blocks(self) -> int | None:
        """None: no checkpointing; -1: every block (full, hf); N: the first N blocks."""
        if self.checkpointing == "none":
            return None
        if self.checkpointing in ("full", "hf"):
            return -1
        return int(self.checkpointing.split(":", 1)[1])

    @property
    def param_dtype(self) -> torch.dtype:
        return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.precision, torch.float32)

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        return {"amp-bf16": torch.bfloat16, "amp-fp16": torch.float16}.get(self.precision)

    @property
    def uses_grad_scaler(self) -> bool:
        return self.precision == "amp-fp16"

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}
