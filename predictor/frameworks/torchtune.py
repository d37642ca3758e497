"""Reader of torchtune recipe configs (YAML), as `tune run <recipe> --config FILE` reads them.

Sources: pytorch/torchtune @ bd2a0fc (Apr 2026): recipes/{full,lora}_finetune_{single_device,
distributed}.py (which keys the recipes read, with their `cfg.get` defaults),
torchtune/models/*/_model_builders.py (the builders and their LoRA arguments),
torchtune/models/llama3/_component_builders.py (qlora: every Linear of the layers in
torchao's NF4Tensor, the output projection not), recipes/configs/ (the layout).

Key (default) -> memgnn:
- model._component_ (a builder, e.g. torchtune.models.llama3_1.lora_llama3_1_8b) -> --model
  hf:ORG/NAME; lora_/qlora_ builders -> --peft lora (qlora: --quantize-base nf4-dq)
- model.lora_attn_modules (q_proj, k_proj, v_proj, output_proj), apply_lora_to_mlp,
  apply_lora_to_output -> --lora-targets (the model's HF module names)
- model.lora_rank / lora_alpha / lora_dropout -> --lora-r / --lora-alpha / --lora-dropout
- model.quantize_base -> --quantize-base nf4-dq
- model.use_dora -> a warning (DoRA is not modelled)
- batch_size -> --batch (B)
- tokenizer.max_seq_len (null: each batch's longest) -> --seq (S)
- dataset.packed -> rows of exactly max_seq_len (with compile: --compile-dynamic false, one
  static-shape compile; unpacked, lengths vary and dynamo recompiles with dynamic shapes)
- gradient_accumulation_steps -> --grad-accum
- dtype (bf16 / fp32) -> --precision bf16 / fp32: parameters, gradients, optimizer states
  and activations all in it; LoRA adapters too (--lora-dtype model)
- enable_activation_checkpointing (default false) -> --checkpointing full
- enable_fp8_training (default false) + fp8_recipe_name (null: torchao's default config,
  tensorwise, with its FSDP float8 all-gather: --float8-fsdp-all-gather) -> --float8 RECIPE;
  torchtune converts every Linear but `output` (--float8-filter-fqns output)
- optimizer._component_, optimizer.fused / foreach -> --optimizer, --optimizer-impl
  (bitsandbytes.optim.X -> bnb.X, torchao.optim.X -> torchao.X: the library's own class)
- optimizer_in_bwd -> --optimizer-in-bwd; enable_activation_offloading ->
  --offload-activations torchtune
- distributed keys (fsdp_cpu_offload, fsdp_reshard_after_forward, data_parallel_shard_dim,
  ...) -> --sharding fsdp (FSDP2 on every layer; the GPU count is tune run's
  --nproc_per_node); fsdp_cpu_offload -> --fsdp-cpu-offload (CPUOffloadPolicy)
- compile -> --compile blocks (training.compile_model compiles each layer, over its
  activation checkpoint where enabled; an unchunked loss stays eager: torchtune's model
  upcasts the logits before its compiled loss), unless read with an option --compile is
  not modelled with (activation offloading, float8, a quantised base): then a warning,
  the eager step
- loss._component_: torchtune.modules.loss.CEWithChunkedOutputLoss, loss.num_output_chunks
  (8) -> --loss chunked-ce:N (the recipe's model.set_num_output_chunks(N))
Not modelled (warnings): ac_mode/ac_option (selective), LinearCrossEntropyLoss, tensor/context
parallel dims. torchtune runs its own model code (TransformerDecoder): the answer captures
transformers' class of the same shapes.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from memgnn.predictor.frameworks.base import Builder, ConfigReading, is_off
from memgnn.predictor.frameworks.ecosystem import ADAMW_ASSUMED
from memgnn.predictor.frameworks.files import flatten
from memgnn.predictor.frameworks.naming import Catalog, hub_model, lora_targets
from memgnn.predictor.spec.choices import FLOAT8_RECIPES
from memgnn.predictor.spec.optimizer_names import LIBRARY_OPTIMIZERS

__all__ = ["BUILDERS", "read_torchtune"]

_SIZES = {"0_5b": "0.5B", "1_5b": "1.5B", "0_6b": "0.6B", "1_7b": "1.7B"}
# builder (without lora_/qlora_) -> the Hub model of the same shapes
BUILDERS: dict[str, str] = {
    "llama2_7b": "meta-llama/Llama-2-7b-hf",
    "llama2_13b": "meta-llama/Llama-2-13b-hf",
    "llama2_70b": "meta-llama/Llama-2-70b-hf",
    "llama3_8b": "meta-llama/Meta-Llama-3-8B",
    "llama3_70b": "meta-llama/Meta-Llama-3-70B",
    "llama3_1_8b": "meta-llama/Llama-3.1-8B",
    "llama3_1_70b": "meta-llama/Llama-3.1-70B",
    "llama3_1_405b": "meta-llama/Llama-3.1-405B",
    "llama3_2_1b": "meta-llama/Llama-3.2-1B",
    "llama3_2_3b": "meta-llama/Llama-3.2-3B",
    "llama3_3_70b": "meta-llama/Llama-3.3-70B-Instruct",
    "mistral_7b": "mistralai/Mistral-7B-v0.1",
    "gemma_2b": "google/gemma-2b",
    "gemma_7b": "google/gemma-7b",
    "gemma2_2b": "google/gemma-2-2b",
    "gemma2_9b": "google/gemma-2-9b",
    "gemma2_27b": "google/gemma-2-27b",
    "phi3_mini": "microsoft/Phi-3-mini-4k-instruct",
    "phi4_14b": "microsoft/phi-4",
    "qwen2_0_5b": "Qwen/Qwen2-0.5B",
    "qwen2_1_5b": "Qwen/Qwen2-1.5B",
    "qwen2_7b": "Qwen/Qwen2-7B",
    "smollm2_135m": "HuggingFaceTB/SmolLM2-135M",
    "smollm2_360m": "HuggingFaceTB/SmolLM2-360M",
    "smollm2_1_7b": "HuggingFaceTB/SmolLM2-1.7B",
    **{
        f"qwen2_5_{s}{v}": f"Qwen/Qwen2.5-{_SIZES.get(s, s.upper())}{h}"
        for s in ("0_5b", "1_5b", "3b", "7b", "14b", "32b", "72b")
        for v, h in (("", ""), ("_base", ""), ("_instruct", "-Instruct"))
    },
    **{
        f"qwen3_{s}{v}": f"Qwen/Qwen3-{_SIZES.get(s, s.upper())}{h}"
        for s in ("0_6b", "1_7b", "4b", "8b", "14b", "32b")
        for v, h in (("", ""), ("_base", "-Base"), ("_instruct", ""))
    },
}
_ROLES = {"q_proj": "q", "k_proj": "k", "v_proj": "v", "output_proj": "o"}
_INTERPOLATION = re.compile(r"^\$\{([A-Za-z0-9_.]+)\}$")
_DISTRIBUTED = (
    "fsdp_cpu_offload",
    "fsdp_reshard_after_forward",
    "custom_sharded_layers",
    "data_parallel_shard_dim",
    "data_parallel_replicate_dim",
    "tensor_parallel_dim",
    "context_parallel_dim",
    "tensor_parallel_plan",
)
_NO_EFFECT = {
    **dict.fromkeys(
        (
            "output_dir",
            "checkpointer.*",
            "resume_from_checkpoint",
            "save_adapter_weights_only",
            "enable_async_checkpointing",
            "save_every_n_steps",
            "keep_last_n_checkpoints",
        ),
        "checkpoints",
    ),
    **dict.fromkeys(
        (
            "metric_logger.*",
            "log_every_n_steps",
            "log_peak_memory_stats",
            "log_level",
            "profile_memory",
            "profiler.*",
        ),
        "logging and profiling",
    ),
    **dict.fromkeys(
        (
            "dataset._component_",
            "dataset.*",
            "seed",
            "shuffle",
            "collate_fn",
            "tokenizer._component_",
            "tokenizer.*",
            "resize_token_embeddings",
            "low_cpu_ram",
            "cudnn_deterministic_mode",
        ),
        "data preparation and loading",
    ),
    **dict.fromkeys(("dataset_val.*", "batch_size_val", "run_val_every_n_steps"), "evaluation"),
    **dict.fromkeys(
        (
            "epochs",
            "max_steps_per_epoch",
            "lr_scheduler.*",
            "clip_grad_norm",
            "optimizer.lr",
            "optimizer.weight_decay",
            "optimizer.betas",
            "optimizer.eps",
        ),
        "schedule or hyperparameter (same states)",
    ),
    "device": "the device is --device",
}
_BWD_ASSUMED = "backward, then the optimizer step (modelled on one GPU only)"
_FEATURES = {
    "ac_mode": ("selective activation checkpointing", "every layer or none, as enabled"),
    "ac_option": ("selective activation checkpointing", "every layer or none, as enabled"),
    "custom_sharded_layers": (
        "separate FSDP units for the embeddings and output",
        "FSDP on every layer and the root",
    ),
    "tensor_parallel_dim": ("tensor parallelism", "a data-parallel rank's step"),
    "context_parallel_dim": ("context parallelism", "a data-parallel rank's step"),
}


def _resolve(value: Any, root: dict[str, Any], depth: int = 0) -> Any:
    """OmegaConf's whole-value interpolations (`${output_dir}`, `${a.b}`) resolved against
    the root; text with an interpolation inside (a path) stays as written."""
    if isinstance(value, dict):
        return {k: _resolve(v, root, depth) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve(v, root, depth) for v in value]
    m = _INTERPOLATION.match(value) if isinstance(value, str) else None
    if m is None or depth > 8:
        return value
    found: Any = root
    for part in m[1].split("."):
        if not isinstance(found, dict) or part not in found:
            raise ValueError(f"{value} refers to {m[1]}, which the file does not have")
        found = found[part]
    return _resolve(found, root, depth + 1)


def read_torchtune(
    path: Path, data: dict[str, Any], *, catalog: Catalog | None = None
) -> ConfigReading:
    """The reading of a torchtune recipe config mapping `data`."""
    data = _resolve(data, data)
    flat = flatten(data, atomic=("model.lora_attn_modules",))
    b = Builder("torchtune", str(path), flat)
    _model(b, catalog)
    if b.given("batch_size"):
        b.read(
            "batch_size", b.size("B", b.number("batch_size"), f"batch_size: {b.get('batch_size')}")
        )
    else:
        b.warn(
            "the file has no batch_size (the recipes require one): give --batch",
            key="batch_size" if b.has("batch_size") else None,
        )
    _seq(b, data)
    if b.given("gradient_accumulation_steps"):
        v = b.number("gradient_accumulation_steps")
        b.read(
            "gradient_accumulation_steps",
            b.option("grad_accum", v, f"gradient_accumulation_steps: {v}"),
        )
    else:
        b.warn(
            "the file has no gradient_accumulation_steps (the recipes require it): the "
            "answer assumes 1"
        )
    _precision(b)
    key = "enable_activation_checkpointing"
    if b.get(key):
        b.read(key, b.option("checkpointing", "full", f"{key}: true"))
    elif b.has(key):
        b.read(key, "off")
    else:
        b.default(key, False, "off (the recipes' default)")
    _optimizer(b)
    _loss(b)
    _distributed(b, path)
    for key, dest, value in (
        ("optimizer_in_bwd", "optimizer_in_bwd", True),  # each gradient freed at once
        ("enable_activation_offloading", "offload_activations", "torchtune"),
    ):
        sharded = b.reading.options.get("sharding", "none") != "none"
        if b.get(key) and dest == "optimizer_in_bwd" and sharded:
            b.feature(key, "the optimizer step inside backward under FSDP", _BWD_ASSUMED)
        elif b.get(key):
            b.read(key, b.option(dest, value, f"{key}: true"))
        elif b.has(key):
            b.read(key, "off")
    _fp8(b)
    if b.has("compile"):  # training.compile_model: torch.compile on each decoder layer
        # packed: every batch max_seq_len long (drop_last), one static-shape compile;
        # unpacked lengths vary and dynamo recompiles with dynamic shapes
        b.compile_switch(
            "compile", "blocks", "each transformer layer, as training.compile_model",
            static="dataset.packed: true (every batch one shape)" if _packed(data) else "",
        )  # fmt: skip
        # training.compile_loss compiles the chunked loss per chunk (modelled under --compile
        # blocks); an unchunked loss it compiles whole, but torchtune's model upcasts its
        # logits to fp32 in forward, outside that loss, where transformers' loss_function
        # upcasts inside it: --compile-loss would fuse away fp32 logits torchtune keeps
    return b.finish(_NO_EFFECT, _FEATURES)


def _fp8(b: Builder) -> None:
    """torchtune's `enable_fp8_training` (full_finetune_distributed): torchao's
    convert_to_float8_training with `Float8LinearConfig.from_recipe_name(fp8_recipe_name)`,
    or without a recipe its default (tensorwise) with the FSDP float8 all-gather; every
    Linear but the one named `output`."""
    key, recipe_key = "enable_fp8_training", "fp8_recipe_name"
    if not b.get(key):
        if b.has(key):
            b.read(key, "off")
        if b.has(recipe_key):
            b.no_effect(recipe_key, "enable_fp8_training is off")
        return
    recipe = b.get(recipe_key) or "tensorwise"
    if recipe not in FLOAT8_RECIPES[1:]:
        raise ValueError(f"{recipe_key}: {recipe!r}; expected one of {FLOAT8_RECIPES[1:]}")
    became = b.option("float8", recipe, f"{key}: true, {recipe_key}: {b.get(recipe_key)}")
    became += " " + b.option("float8_filter_fqns", "output", f"{key}: true (all but output)")
    b.read(key, became)
    if b.given(recipe_key):
        b.read(recipe_key, became)
    else:
        if b.reading.options.get("sharding") in ("fsdp", "hsdp"):
            gather = b.option("float8_fsdp_all_gather", True, f"{key}: true without {recipe_key}")
            b.default(recipe_key, None, f"{became} {gather} (torchtune's Float8LinearConfig("
                      "enable_fsdp_float8_all_gather=True))")  # fmt: skip
        else:
            b.default(recipe_key, None, f"{became} (torchao's default Float8LinearConfig)")
            b.warn(
                f"{key}: true without {recipe_key} in a single-device reading: torchtune's "
                "FSDP2 float8 all-gather has no FSDP to act on here; give --gpus N --sharding "
                "fsdp for the distributed recipe"
            )


def _model(b: Builder, catalog: Catalog | None) -> dict | None:
    key = "model._component_"
    component = str(b.get(key) or "")
    builder = component.rpartition(".")[2]
    kind = (
        "qlora" if builder.startswith("qlora_") else "lora" if builder.startswith("lora_") else ""
    )
    base = builder.removeprefix("qlora_").removeprefix("lora_")
    hub = BUILDERS.get(base)
    config = None
    if not component:
        b.warn("the file has no model._component_: give --model")
    elif hub is None:
        b.warn(
            f"{key}: {component}: no Hugging Face model of this builder's shapes is known: "
            "give --model",
            key=key,
        )
    else:
        found = hub_model(hub, catalog)
        if found.warning:
            b.warn(f"{key}: {found.warning}")
        config = dict(found.config) if found.config else None
        became = b.model(found.spec, f"{key}: {component}") + (
            f" ({found.note})" * bool(found.note)
        )
        b.read(
            key,
            became + "; torchtune's own model code is captured as transformers' "
            "class of the same shapes",
        )
    if kind:
        b.option("peft", "lora", f"{key}: {component}")
        b.option(
            "lora_dtype", "model", f"{key}: {component} (torchtune's LoRA in the model's dtype)"
        )
        _lora(b, kind, config)
    for k in [k for k in b.unhandled() if k.startswith("model.")]:
        b.warn(
            f"{k}: {b.get(k)}: a builder argument memgnn does not read; the answer is the "
            "builder's default shapes",
            key=k,
        )
    return config


def _lora(b: Builder, kind: str, config: dict | None) -> None:
    get = lambda n, d=None: b.get(f"model.{n}", d)  # noqa: E731
    modules = get("lora_attn_modules") or []
    roles = [_ROLES[m] for m in modules if m in _ROLES]
    bad = [m for m in modules if m not in _ROLES]
    if bad:
        raise ValueError(f"model.lora_attn_modules: unknown {bad}; torchtune's are {list(_ROLES)}")
    roles += ["mlp"] * bool(get("apply_lora_to_mlp")) + ["head"] * bool(get("apply_lora_to_output"))
    targets, note = lora_targets(roles, config)
    became = b.option("lora_targets", targets, f"model.lora_attn_modules: {modules}")
    for k in ("lora_attn_modules", "apply_lora_to_mlp", "apply_lora_to_output"):
        if b.has(f"model.{k}"):
            b.read(f"model.{k}", became + (f" ({note})" if note else ""))
    for k, dest, kind_, default in (
        ("lora_rank", "lora_r", int, 8),
        ("lora_alpha", "lora_alpha", float, 16.0),
        ("lora_dropout", "lora_dropout", float, 0.0),
    ):
        value = b.number(f"model.{k}", kind_) if b.given(f"model.{k}") else kind_(default)
        became = b.option(dest, value, f"model.{k}: {value}")
        if b.has(f"model.{k}"):
            b.read(f"model.{k}", became)
        else:
            b.default(f"model.{k}", value, f"{became} (the builder's default)")
    quantize = kind == "qlora" or bool(get("quantize_base"))
    if quantize:
        b.option("quantize_base", "nf4-dq", "model._component_: qlora_*")
        b.warn(
            "torchtune's QLoRA keeps the base in torchao's NF4Tensor (4-bit codes with "
            "double-quantised scales, the storage of bitsandbytes' nf4-dq): modelled as "
            "--quantize-base nf4-dq with bitsandbytes' dequantise temporaries"
        )
    if b.has("model.quantize_base"):
        b.read("model.quantize_base", "--quantize-base nf4-dq" if quantize else "off")
    if b.get("model.use_dora"):
        b.warn(
            "model.use_dora: true: DoRA is not modelled yet; the answer is plain LoRA's",
            key="model.use_dora",
        )
    elif b.has("model.use_dora"):
        b.read("model.use_dora", "off")


def _packed(data: dict[str, Any]) -> bool:
    """Whether the file's dataset (or any of a list of them) is packed."""
    datasets = data.get("dataset")
    return any(
        isinstance(d, dict) and d.get("packed")
        for d in (datasets if isinstance(datasets, list) else [datasets])
    )


