"""Hugging Face transformers models, built offline: `AutoModelFor*.from_config` on a config
(no download, no weights). The runtime the transformers families (`hf_families.py`) share,
and `hf:PATH/config.json` specs.

transformers is optional: it is imported inside the factories, never at module import, and a
missing install is a ValueError telling the user to install memgnn[transformers].

Causal-LM batches carry `shift_labels` next to `labels`: the models then skip the
`F.pad(labels, (0, 1))` in transformers' ForCausalLMLoss, which (torch 2.13) specializes
symbolic B and S under a plain FakeTensorMode. The loss computed is the same.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import inspect
import json
import logging
from collections.abc import Mapping
from contextlib import nullcontext
from functools import partial
from typing import Any

import torch
from memgnn.predictor.spec.bundle import ModelBundle
from torch import nn

from .hf_tasks import (
    AUTO_CLASSES,
    HF_TASKS,
    check_task,
    infer_task,
    model_class,
    require_transformers,
)
from .hub import resolve_config_file
from .layers import IGNORE_INDEX, fake_mode_active, image_inputs, shifted_labels
from .registry import coerce_like

logger = logging.getLogger(__name__)

MLM_EVERY = 7  # masked-LM batches label every 7th position (~15%), deterministically


def attention_for(config: Any, task: str) -> str:
    """SDPA where the model class declares support for it (`_supports_sdpa`), else eager."""
    return "sdpa" if getattr(model_class(config, task), "_supports_sdpa", False) else "eager"


def build_hf(config: Any, task: str, experts_impl: str | None = None) -> nn.Module:
    """`AutoModelFor<task>.from_config(config)` with SDPA attention where the class has it.

    Parameters are built in the default dtype the caller set (the training spec's, see
    `predictor.capture.capture.step`), never in the config's own `torch_dtype`/`dtype`: a Hub config
    records the dtype its checkpoint was saved in, not how it is trained.
    Under a fake-tensor mode the weights are not initialized (values are meaningless
    there, and torch 2.13's trunc_normal_ branches on data); tied weights stay tied.
    """
    tf = require_transformers()
    auto = getattr(tf, AUTO_CLASSES[task])
    config = copy.deepcopy(config)
    attention = attention_for(config, task)
    kwargs: dict[str, Any] = {"attn_implementation": attention, "dtype": torch.get_default_dtype()}
    if experts_impl is not None:
        kwargs["experts_implementation"] = experts_impl
    fake = fake_mode_active()
    if fake:
        from transformers.initialization import no_init_weights

        ctx: Any = no_init_weights()
    else:
        ctx = nullcontext()
    with ctx:
        model = auto.from_config(config, **kwargs)
    logger.debug("built %s with %s attention", type(model).__name__, attention)
    if fake:
        model.tie_weights()
    model.train()
    return model


def _make_config(class_name: str, kwargs: dict[str, Any]) -> Any:
    return getattr(require_transformers(), class_name)(**kwargs)


def build_named(
    class_name: str, kwargs: dict[str, Any], task: str, experts_impl: str | None = None
) -> nn.Module:
    return build_hf(_make_config(class_name, kwargs), task, experts_impl)


@functools.cache
def _takes_kwargs(model_type: type) -> bool:
    params = inspect.signature(model_type.forward).parameters.values()
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def hf_step(model: nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """`model(**inputs).loss` (shift_labels dropped for a forward that cannot take it)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft
    if "shift_labels" in inputs and not _takes_kwargs(type(base)):
        inputs = {k: v for k, v in inputs.items() if k != "shift_labels"}
    return model(**inputs).loss


# ---- input makers (from sizes only) ---------------------------------------------------------


def causal_inputs(
    sizes: Mapping[str, Any], device: torch.device, float_dtype: torch.dtype, *, vocab: int
) -> dict[str, torch.Tensor]:
    ids = torch.randint(0, vocab, (sizes["B"], sizes["S"]), device=device)
    return {"input_ids": ids, "labels": ids, "shift_labels": shifted_labels(ids)}


def masked_inputs(
    sizes: Mapping[str, Any], device: torch.device, float_dtype: torch.dtype, *, vocab: int
) -> dict[str, torch.Tensor]:
    ids = torch.randint(0, vocab, (sizes["B"], sizes["S"]), device=device)
    unlabelled = (torch.arange(sizes["S"], device=device) % MLM_EVERY) != 0
    return {"input_ids": ids, "labels": ids.masked_fill(unlabelled, IGNORE_INDEX)}


def seq2seq_inputs(
    sizes: Mapping[str, Any], device: torch.device, float_dtype: torch.dtype, *, vocab: int
) -> dict[str, torch.Tensor]:
    ids = torch.randint(0, vocab, (sizes["B"], sizes["S"]), device=device)
    labels = torch.randint(0, vocab, (sizes["B"], sizes["T"]), device=device)
    return {"input_ids": ids, "labels": labels}


def seq_cls_inputs(
    sizes: Mapping[str, Any],
    device: torch.device,
    float_dtype: torch.dtype,
    *,
    vocab: int,
    classes: int,
) -> dict[str, torch.Tensor]:
    ids = torch.randint(0, vocab, (sizes["B"], sizes["S"]), device=device)
    return {"input_ids": ids, "labels": torch.randint(0, classes, (sizes["B"],), device=device)}


# ---- hf:PATH/config.json ---------------------------------------------------------------------


def _text_field(config: Any, key: str) -> Any:
    """`config.<key>`, else the text config's (a vision-language config such as Gemma 3's
    keeps its language model's vocab_size and positions in `text_config`)."""
    value = getattr(config, key, None)
    if value is None:
        value = getattr(getattr(config, "text_config", None), key, None)
    return value


def _max_positions(config: Any) -> int | None:
    for key in ("max_position_embeddings", "n_positions", "max_seq_len"):
        value = _text_field(config, key)
        if isinstance(value, int) and value > 0:
            return value
    return None


def bundle_from_config_file(
    path: str, task: str | None = None, overrides: Mapping[str, str] | None = None
) -> ModelBundle:
    """A bundle for a transformers config.json, built offline: `path` is a file, a folder
    holding one, or a Hub name (`ORG/NAME`) from the bundled catalog or the local HF cache
    (`hub.resolve_config_file`).

    `overrides` (CLI model args) set config attributes, converted to each attribute's type.
    """
    if task is not None and task not in HF_TASKS:
        raise ValueError(f"unknown task {task!r} for hf: models; expected one of {HF_TASKS}")
    file = resolve_config_file(path)
    tf = require_transformers()
    try:
        config = tf.AutoConfig.from_pretrained(str(file), local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:
        raise ValueError(f"cannot read hf config {path}: {exc}") from exc
    for key, raw in (overrides or {}).items():
        if not hasattr(config, key):
            raise ValueError(
                f"unknown model arg {key!r}: {type(config).__name__} has no such field"
            )
        setattr(config, key, coerce_like(getattr(config, key), raw, key))
    task = task or infer_task(config)
    check_task(config, task)  # the config has a model for this task (else: which tasks)
    bundle = _bundle_from_config(config, task, str(file), path, overrides)
    layers = repeated_layers(config)
    if layers is None:
        return bundle
    return dataclasses.replace(
        bundle,
        layers=layers,
        with_layers=partial(_at_depth, config, task, str(file), path, overrides),
    )


# Config fields that make some layers differ from the others (dense layers among MoE ones,
# interleaved attention kinds); a value in _UNIFORM means every layer is alike.
_PER_LAYER_KEYS = (
    "first_k_dense_replace",
    "moe_layer_freq",
    "decoder_sparse_step",
    "interleave_moe_layer_step",
    "mlp_only_layers",
    "sliding_window_pattern",
    "cross_attention_layers",
    "no_rope_layer_interval",
    "attention_layers",
    # hybrid attention / state-space models: which layers attend, which carry experts
    "attn_layer_indices",  # Bamba
    "attn_layer_period",  # Jamba (attention every period-th layer, from the offset)
    "attn_layer_offset",
    "expert_layer_period",
    "expert_layer_offset",
    "hybrid_override_pattern",  # Nemotron-H ("M-M-M*-...")
    "hybrid_layer_ids",  # Zamba2
    "full_attn_idxs",  # LFM2
)
_UNIFORM = (None, 0, 1, False, [], ())
# per-layer kind lists cycled over the layers (RecurrentGemma's 3-long `block_types`):
# any two kinds make the layers differ, whatever the list's length
_KIND_LISTS = ("layer_types", "layers_block_type", "block_types", "mlp_layer_types")


def repeated_layers(config: Any) -> int | None:
    """`num_hidden_layers` when every decoder layer the config builds is alike (no
    per-layer lists with different entries, no interleaving fields); else None."""
    if getattr(config, "is_encoder_decoder", False):
        return None
    n = getattr(config, "num_hidden_layers", None)
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        return None
    for key in _PER_LAYER_KEYS:
        value = getattr(config, key, None)
        if not any(value is u or value == u for u in _UNIFORM):
            return None
    for key in _KIND_LISTS:
        value = getattr(config, key, None)
        if isinstance(value, list | tuple) and len({repr(v) for v in value}) > 1:
            return None
    for value in config.to_dict().values():
        if isinstance(value, list) and len(value) == n and len({repr(v) for v in value}) > 1:
            return None
    return n


def _at_depth(
    config: Any, task: str, file: str, path: str, overrides: Mapping[str, str] | None, n: int
) -> ModelBundle:
    """The same model with `n` decoder layers (per-layer lists cut to n)."""
    config = copy.deepcopy(config)
    full = config.num_hidden_layers
    for key, value in config.to_dict().items():
        if isinstance(value, list) and len(value) == full and hasattr(config, key):
            setattr(config, key, value[:n])
    config.num_hidden_layers = n
    return _bundle_from_config(config, task, file, path, overrides)


def _bundle_from_config(
    config: Any, task: str, file: str, path: str, overrides: Mapping[str, str] | None
) -> ModelBundle:
    if task == "seq-cls" and getattr(config, "pad_token_id", None) is None:
        # Sequence classifiers pool the last non-pad token and need a pad id for batches > 1.
        config.pad_token_id = getattr(config, "eos_token_id", None) or 0
        if isinstance(config.pad_token_id, list):
            config.pad_token_id = config.pad_token_id[0]
    hparams = {"config": file, "task": task, **dict(overrides or {})}
    build = partial(build_hf, config, task)
    name = f"hf:{path}"
    family = str(getattr(config, "model_type", "") or "hf")
    common = dict(name=name, family=family, build=build, loss=hf_step, hparams=hparams)
    # what was read, overrides applied: an edited config.json is a different model
    common["fingerprint"] = json.dumps(
        {"task": task, "config": config.to_dict()}, sort_keys=True, default=str
    )
    stored = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    common["stored_dtype"] = str(stored).replace("torch.", "") if stored else None
    if task == "image-cls":
        # a composite config (SigLIP) keeps the image fields in its vision_config
        vision = getattr(config, "vision_config", None) or config
        image = getattr(config, "image_size", None) or getattr(vision, "image_size", 224)
        image = image if isinstance(image, int) else int(image[0])
        channels = getattr(config, "num_channels", None) or getattr(vision, "num_channels", 3)
        inputs = partial(
            image_inputs,
            channels=int(channels),
            image=image,
            classes=int(config.num_labels),
        )
        return ModelBundle(make_inputs=inputs, dims={"B": 4}, **common)
    vocab = _text_field(config, "vocab_size")
    if not isinstance(vocab, int) or vocab < 1:
        raise ValueError(f"hf config {path} has no vocab_size; cannot make token inputs")
    seq = min(128, _max_positions(config) or 128)
    dims = {"B": 4, "S": seq}
    if task == "causal-lm":
        inputs: Any = partial(causal_inputs, vocab=vocab)
    elif task == "masked-lm":
        inputs = partial(masked_inputs, vocab=vocab)
    elif task == "seq-cls":
        inputs = partial(seq_cls_inputs, vocab=vocab, classes=int(config.num_labels))
    else:
        inputs = partial(seq2seq_inputs, vocab=vocab)
        dims["T"] = max(1, seq // 2)
    return ModelBundle(make_inputs=inputs, dims=dims, **common)
