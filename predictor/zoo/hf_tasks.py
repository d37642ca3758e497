"""Which transformers class a config trains as: the task its `architectures` name, and the
`AutoModelFor<task>` class for it. Shared by `zoo.hf` (building) and `zoo.hub` (the
catalog's parameter counts); transformers itself is imported when first needed."""

from __future__ import annotations

from typing import Any

__all__ = [
    "AUTO_CLASSES",
    "HF_TASKS",
    "check_task",
    "infer_task",
    "model_class",
    "require_transformers",
]


AUTO_CLASSES = {
    "causal-lm": "AutoModelForCausalLM",
    "seq-cls": "AutoModelForSequenceClassification",
    "masked-lm": "AutoModelForMaskedLM",
    "seq2seq": "AutoModelForSeq2SeqLM",
    "image-cls": "AutoModelForImageClassification",
}

HF_TASKS = tuple(AUTO_CLASSES)


def require_transformers() -> Any:
    """The transformers module, or a ValueError saying how to get it."""
    try:
        import transformers
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ValueError(
            "this model needs Hugging Face transformers: install memgnn[transformers]"
        ) from exc
    return transformers


def model_class(config: Any, task: str) -> type:
    """The transformers class `AutoModelFor<task>` builds for `config`; a ValueError names
    the tasks the config does support when it has none for `task`. Imports the model's
    modeling code (about 1 s for a Llama): `check_task` checks without it."""
    check_task(config, task)
    return getattr(require_transformers(), AUTO_CLASSES[task])._model_mapping[type(config)]


def check_task(config: Any, task: str) -> None:
    """`model_class`'s ValueError where `config` has no model for `task`, without importing
    the modeling code (the auto classes' lazy mappings test membership by name)."""
    tf = require_transformers()
    if type(config) in getattr(tf, AUTO_CLASSES[task])._model_mapping:
        return
    valid = [
        t for t, name in AUTO_CLASSES.items() if type(config) in getattr(tf, name)._model_mapping
    ]
    raise ValueError(
        f"{type(config).__name__} has no {AUTO_CLASSES[task]} class (task {task!r}); "
        f"tasks it supports: {', '.join(valid) or 'none of ' + ', '.join(HF_TASKS)}"
    )


_ARCH_SUFFIXES = (
    ("ForCausalLM", "causal-lm"),
    ("LMHeadModel", "causal-lm"),
    ("ForMaskedLM", "masked-lm"),
    ("ForSequenceClassification", "seq-cls"),
    ("ForImageClassification", "image-cls"),
    ("ForConditionalGeneration", "seq2seq"),
)


def infer_task(config: Any) -> str:
    """The task a config's `architectures` names; else seq2seq/causal-lm by its shape.

    `*ForConditionalGeneration` is seq2seq only for an encoder-decoder config (T5, BART);
    a decoder-only one (Gemma 3, LLaVA) trains as causal-lm, its text batch through the
    language model. A bare backbone (`Dinov2Model`, `SiglipModel`) whose config has an
    image classifier and no language-model head is image-cls."""
    encoder_decoder = bool(getattr(config, "is_encoder_decoder", False))
    for arch in getattr(config, "architectures", None) or []:
        for suffix, task in _ARCH_SUFFIXES:
            if arch.endswith(suffix):
                if task == "seq2seq" and not encoder_decoder:
                    return "causal-lm"
                return task
    if encoder_decoder:
        return "seq2seq"
    tf = require_transformers()
    if type(config) in tf.AutoModelForImageClassification._model_mapping and (
        type(config) not in tf.AutoModelForCausalLM._model_mapping
    ):
        return "image-cls"
    return "causal-lm"