def _seq(b: Builder, data: dict[str, Any]) -> None:
    key = "tokenizer.max_seq_len"
    packed = _packed(data)
    if b.get(key) is not None:
        how = "every packed row" if packed else "the longest a batch can be"
        b.read(key, f"{b.size('S', b.number(key), f'{key}: {b.get(key)}')} ({how})")
    else:
        b.warn(
            f"{key} is not set: batches are as long as their longest sample: give --seq",
            key=key if b.has(key) else None,
        )
    if b.has("dataset.packed"):
        b.read("dataset.packed", "rows of exactly max_seq_len" if packed else "off")


def _precision(b: Builder) -> None:
    value = b.get("dtype")
    precision = {"bf16": "bf16", "fp32": "fp32", "fp16": "fp16"}.get(str(value))
    if value is None:
        b.warn("the file has no dtype (the recipes require one): the answer assumes fp32")
        precision = "fp32"
    elif precision is None:
        raise ValueError(f"dtype: {value!r}; torchtune's are bf16, fp32")
    if precision == "fp16":
        b.warn("dtype: fp16: torchtune's recipes refuse fp16; read as --precision fp16")
    became = b.option("precision", precision, f"dtype: {value}")
    if b.has("dtype"):
        b.read("dtype", became + " (parameters, gradients, states and activations)")


