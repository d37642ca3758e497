"""Reader of torchtitan job configs (TOML), as `torchtitan/train.py --job.config_file` reads
them (torchtitan replaced its TOML files by Python config registries in Feb 2026, #2386;
the TOML schema is that of the dataclasses before it).

Sources: pytorch/torchtitan @ e347b1e (Feb 15 2026) torchtitan/config/job_config.py (the
sections, keys and defaults), @ 29fb3f9 (Jun 2025) torchtitan/config_manager.py (the older
names: `training.batch_size`, `training.compile`, `[float8]`, `[mx]`),
torchtitan/models/llama3/__init__.py and qwen3/__init__.py (the flavors' shapes),
torchtitan/models/llama3/infra/parallelize.py (FSDP2 `fully_shard` on every block and the
root, `MixedPrecisionPolicy(param_dtype, reduce_dtype)`; autocast under DDP or one GPU;
selective AC "N": every N-th block checkpointed).

Key (default) -> memgnn:
- model.name + model.flavor (llama3 8B / 70B / 405B, llama2, qwen3) -> --model hf:ORG/NAME
- training.local_batch_size (8; older training.batch_size) -> --batch (B)
- training.seq_len (2048) -> --seq (S)
- training.global_batch_size (-1: no accumulation) -> --grad-accum = global / (local x
  data-parallel degree)
- training.dtype (float32) -> --precision bf16 / fp32; under FSDP/HSDP
  mixed_precision_param (bfloat16) / mixed_precision_reduce (float32) -> --fsdp-param-dtype /
  --fsdp-reduce-dtype (FSDP2's MixedPrecisionPolicy over fp32 shards, as apply_fsdp passes
  it); on one GPU or DDP mixed_precision_param bfloat16 -> --precision amp-bf16 (autocast)
- parallelism.data_parallel_shard_degree (-1: every rank left) / replicate_degree (1) ->
  --sharding fsdp / hsdp / ddp, --gpus when the degrees say
- parallelism.fsdp_reshard_after_forward (default: true) -> --fsdp-reshard-after-forward
- activation_checkpoint.mode (selective) + selective_ac_option ("2") -> full ->
  --checkpointing full; selective N -> every:N (blocks N, 2N, ... counted from 1, as
  _apply_layer_sac); selective op -> selective-op (_apply_op_sac's policy); none
- optimizer.name (AdamW) / implementation (fused) -> --optimizer / --optimizer-impl
- model.converters ["float8"] / ["quantize.linear.float8"] with [float8] / [quantize.linear.
  float8] recipe_name (None: tensorwise) and filter_fqns ([]; torchtitan's names mapped to
  transformers' q_proj ... ; `output` the head) -> --float8 RECIPE --float8-filter-fqns;
  enable_fsdp_float8_all_gather / precompute_float8_dynamic_scale_for_fsdp under FSDP ->
  --float8-fsdp-all-gather / --float8-precompute-scale
- parallelism.pipeline_parallel_degree alone (no tensor, context or expert parallelism, no
  replicas) -> --pp N --gpus N; with data_parallel_shard_degree D > 1 -> --pp N --sharding
  fsdp --gpus N x D (each stage sharded by FSDP2; fsdp_reshard_after_forward "default" ->
  false under PP, as apply_fsdp); pipeline_parallel_schedule (1F1B) -> --pp-schedule
  (GPipe, 1F1B, Interleaved1F1B with 2 stages per rank; the others are refused by name);
  pipeline_parallel_microbatch_size (1) -> --batch, local_batch_size / it -> --microbatches
  (`predictor.emulate.pipeline`; an uneven layer split is a warning: memgnn splits L/pp)
Not modelled (warnings): tensor / context / expert parallel degrees > 1, pipeline with
replicas (HSDP) or other parallelism,
memory-budget activation checkpointing (the answer checkpoints nothing), compile with
what memgnn does not model it with (the answer is the eager step's), MX
converters, CPU offload, the optimizer in backward.
torchtitan's own model code is captured as transformers' class of the same shapes; newer
torchtitan shards tok_embeddings and [norm, output] as FSDP groups of their own (memgnn:
one root group).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memgnn.predictor.frameworks.base import Builder, ConfigReading, is_off
from memgnn.predictor.frameworks.files import flatten
from memgnn.predictor.frameworks.naming import Catalog, hub_model
from memgnn.predictor.spec.choices import FLOAT8_RECIPES

__all__ = ["FLAVORS", "read_torchtitan"]

# (model.name, model.flavor) -> (Hub model of the same shapes, its layer count)
FLAVORS: dict[tuple[str, str], tuple[str, int]] = {
    ("llama3", "8B"): ("meta-llama/Llama-3.1-8B", 32),
    ("llama3", "70B"): ("meta-llama/Llama-3.1-70B", 80),
    ("llama3", "405B"): ("meta-llama/Llama-3.1-405B", 126),
    ("llama2", "7B"): ("meta-llama/Llama-2-7b-hf", 32),
    ("llama2", "13B"): ("meta-llama/Llama-2-13b-hf", 40),
    ("llama2", "70B"): ("meta-llama/Llama-2-70b-hf", 80),
    ("qwen3", "0.6B"): ("Qwen/Qwen3-0.6B", 28),
    ("qwen3", "1.7B"): ("Qwen/Qwen3-1.7B", 28),
    ("qwen3", "4B"): ("Qwen/Qwen3-4B", 36),
    ("qwen3", "8B"): ("Qwen/Qwen3-8B", 36),
    ("qwen3", "14B"): ("Qwen/Qwen3-14B", 40),
    ("qwen3", "32B"): ("Qwen/Qwen3-32B", 64),
    ("qwen3", "30B-A3B"): ("Qwen/Qwen3-30B-A3B", 48),
    ("qwen3", "235B-A22B"): ("Qwen/Qwen3-235B-A22B", 94),
}
_SECTIONS = ("parallelism", "training", "experimental")  # where each era kept the degrees
_DEGREES = (
    "data_parallel_shard_degree",
    "data_parallel_replicate_degree",
    "tensor_parallel_degree",
    "pipeline_parallel_degree",
    "context_parallel_degree",
    "expert_parallel_degree",
    "expert_tensor_parallel_degree",
)
_NO_EFFECT = {
    **dict.fromkeys(
        (
            "job.*",
            "profiling.*",
            "metrics.*",
            "checkpoint.*",
            "comm.*",
            "lr_scheduler.*",
            "validation.*",
            "debug.*",
            "memory_estimation.*",
            "experimental.custom_import",
            "experimental.custom_args_module",
        ),
        "bookkeeping outside the training step",
    ),
    **dict.fromkeys(
        (
            "training.dataset",
            "training.dataset_path",
            "training.steps",
            "training.max_norm",
            "training.gc_freq",
            "training.gc_debug",
            "training.dataloader.*",
            "training.seed",
            "training.deterministic",
            "model.hf_assets_path",
            "model.tokenizer_path",
            "model.print_after_conversion",
            "optimizer.lr",
            "optimizer.eps",
            "optimizer.beta1",
            "optimizer.beta2",
            "optimizer.weight_decay",
        ),
        "data, schedule or hyperparameters",
    ),
    "compile.backend": "used with compile.enable",
    **dict.fromkeys(
        (
            "activation_checkpoint.per_op_sac_force_recompute_mm_shapes_by_fqns",
            "activation_checkpoint.preserve_rng_state",
            "activation_checkpoint.determinism_check",
            "activation_checkpoint.debug",
            "activation_checkpoint.visualize_memory_budget_pareto",
            "activation_checkpoint.early_stop",
            "activation_checkpoint.memory_budget",
        ),
        "a detail of activation_checkpoint.mode",
    ),
}
_FEATURES = {
    "training.enable_cpu_offload": ("FSDP's CPU offload", "every state on the GPU"),
    "optimizer.early_step_in_backward": (
        "the optimizer step inside backward",
        "backward, then the optimizer step",
    ),
    "parallelism.enable_compiled_autograd": ("compiled autograd", "the eager backward"),
    "fault_tolerance.enable": ("TorchFT fault tolerance", "a plain data-parallel rank"),
}


def read_torchtitan(
    path: Path, data: dict[str, Any], *, catalog: Catalog | None = None
) -> ConfigReading:
    """The reading of a torchtitan job config mapping `data` (TOML)."""
    b = Builder("torchtitan", str(path), flatten(data))
    layers = _model(b, catalog)
    _batch(b)
    sharded = _parallel(b)
    _precision(b, sharded)
    _checkpointing(b, layers)
    _optimizer(b)
    _converters(b)
    for key in ("compile.enable", "training.compile"):  # apply_compile: each block
        if b.has(key):  # fixed-length batches: torch.compile's first, static compile holds
            b.compile_switch(
                key, "blocks", "each TransformerBlock, as torchtitan's apply_compile",
                static=f"{key}: {b.flat[key]} (seq_len fixed)",
            )  # fmt: skip
    _compile_loss(b)
    for key in [k for k in b.unhandled() if k.startswith(("parallelism.", "fault_tolerance."))]:
        if key not in _FEATURES:
            b.no_effect(key, "a detail of the parallelism above")
    return b.finish(_NO_EFFECT, _FEATURES)


def _compile_loss(b: Builder) -> None:
    """`compile.components` (["model", "loss"] by default since the [compile] section
    came): "loss" -> --compile-loss (build_loss_fn compiles the cross entropy) where the
    blocks are compiled; the older `training.compile` compiled the blocks only."""
    key = "compile.components"
    if b.reading.options.get("compile") != "blocks" or not b.has("compile.enable"):
        if b.has(key):
            b.no_effect(key, "used with compile.enable")
        return
    components = b.get(key) if b.given(key) else ["model", "loss"]
    if not isinstance(components, list | tuple):
        b.warn(f"{key}: {components!r}: not a list of components (e.g. ['model', 'loss']); "
               "the loss is left eager", key=key)  # fmt: skip
        return
    if "loss" in components:
        became = b.option("compile_loss", True, f"{key}: {components}")
        if b.has(key):
            b.read(key, became + " (the loss compiled too)")
    elif b.has(key):
        b.read(key, "the model only")


def _model(b: Builder, catalog: Catalog | None) -> int | None:
    name, flavor = str(b.get("model.name", "llama3")), str(b.get("model.flavor", "debugmodel"))
    found = FLAVORS.get((name, flavor))
    if found is None:
        b.warn(
            f"model {name} flavor {flavor}: no Hugging Face model of these shapes is known: "
            "give --model",
            key="model.name" if b.has("model.name") else None,
        )
        if b.has("model.flavor"):
            b.read("model.flavor", "no model: see the warnings")
        return None
    hub, layers = found
    model = hub_model(hub, catalog)
    if model.warning:
        b.warn(f"model.flavor: {model.warning}")
    if model.config and model.config.get("num_hidden_layers"):
        layers = int(model.config["num_hidden_layers"])
    became = b.model(model.spec, f"model.name: {name}, model.flavor: {flavor}")
    became += "; torchtitan's own model code is captured as transformers' class of the same shapes"
    for key in ("model.name", "model.flavor"):
        if b.has(key):
            b.read(key, became)
    return layers


def _batch(b: Builder) -> None:
    names = ("training.local_batch_size", "training.batch_size")  # the newer name wins
    key = next((k for k in names if b.has(k)), None)
    for k in names:
        if b.has(k) and k != key:
            b.read(k, f"no memory effect: the older name; {key} is read")
    if key is not None:
        b.read(key, b.size("B", b.number(key), f"{key}: {b.get(key)}"))
    else:
        b.size("B", 8, "training.local_batch_size: 8 (default)")
        b.default("training.local_batch_size", 8, "--batch 8 (torchtitan's default)")
    key = "training.seq_len"
    if b.has(key):
        b.read(key, b.size("S", b.number(key), f"{key}: {b.get(key)}"))
    else:
        b.size("S", 2048, f"{key}: 2048 (default)")
        b.default(key, 2048, "--seq 2048 (torchtitan's default)")


def _degree(b: Builder, name: str, default: int) -> tuple[str | None, int]:
    for section in _SECTIONS:
        key = f"{section}.{name}"
        if b.has(key):
            return key, b.number(key)
    return None, default


def _parallel(b: Builder) -> bool:
    """The degrees -> --gpus / --sharding; True when the parameters are sharded (FSDP)."""
    found = {n: _degree(b, n, -1 if n == "data_parallel_shard_degree" else 1) for n in _DEGREES}
    shard, replicate = (
        found["data_parallel_shard_degree"][1],
        found["data_parallel_replicate_degree"][1],
    )
    others = {n: v for n, (_, v) in found.items() if n not in _DEGREES[:2] and v > 1}
    # pipeline parallel alone (no tensor, context or expert parallelism, no replicas): --pp,
    # each stage whole on its rank, or sharded by FSDP2 over data_parallel_shard_degree ranks
    pipeline = set(others) == {"pipeline_parallel_degree"} and replicate == 1
    alone = pipeline and shard in (1, -1)
    if alone and shard == -1:
        b.warn(
            "data_parallel_shard_degree -1 with pipeline_parallel_degree "
            f"{others['pipeline_parallel_degree']}: the answer takes every rank as a pipeline "
            "stage (--gpus = the degree); with more ranks (FSDP2 over the rest), give "
            "data_parallel_shard_degree, or --gpus N --sharding fsdp",
            key=found["data_parallel_shard_degree"][0],
        )
        shard = 1
    for n, (key, value) in found.items():
        if key is None or (pipeline and n == "pipeline_parallel_degree"):
            continue
        if n in others:
            b.warn(
                f"{key}: {value}: {n.replace('_degree', '').replace('_', ' ')} is not "
                "modelled yet; the answer is a data-parallel rank's step of the whole model",
                key=key,
            )
        elif n not in _DEGREES[:2]:
            b.read(key, "1: none")
    sharded = shard != 1
    sharding = (
        ("hsdp" if replicate > 1 else "fsdp") if sharded else ("ddp" if replicate > 1 else "none")
    )
    source = f"data_parallel_shard_degree: {shard}, data_parallel_replicate_degree: {replicate}"
    if sharding != "none":
        became = b.option("sharding", sharding, source)
        if shard > 0:
            gpus = shard * max(replicate, 1)
            for v in others.values():
                gpus *= v
            became += " " + b.option("gpus", gpus, source)
            if sharding == "hsdp":
                became += " " + b.option("hsdp_shard_size", shard, source)
        else:
            b.warn(
                "data_parallel_shard_degree -1 shards over every rank left: the GPU count is "
                "torchrun's --nproc_per_node, not the file's: give --gpus N"
            )
    else:
        became = "no data parallelism: every rank a stage" if alone else "one GPU: no sharding"
    for n in _DEGREES[:2]:
        key = found[n][0]
        if key is not None:
            b.read(key, became)
    if not b.has("parallelism.data_parallel_shard_degree") and sharded:
        b.default("parallelism.data_parallel_shard_degree", -1, f"{became} (torchtitan's default)")
    _accumulation(b, shard, replicate)
    if pipeline:
        _pipeline(b, found["pipeline_parallel_degree"], sharded)
    key = "parallelism.fsdp_reshard_after_forward"
    if pipeline and sharded and not b.has(key):
        flag = b.option("fsdp_reshard_after_forward", False, "torchtitan's default under PP")
        b.default(key, "default", f"{flag} (torchtitan's default policy: not pp_enabled)")
    elif b.has(key):
        value = str(b.get(key))
        pp = found["pipeline_parallel_degree"][1] > 1
        reshard = value == "always" or (value == "default" and not pp)
        b.read(
            key,
            b.option("fsdp_reshard_after_forward", reshard, f"{key}: {value}")
            if sharded and not reshard
            else f"--fsdp-reshard-after-forward {str(reshard).lower()}",
        )
    return sharded


_PP_SPLIT = (  # torchtitan's ways of choosing each stage's layers
    "pipeline_parallel_layers_per_stage",
    "pipeline_parallel_first_stage_less_layers",
    "pipeline_parallel_last_stage_less_layers",
    "pipeline_parallel_split_points",
    "module_fqns_per_model_part",
    "pipeline_parallel_schedule_csv",
)


def _pipeline(b: Builder, degree: tuple[str | None, int], sharded: bool) -> None:
    """pipeline_parallel_degree -> --pp N (--gpus N alone; `sharded`: --gpus was set from
    the degrees); pipeline_parallel_schedule (1F1B) -> --pp-schedule;
    pipeline_parallel_microbatch_size (1) -> --batch, with local_batch_size / it ->
    --microbatches (torchtitan's n_microbatches)."""
    key, pp = degree
    source = f"{key}: {pp}"
    flags = b.option("pp", pp, source)
    b.read(str(key), flags if sharded else flags + " " + b.option("gpus", pp, source))
    skey = next((f"{s}.pipeline_parallel_schedule" for s in _SECTIONS
                 if b.has(f"{s}.pipeline_parallel_schedule")), None)  # fmt: skip
    schedule = str(b.get(skey)) if skey else "1F1B"
    flag = b.option("pp_schedule", schedule.lower(), f"pipeline_parallel_schedule: {schedule}")
    if skey:
        b.read(skey, flag)
    else:
        b.default(
            "parallelism.pipeline_parallel_schedule", "1F1B", f"{flag} (torchtitan's default)"
        )
    mkey, micro = _degree(b, "pipeline_parallel_microbatch_size", 1)
    local = b.reading.sizes["B"]
    if micro < 1 or local % micro:
        raise ValueError(
            f"{mkey}: {micro} must divide training.local_batch_size {local} (torchtitan's "
            "n_microbatches = local_batch_size / pipeline_parallel_microbatch_size)"
        )
    text = (
        b.size("B", micro, f"pipeline_parallel_microbatch_size: {micro}") + " "
        + b.option("microbatches", local // micro, f"local_batch_size {local} / {micro}")
    )  # fmt: skip
    if mkey:
        b.read(mkey, text)
    else:
        b.default(
            "parallelism.pipeline_parallel_microbatch_size", 1, f"{text} (torchtitan's default)"
        )
    for name in _PP_SPLIT:
        k = next((f"{s}.{name}" for s in _SECTIONS if b.has(f"{s}.{name}")), None)
        if k is None:
            continue
        default = b.get(k) in (None, [], "") or (name.endswith("less_layers") and b.get(k) == 1)
        if default and pp == 2:
            b.read(k, "the even split memgnn runs (two stages: L/2 blocks each)")
        else:
            b.warn(
                f"{k}: {b.get(k)!r}: memgnn splits the blocks evenly (L/pp per stage, the "
                "first with the embeddings, the last with the norm and output); a split "
                "of unequal depth is not modelled yet: the answer is the even split's",
                key=k,
            )
    if pp > 2 and not any(b.has(f"{s}.{n}") for s in _SECTIONS for n in _PP_SPLIT):
        b.warn(
            f"pipeline_parallel_degree {pp}: torchtitan's default split counts the embeddings "
            "and the output as one layer each (first/last_stage_less_layers 1), which can "
            "give stages of unequal depth; the answer is memgnn's even split (L/pp blocks)"
        )


def _accumulation(b: Builder, shard: int, replicate: int) -> None:
    """global_batch_size / (local batch x data-parallel degree) micro-steps per step."""
    key = "training.global_batch_size"
    total = b.number(key) if b.has(key) else -1
    if total <= 0:
        if b.has(key):
            b.read(key, "-1: no accumulation (local batch x data-parallel degree)")
        return
    if shard < 0:
        b.warn(
            f"{key}: {total}: the accumulation steps need the data-parallel degree, which "
            "data_parallel_shard_degree -1 leaves to the launcher: give --grad-accum",
            key=key,
        )
        return
    per_step = b.reading.sizes["B"] * shard * max(replicate, 1)
    if total % per_step:
        raise ValueError(
            f"{key}: {total} is not a multiple of local batch x data-parallel degree ({per_step})"
        )
    b.read(
        key,
        b.option("grad_accum", total // per_step, f"{key}: {total}")
        + f" ({total} / ({b.reading.sizes['B']} x {shard * max(replicate, 1)}))",
    )


_MP_DTYPES = {"bfloat16": "bf16", "float32": "fp32"}


def _precision(b: Builder, sharded: bool) -> None:
    """training.dtype (the parameters') and the mixed-precision dtypes: under FSDP/HSDP
    torchtitan's apply_fsdp passes MixedPrecisionPolicy(param_dtype=mixed_precision_param,
    reduce_dtype=mixed_precision_reduce) to fully_shard (--fsdp-param-dtype /
    --fsdp-reduce-dtype); on one GPU or under DDP it runs the step under autocast
    (amp-bf16) with mixed_precision_param."""
    dtype = b.get("training.dtype", "float32")
    param_key, reduce_key = "training.mixed_precision_param", "training.mixed_precision_reduce"
    param, reduce = b.get(param_key, "bfloat16"), b.get(reduce_key, "float32")
    for key, value in ((param_key, param), (reduce_key, reduce)):
        if value not in _MP_DTYPES:
            raise ValueError(f"{key}: {value!r}; expected bfloat16 or float32")
    if dtype not in _MP_DTYPES:
        raise ValueError(f"training.dtype: {dtype!r}; expected float32 or bfloat16")
    if dtype == "bfloat16":
        precision = "bf16"
    elif sharded:
        precision = "fp32"  # fp32 shards; the policy below casts the gathered copies
    else:
        precision = {"bfloat16": "amp-bf16", "float32": "fp32"}[param]
    source = f"training.dtype: {dtype}"
    became = b.option("precision", precision, source)
    if b.has("training.dtype"):
        b.read("training.dtype", became)
    if sharded:
        policy = (
            b.option("fsdp_param_dtype", _MP_DTYPES[param], f"{param_key}: {param}")
            + " "
            + b.option("fsdp_reduce_dtype", _MP_DTYPES[reduce], f"{reduce_key}: {reduce}")
            + " (FSDP2's MixedPrecisionPolicy, as torchtitan's apply_fsdp)"
        )
        for key, value in ((param_key, param), (reduce_key, reduce)):
            if b.has(key):
                b.read(key, policy)
            else:
                b.default(key, value, f"{policy} (torchtitan's default)")
        return
    if b.has(param_key):
        b.read(param_key, became)
    elif dtype == "float32":
        b.default(param_key, "bfloat16", f"{became} (torchtitan's default)")
    if b.has(reduce_key):
        b.read(reduce_key, "no memory effect: no FSDP (autocast on one GPU or under DDP)")


def _checkpointing(b: Builder, layers: int | None) -> None:
    key, option_key = "activation_checkpoint.mode", "activation_checkpoint.selective_ac_option"
    mode, option = str(b.get(key, "selective")), str(b.get(option_key, "2"))
    checkpointing, why = None, ""
    if mode in ("none", "full"):
        checkpointing = mode
    elif mode == "selective" and option == "op":
        checkpointing = "selective-op"
    elif mode == "selective" and option.isdigit() and int(option) > 0:
        checkpointing = f"every:{option}" if int(option) > 1 else "full"
    else:
        why = f"{mode} checkpointing"
    if checkpointing is None:
        b.warn(
            f"{key}: {mode} ({option_key}: {option}): {why} is not modelled yet; the answer "
            "checkpoints nothing (an upper bound on saved activations)",
            key=key if b.has(key) else None,
        )
        if b.has(option_key):
            b.read(option_key, "see activation_checkpoint.mode")
        return
    became = b.option("checkpointing", checkpointing, f"{key}: {mode}, {option_key}: {option}")
    if checkpointing.startswith("every:"):
        became += f" (torchtitan's _apply_layer_sac: blocks {option}, {2 * int(option)}, ... of "
        became += f"{layers if layers is not None else 'the model'}, counted from 1)"
    elif checkpointing == "selective-op":
        became += " (torchtitan's _apply_op_sac policy on every block)"
    for k in (key, option_key):
        if b.has(k):
            b.read(
                k, became if mode == "selective" or k == key else "no memory effect: not selective"
            )
    if not b.has(key):
        b.default(key, "selective", f"{became} (torchtitan's default: selective, option 2)")


def _optimizer(b: Builder) -> None:
    key, impl_key = "optimizer.name", "optimizer.implementation"
    name, impl = str(b.get(key, "AdamW")), str(b.get(impl_key, "fused"))
    optimizer = {"AdamW": "adamw", "Adam": "adam"}.get(name)
    if optimizer is None:
        b.warn(
            f"{key}: {name}: this optimizer is not modelled yet; the answer assumes torch AdamW",
            key=key if b.has(key) else None,
        )
        if b.has(impl_key):
            b.no_effect(impl_key, f"an implementation of {name}")
        return
    if impl not in ("fused", "foreach", "for-loop"):
        raise ValueError(f"{impl_key}: {impl!r}; expected fused, foreach or for-loop")
    became = b.option("optimizer", optimizer, f"{key}: {name}")
    became += " " + b.option("optimizer_impl", impl, f"{impl_key}: {impl}")
    if b.has(key):
        b.read(key, became)
    if b.has(impl_key):
        b.read(impl_key, became)
    else:
        b.default(impl_key, "fused", f"{became} (torchtitan's default)")


# torchtitan's model converter names for float8 Linear training (the older `float8`, and
# `quantize.linear.float8` since the quantize.* sections) and their config sections
FLOAT8_CONVERTERS = {"float8": "float8", "quantize.linear.float8": "quantize.linear.float8"}
# torchtitan's llama/qwen module names -> the transformers class memgnn captures instead
_TITAN_TO_HF = {
    "attention.wq": "self_attn.q_proj", "attention.wk": "self_attn.k_proj",
    "attention.wv": "self_attn.v_proj", "attention.wo": "self_attn.o_proj",
    "feed_forward.w1": "mlp.gate_proj", "feed_forward.w2": "mlp.down_proj",
    "feed_forward.w3": "mlp.up_proj", "output": "output",
}  # fmt: skip


def _float8_filter(b: Builder, key: str) -> str:
    """torchtitan's filter_fqns (default: none) as --float8-filter-fqns: its module names
    in the transformers class's spelling; `output` is the output head either way."""
    value = b.get(key) or []
    names = value.split(",") if isinstance(value, str) else [str(v) for v in value]
    names = [n.strip() for n in names if n.strip()]
    if "auto_filter_small_kn" in names:
        names.remove("auto_filter_small_kn")
        b.warn(
            f"{key}: auto_filter_small_kn (torchao's size heuristics) is not modelled; the "
            "answer converts every Linear with dims divisible by 16",
        )
    return ",".join(_TITAN_TO_HF.get(n, n) for n in names)


def _float8(b: Builder, section: str, source: str) -> str:
    """The float8 converter's section: recipe (None: torchao's default config, tensorwise)
    and filter as --float8 / --float8-filter-fqns; the FSDP float8 all-gather and emulation
    are not modelled (warned)."""
    recipe_key, filter_key = f"{section}.recipe_name", f"{section}.filter_fqns"
    recipe = b.get(recipe_key) or "tensorwise"
    if recipe not in FLOAT8_RECIPES[1:]:
        raise ValueError(f"{recipe_key}: {recipe!r}; expected one of {FLOAT8_RECIPES[1:]}")
    became = b.option("float8", recipe, source)
    if b.has(recipe_key):
        b.read(recipe_key, became)
    else:
        b.default(recipe_key, None, f"{became} (torchao's default Float8LinearConfig)")
    fqns = _float8_filter(b, filter_key)
    became_filter = b.option("float8_filter_fqns", fqns, f"{filter_key}: {b.get(filter_key)}")
    if b.has(filter_key):
        b.read(filter_key, became_filter)
    else:
        b.default(filter_key, [], f"{became_filter} (none filtered)")
    _float8_all_gather(b, section, recipe_key)
    for name, what, assumes in (
        ("emulate", "torchao's emulated float8 gemm", "the _scaled_mm path"),
        ("force_recompute_fp8_weight_in_bwd", "recomputing the float8 weight in backward",
         "eager torchao 0.18 (high-precision weight saved, recast in backward)"),
    ):  # fmt: skip
        key = f"{section}.{name}"
        if b.has(key):
            b.feature(key, what, assumes)
    return became


def _float8_all_gather(b: Builder, section: str, recipe_key: str) -> None:
    """enable_fsdp_float8_all_gather and precompute_float8_dynamic_scale_for_fsdp as
    torchtitan's Float8 converter takes them: the all-gather only when FSDP shards
    (dp_shard_enabled) and no recipe_name is given (torchtitan asserts against both), the
    precomputed scales only with the float8 all-gather."""
    gather_key = f"{section}.enable_fsdp_float8_all_gather"
    scale_key = f"{section}.precompute_float8_dynamic_scale_for_fsdp"
    gather = b.has(gather_key) and not is_off(b.flat[gather_key])
    if gather and b.has(recipe_key):
        raise ValueError(
            f"{gather_key}: true with {recipe_key}: {b.get(recipe_key)!r}: torchtitan refuses "
            "the float8 all-gather with a recipe (tensorwise without recipe_name only)"
        )
    sharded = b.reading.options.get("sharding") in ("fsdp", "hsdp")
    if b.has(gather_key):
        if gather and sharded:
            b.read(gather_key, b.option("float8_fsdp_all_gather", True, f"{gather_key}: true"))
        else:
            b.read(gather_key, "off" if not gather else
                   "no float8 all-gather (FSDP does not shard: torchtitan's needs "
                   "dp_shard_enabled)")  # fmt: skip
    if b.has(scale_key):
        scale = not is_off(b.flat[scale_key])
        if scale and gather and sharded:
            b.read(scale_key, b.option("float8_precompute_scale", True, f"{scale_key}: true"))
        else:
            b.read(scale_key, "off" if not scale else
                   "no precomputed scales (torchtitan's need the float8 all-gather)")  # fmt: skip


def _converters(b: Builder) -> None:
    key = "model.converters"
    converters = b.get(key) or []
    converters = converters.split(",") if isinstance(converters, str) else list(converters)
    converters = [str(c).strip() for c in converters if str(c).strip()]
    float8 = [c for c in converters if c in FLOAT8_CONVERTERS]
    other = [c for c in converters if c not in FLOAT8_CONVERTERS]
    section = None
    if float8:  # the section the file writes (torchtitan moved [float8] to quantize.*)
        written = [
            s for s in FLOAT8_CONVERTERS.values() if any(k.startswith(f"{s}.") for k in b.flat)
        ]
        section = written[0] if written else FLOAT8_CONVERTERS[float8[0]]
        became = _float8(b, section, f"{key}: {float8[0]}")
    if b.has(key):
        if other:
            b.warn(
                f"{key}: {other}: MX / other quantised training (low-precision Linear layers) "
                "is not modelled yet; the answer runs bf16/fp32 Linear layers",
                key=key,
            )
        else:
            b.read(key, became if float8 else "none")
    for k in [k for k in b.unhandled() if k.startswith(("float8.", "mx.", "quantize."))]:
        if section is not None and k.startswith(f"{section}."):
            b.warn(f"{k}: {b.get(k)}: a setting of the float8 converter (not modelled)", key=k)
        elif other and not is_off(b.get(k)) and not k.startswith(tuple(FLOAT8_CONVERTERS)):
            b.warn(f"{k}: {b.get(k)}: a setting of the MX converters (not modelled)", key=k)
        else:
            b.no_effect(
                k,
                "no converter is enabled (model.converters)"
                if not converters
                else "not a section of the enabled converters",
            )
