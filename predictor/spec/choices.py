"""The values training options take (`predictor.spec.train`), named once."""

from __future__ import annotations

import re

__all__ = [
    "ATTENTIONS",
    "BNB_4BIT_INPUT_FIX",
    "BNB_FIRST_4BIT",
    "BNB_INT8_REWRITE",
    "BNB_VERSION",
    "FLOAT8_RECIPES",
    "COMPILES",
    "FSDP1_BACKWARD_PREFETCHES",
    "FSDP1_STRATEGIES",
    "FSDP1_WRAPS",
    "FSDP_DTYPES",
    "GRAD_SYNCS",
    "LORA_DTYPES",
    "OFFLOAD_ACTIVATIONS",
    "OFFLOAD_OPTIMIZERS",
    "OPTIMIZERS",
    "OPTIMIZER_IMPLS",
    "PEFT_BNB_LAYERS",
    "PEFT_METHODS",
    "PEFT_NOT_MODELLED",
    "PEFT_ON_QUANTIZED",
    "PEFT_PROMPTS",
    "PEFT_TUNERS",
    "PRECISIONS",
    "PRECISION_WORDS",
    "QUANTIZE_BASES",
    "QUANT_STORAGES",
    "STEP_KINDS",
    "PP_MULTI_STAGE",
    "PP_SCHEDULES",
    "PP_SCHEDULES_MODELLED",
    "PP_SHARDINGS",
    "TP_SHARDINGS",
    "TORCH_OPTIMIZERS",
    "bnb_version_tuple",
]

PRECISIONS = ("fp32", "bf16", "fp16", "amp-bf16", "amp-fp16")
# each precision in words, as an answer states what it assumed (`bf16` is not "mixed
# precision": most people who say bf16 mean amp-bf16)
PRECISION_WORDS = {
    "fp32": "weights, gradients and optimizer states in fp32",
    "bf16": "weights, gradients and optimizer states in bf16, no fp32 master copy",
    "fp16": "weights, gradients and optimizer states in fp16, no fp32 master copy",
    "amp-bf16": "fp32 master weights and optimizer states, bf16 compute (autocast)",
    "amp-fp16": "fp32 master weights and optimizer states, fp16 compute (autocast, grad scaler)",
}
TORCH_OPTIMIZERS = ("sgd", "adam", "adamw", "adafactor")  # torch.optim's
# + bitsandbytes' AdamW8bit (predictor/emulate/optim8bit.py)
OPTIMIZERS = (*TORCH_OPTIMIZERS, "adamw8bit")
OPTIMIZER_IMPLS = ("auto", "foreach", "fused", "for-loop")
# peft's methods by their PeftType, lowercased (peft 0.21.2), plus dora: LoRA with use_dora;
# predictor/emulate/peft.py runs them (tests/predictor/emulate/test_peft.py: each one's
# captured step against a real CPU step). Adapter layers (BaseTuner):
PEFT_TUNERS = (
    "lora", "dora", "adalora", "beft", "boft", "deft", "delora", "fourierft", "glora",
    "gralora", "hira", "hra", "ia3", "lily", "ln_tuning", "loha", "lokr", "miss", "oft", "osf",
    "peanut", "psoft", "pvera", "randlora", "road", "shadow", "supertuning", "tinylora",
    "trainable_tokens", "vera",
)  # fmt: skip
# prompt learning (virtual tokens; a transformers model's config sizes them)
PEFT_PROMPTS = ("prefix_tuning", "prompt_tuning", "p_tuning", "cartridge")
PEFT_METHODS = ("none", *PEFT_TUNERS, *PEFT_PROMPTS)
# peft methods memgnn refuses, and why
PEFT_NOT_MODELLED = {
    "poly": "Polytropon routes each example by its task_ids, which memgnn's batches lack",
    "multitask_prompt_tuning": "its prompts are chosen by each example's task_ids, which "
    "memgnn's batches lack",
    "xlora": "X-LoRA mixes LoRA adapters trained before (loaded from their saved files)",
    "adaption_prompt": "it rewrites Llama/Mistral attention internals that transformers 5 "
    "changed (peft 0.21.2 fails on them)",
    "bone": "peft 0.21 replaced Bone by MiSS: use --peft miss",
    # data-dependent steps a capture on fake tensors cannot take (peft 0.21.2)
    "adamss": "its initialisation clusters the weights' SVD in numpy (real values)",
    "frod": "its initialisation decomposes the weights and keeps a data-dependent share",
    "shira": "its initialisation draws the sparse mask's indices from the weights (nonzero)",
    "unilora": "its initialisation bins the shared indices by value (bincount)",
    "vblora": "its forward checks its logits for infinities (a data-dependent branch that "
    "raises on one side)",
    "waveft": "its forward selects wavelet coefficients by a data-dependent mask",
    "c3a": "its forward runs an FFT over the activations, whose fake-tensor rule (torch "
    "2.13) fails on symbolic sizes",
    "cpt": "its loss selects the context's tokens by a data-dependent mask (nonzero)",
}
# methods peft runs over bitsandbytes layers (peft/tuners/*/bnb.py) that memgnn models
# over its quantised stand-ins (predictor/emulate/quant_lora.py), and the others peft has
PEFT_ON_QUANTIZED = ("lora", "dora")
PEFT_BNB_LAYERS = ("lora", "dora", "adalora", "hira", "ia3", "pvera", "randlora", "road")
# offloading (predictor/emulate/offload.py): activations saved for backward kept on the host
# (torch.autograd.graph.save_on_cpu(pin_memory=True), torchtune's OffloadActivations), the
# optimizer's state and step on the CPU (torchao's CPUOffloadOptimizer)
OFFLOAD_ACTIVATIONS = ("none", "save_on_cpu", "torchtune")
OFFLOAD_OPTIMIZERS = ("none", "torchao")
# LoRA adapters' dtype: fp32 = peft's default upcast, model = the base model's dtype
LORA_DTYPES = ("fp32", "model")
# torchao's float8 training (`convert_to_float8_training`, predictor/emulate/float8.py): its
# Float8LinearRecipeName values; none keeps the Linear layers in the training dtype
FLOAT8_RECIPES = ("none", "tensorwise", "rowwise", "rowwise_with_gw_hp")
# bitsandbytes-quantised frozen base (QLoRA): see predictor/emulate/quant.py
QUANTIZE_BASES = ("none", "nf4", "nf4-dq", "int8")
# bnb_4bit_quant_storage: the dtype the packed 4-bit codes are stored in (float storage lets
# FSDP flatten and shard them with the model's other weights: FSDP-QLoRA)
QUANT_STORAGES = ("uint8", "bf16", "fp16", "fp32")
# FSDP1 (`FullyShardedDataParallel`, predictor/emulate/fsdp1.py): ShardingStrategy names as
# accelerate's `fsdp_sharding_strategy` spells them, BackwardPrefetch (NO_PREFETCH = None),
# the auto-wrap policy (blocks: transformer_auto_wrap_policy over the repeated block class;
# peft: peft's fsdp_auto_wrap_policy, every trainable leaf its own unit too; auto: peft's
# under --peft lora, as the HF Trainer sets it, else blocks), MixedPrecision dtypes
FSDP1_STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2")
FSDP1_BACKWARD_PREFETCHES = ("BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH")
FSDP1_WRAPS = ("auto", "blocks", "peft")
FSDP_DTYPES = ("none", "fp32", "bf16", "fp16")
# gradient sync under accumulation on several GPUs (predictor/emulate/parallel.py)
GRAD_SYNCS = ("every", "last")
STEP_KINDS = ("first", "steady", "both")
# HF's attn_implementation: auto = the model class's default (sdpa where it supports it)
ATTENTIONS = ("auto", "eager", "sdpa", "flash")
# torch.compile: none, the whole model, or each repeated block (`predictor.emulate.compile`)
COMPILES = ("none", "full", "blocks")
# bitsandbytes versions (`QuantSpec.bnb_version`): the one whose kernels
# predictor/emulate/quant.py models by default, the first with 4-bit matmuls, the fix that
# stopped 4-bit matmuls keeping their input (PR #1270), the LLM.int8 rewrite (PR #1401)
BNB_VERSION = "0.50.2"
BNB_FIRST_4BIT = (0, 39, 0)
BNB_4BIT_INPUT_FIX = (0, 43, 2)
BNB_INT8_REWRITE = (0, 45, 0)
_VERSION_RE = re.compile(r"^(\d+)\.(\d+)(?:\.(\d+))?$")