def _optimizer(b: Builder) -> None:
    key = "optimizer._component_"
    component = str(b.get(key) or "")
    name = component.rpartition(".")[2]
    paged = name.startswith("Paged")
    table = {
        "AdamW": "adamw",
        "Adam": "adam",
        "SGD": "sgd",
        "Adafactor": "adafactor",
        "AdamW32bit": "adamw",
    }
    # bitsandbytes' and torchao's own classes run under capture by their names
    # (predictor.spec.optimizer_names): their states as the library keeps them
    library = {"bitsandbytes": "bnb", "torchao": "torchao"}.get(component.partition(".")[0])
    optimizer = table.get(name) if library is None else f"{library}.{name}"
    if optimizer is not None and library is not None and optimizer not in LIBRARY_OPTIMIZERS:
        optimizer = {"bnb.AdamW": "adamw", "bnb.AdamW32bit": "adamw"}.get(optimizer)
    if optimizer is None:
        if component:
            b.warn(
                f"{key}: {component}: this optimizer is not modelled yet; {ADAMW_ASSUMED}", key=key
            )
        for k in [k for k in b.unhandled() if k.startswith("optimizer.")]:
            b.no_effect(k, f"an argument of {component or 'the optimizer'}")
        return
    became = b.option("optimizer", optimizer, f"{key}: {component}")
    for flag, impl in (("fused", "fused"), ("foreach", "foreach")):
        k = f"optimizer.{flag}"
        if b.get(k) and not name.endswith("8bit"):
            became += " " + b.option("optimizer_impl", impl, f"{k}: true")
            b.read(k, f"--optimizer-impl {impl}")
        elif b.has(k):
            b.read(k, "off")
    b.read(key, became)
    if paged:
        b.warn(
            f"{key}: {component}: bitsandbytes' paged states live in CUDA unified memory, "
            "outside torch's allocator counts; the answer reports them apart from the "
            "device peak (predictor.emulate.optimizers)"
        )
    if optimizer == "sgd" and not b.get("optimizer.momentum"):
        b.warn(
            f"{key}: SGD without momentum keeps no state; memgnn's sgd keeps a momentum "
            "buffer: high by one copy of the trained parameters"
        )
    for k in [k for k in b.unhandled() if k.startswith("optimizer.")]:
        if k.endswith(".amsgrad") and b.get(k):
            b.warn(f"{k}: true: AMSGrad's third state is not modelled yet", key=k)
        else:
            b.no_effect(k, "an optimizer hyperparameter (same states)")


def _loss(b: Builder) -> None:
    """CEWithChunkedOutputLoss (num_output_chunks, default 8) -> --loss chunked-ce:N (the
    recipe sets the model's output chunks from it); other losses: the model's own."""
    key = "loss._component_"
    component = str(b.get(key) or "")
    name = component.rpartition(".")[2]
    if name == "CEWithChunkedOutputLoss":
        chunks_key = "loss.num_output_chunks"
        n = b.number(chunks_key) if b.given(chunks_key) else 8
        became = b.option("loss", f"chunked-ce:{n}", f"{key}: {component}")
        b.read(key, became + " (the output head and fp32 cross entropy per chunk)")
        if b.has(chunks_key):
            b.read(chunks_key, became)
        else:
            b.default(chunks_key, 8, f"{became} (the class's default)")
    elif name == "LinearCrossEntropyLoss":
        b.warn(
            f"{key}: {component}: a chunked linear cross entropy (output projection and cross "
            "entropy fused per chunk) is not modelled yet; the answer computes the full "
            "B x S x vocab logits",
            key=key,
        )
    elif component:
        b.read(key, "the model's cross entropy, as memgnn runs it")
    for k in [k for k in b.unhandled() if k.startswith("loss.")]:
        b.no_effect(k, "an argument of the loss (see loss._component_)")