def bnb_version_tuple(version: str) -> tuple[int, int, int]:
    """'0.42.0' -> (0, 42, 0); a ValueError naming --bnb-version for anything else."""
    m = _VERSION_RE.match(version) if isinstance(version, str) else None
    if m is None:
        raise ValueError(f"--bnb-version must look like 0.42.0, got {version!r}")
    return int(m[1]), int(m[2]), int(m[3] or 0)


# --sharding values --tp > 1 runs under: none (tensor parallel alone), fsdp (2-D: FSDP2 over
# the data-parallel mesh dimension, TP over the other, as torchtitan)
TP_SHARDINGS = ("none", "fsdp")

# --pp-schedule: torch.distributed.pipelining's schedules by torchtitan's
# pipeline_parallel_schedule names, lower-cased (GPipe, 1F1B, Interleaved1F1B, LoopedBFS,
# InterleavedZeroBubble, ZBVZeroBubble, DualPipeV); memgnn runs GPipe, 1F1B and
# Interleaved1F1B (`predictor.emulate.pipeline`), the others are refused by name
PP_SCHEDULES = (
    "gpipe", "1f1b", "interleaved1f1b", "loopedbfs", "interleavedzerobubble",
    "zbvzerobubble", "dualpipev",
)  # fmt: skip
PP_SCHEDULES_MODELLED = ("gpipe", "1f1b", "interleaved1f1b")
# schedules that run several stages per rank: torchtitan's default, 2 per rank
PP_MULTI_STAGE = ("interleaved1f1b",)
# --sharding values --pp > 1 runs under: none (every stage whole on its rank), fsdp (each
# stage sharded by FSDP2 over its data-parallel ranks: torchtitan's (pp, dp_shard) mesh)
PP_SHARDINGS = ("none", "fsdp")