def _distributed(b: Builder, path: Path) -> None:
    present = [k for k in b.flat if k.split(".")[0] in _DISTRIBUTED]
    if not present and "distributed" not in path.name:
        return
    source = present[0] if present else f"the file name {path.name}"
    b.option("sharding", "fsdp", f"{source} (a distributed recipe: FSDP2)")
    b.warn(
        "a distributed recipe: the GPU count is tune run's --nproc_per_node, not the "
        "file's: give --gpus N (FSDP2 on every layer)"
    )
    for k in present:
        name = k.split(".")[0]
        value = b.get(k)
        if name == "fsdp_reshard_after_forward":
            b.read(k, b.option("fsdp_reshard_after_forward", bool(value), f"{k}: {value}"))
        elif name == "fsdp_cpu_offload":  # fully_shard(offload_policy=CPUOffloadPolicy())
            b.read(
                k, "off" if is_off(value) else b.option("fsdp_cpu_offload", True, f"{k}: {value}")
            )
        elif name in ("data_parallel_shard_dim", "data_parallel_replicate_dim"):
            replicate = name == "data_parallel_replicate_dim" and b.number(k) > 1
            if replicate:
                b.option("sharding", "hsdp", f"{k}: {value}")
            b.read(k, "--sharding hsdp" if replicate else "--sharding fsdp (over the ranks)")
        elif name in ("tensor_parallel_dim", "context_parallel_dim") and b.number(k) <= 1:
            b.read(k, "1: none")
        elif name == "tensor_parallel_plan":
            b.no_effect(k, "used with tensor_parallel_dim")
        elif is_off(value) and name in _FEATURES:
            b.read(k, "off")
