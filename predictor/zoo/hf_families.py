"""The transformers families: gpt2, llama, bert, t5, vit and mixtral, each a small config
built offline with `from_config` (see hf.py). Factories check values and need transformers
installed (ValueError otherwise); nothing here imports transformers at module import.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from functools import partial
from typing import Any

from memgnn.predictor.spec.bundle import ModelBundle
from torch import nn

from .hf import (
    build_named,
    causal_inputs,
    hf_step,
    masked_inputs,
    require_transformers,
    seq2seq_inputs,
)
from .layers import image_inputs
from .registry import Family, check_choice, check_divides, check_float, check_ints

logger = logging.getLogger(__name__)

EXPERTS_IMPLS = ("eager", "batched_mm", "grouped_mm")


def _check_attention(name: str, hp: Mapping[str, Any], *extra: str) -> None:
    check_ints(name, hp, "layers", "hidden", "heads", *extra)
    check_divides(name, hp, "heads", "hidden")


def _bundle(
    name: str,
    hp: dict[str, Any],
    build: Any,
    inputs: Any,
    dims: dict[str, int],
    blocks: Any = None,
    remake: Any = None,
) -> ModelBundle:
    """`remake(hp)` (a family whose layers are all alike): the depth knob, hp["layers"]."""
    require_transformers()
    return ModelBundle(
        name=name,
        family=name,
        build=build,
        make_inputs=inputs,
        loss=hf_step,
        dims=dict(dims),
        hparams=dict(hp),
        blocks=blocks,
        layers=hp["layers"] if remake is not None else None,
        with_layers=partial(_at_depth, remake, dict(hp)) if remake is not None else None,
    )


def _at_depth(remake: Any, hp: dict[str, Any], n: int) -> ModelBundle:
    """The family's bundle with `n` layers (a module-level function: bundles pickle)."""
    return remake(hp | {"layers": n})


def make_gpt2(hp: dict[str, Any]) -> ModelBundle:
    _check_attention("gpt2", hp, "vocab", "max_positions")
    check_float("gpt2", hp, "dropout")
    kwargs = dict(
        n_layer=hp["layers"],
        n_embd=hp["hidden"],
        n_head=hp["heads"],
        vocab_size=hp["vocab"],
        n_positions=hp["max_positions"],
        resid_pdrop=hp["dropout"],
        embd_pdrop=hp["dropout"],
        attn_pdrop=hp["dropout"],
        bos_token_id=hp["vocab"] - 1,
        eos_token_id=hp["vocab"] - 1,
    )
    build = partial(build_named, "GPT2Config", kwargs, "causal-lm")
    inputs = partial(causal_inputs, vocab=hp["vocab"])
    return _bundle("gpt2", hp, build, inputs, GPT2.dims, remake=make_gpt2)


def _llama_like(name: str, hp: Mapping[str, Any]) -> dict[str, Any]:
    _check_attention(name, hp, "kv_heads", "ffn", "vocab", "max_positions")
    check_divides(name, hp, "kv_heads", "heads")
    if (hp["hidden"] // hp["heads"]) % 2:
        raise ValueError(f"{name}: head dim hidden/heads must be even for rotary embeddings")
    return dict(
        num_hidden_layers=hp["layers"],
        hidden_size=hp["hidden"],
        num_attention_heads=hp["heads"],
        num_key_value_heads=hp["kv_heads"],
        intermediate_size=hp["ffn"],
        vocab_size=hp["vocab"],
        max_position_embeddings=hp["max_positions"],
        bos_token_id=0,
        eos_token_id=1,
    )


def make_llama(hp: dict[str, Any]) -> ModelBundle:
    kwargs = _llama_like("llama", hp)
    build = partial(build_named, "LlamaConfig", kwargs, "causal-lm")
    inputs = partial(causal_inputs, vocab=hp["vocab"])
    return _bundle("llama", hp, build, inputs, LLAMA.dims, remake=make_llama)


def make_mixtral(hp: dict[str, Any]) -> ModelBundle:
    kwargs = _llama_like("mixtral", hp)
    check_ints("mixtral", hp, "experts", "top_k")
    if hp["top_k"] > hp["experts"]:
        raise ValueError(f"mixtral: top_k={hp['top_k']} exceeds experts={hp['experts']}")
    impl = check_choice("mixtral", hp, "experts_impl", EXPERTS_IMPLS)
    kwargs.update(
        num_local_experts=hp["experts"], num_experts_per_tok=hp["top_k"], output_router_logits=True
    )
    build = partial(build_named, "MixtralConfig", kwargs, "causal-lm", impl)
    return _bundle("mixtral", hp, build, partial(causal_inputs, vocab=hp["vocab"]), MIXTRAL.dims)


def make_bert(hp: dict[str, Any]) -> ModelBundle:
    _check_attention("bert", hp, "ffn", "vocab", "max_positions")
    check_float("bert", hp, "dropout")
    kwargs = dict(
        num_hidden_layers=hp["layers"],
        hidden_size=hp["hidden"],
        num_attention_heads=hp["heads"],
        intermediate_size=hp["ffn"],
        vocab_size=hp["vocab"],
        max_position_embeddings=hp["max_positions"],
        hidden_dropout_prob=hp["dropout"],
        attention_probs_dropout_prob=hp["dropout"],
        pad_token_id=0,
    )
    build = partial(build_named, "BertConfig", kwargs, "masked-lm")
    return _bundle("bert", hp, build, partial(masked_inputs, vocab=hp["vocab"]), BERT.dims)


def t5_blocks(model: nn.Module) -> list[nn.Module]:
    return [*model.encoder.block, *model.decoder.block]


def make_t5(hp: dict[str, Any]) -> ModelBundle:
    _check_attention("t5", hp, "ffn", "vocab")
    check_float("t5", hp, "dropout")
    kwargs = dict(
        num_layers=hp["layers"],
        num_decoder_layers=hp["layers"],
        d_model=hp["hidden"],
        d_kv=hp["hidden"] // hp["heads"],
        num_heads=hp["heads"],
        d_ff=hp["ffn"],
        vocab_size=hp["vocab"],
        dropout_rate=hp["dropout"],
        decoder_start_token_id=0,
        pad_token_id=0,
        eos_token_id=1,
    )
    build = partial(build_named, "T5Config", kwargs, "seq2seq")
    return _bundle(
        "t5", hp, build, partial(seq2seq_inputs, vocab=hp["vocab"]), T5.dims, blocks=t5_blocks
    )


def make_vit(hp: dict[str, Any]) -> ModelBundle:
    _check_attention("vit", hp, "ffn", "image", "patch", "classes")
    check_divides("vit", hp, "patch", "image")
    check_float("vit", hp, "dropout")
    kwargs = dict(
        num_hidden_layers=hp["layers"],
        hidden_size=hp["hidden"],
        num_attention_heads=hp["heads"],
        intermediate_size=hp["ffn"],
        image_size=hp["image"],
        patch_size=hp["patch"],
        num_labels=hp["classes"],
        hidden_dropout_prob=hp["dropout"],
        attention_probs_dropout_prob=hp["dropout"],
    )
    build = partial(build_named, "ViTConfig", kwargs, "image-cls")
    inputs = partial(image_inputs, channels=3, image=hp["image"], classes=hp["classes"])
    return _bundle("vit", hp, build, inputs, VIT.dims)


_WIDTH = [96, 192, 384, 768]  # every width divides by every head count below
_HEADS = [2, 4, 6, 12]

GPT2 = Family(
    name="gpt2",
    family="gpt2",
    source="transformers",
    task="causal-lm",
    defaults=dict(layers=2, hidden=64, heads=4, vocab=512, max_positions=1024, dropout=0.1),
    ranges=dict(
        layers=[2, 4, 6, 8, 12],
        hidden=_WIDTH,
        heads=_HEADS,
        vocab=[512, 4096, 16384, 50257],
        dropout=[0.0, 0.1],
    ),
    dims={"B": 4, "S": 64},
    factory=make_gpt2,
    description="GPT2LMHeadModel",
)
LLAMA = Family(
    name="llama",
    family="llama",
    source="transformers",
    task="causal-lm",
    defaults=dict(layers=2, hidden=64, heads=4, kv_heads=2, ffn=172, vocab=512, max_positions=2048),
    ranges=dict(
        layers=[2, 4, 8, 12],
        hidden=_WIDTH,
        heads=_HEADS,
        kv_heads=[1, 2],
        ffn=[256, 512, 1024, 2048],
        vocab=[512, 4096, 32000],
    ),
    dims={"B": 4, "S": 64},
    factory=make_llama,
    description="LlamaForCausalLM (GQA, RoPE)",
)
BERT = Family(
    name="bert",
    family="bert",
    source="transformers",
    task="masked-lm",
    defaults=dict(layers=2, hidden=64, heads=4, ffn=256, vocab=512, max_positions=512, dropout=0.1),
    ranges=dict(
        layers=[2, 4, 6, 12],
        hidden=_WIDTH,
        heads=_HEADS,
        ffn=[256, 1024, 3072],
        vocab=[512, 8192, 30522],
        dropout=[0.0, 0.1],
    ),
    dims={"B": 4, "S": 64},
    factory=make_bert,
    description="BertForMaskedLM",
)
T5 = Family(
    name="t5",
    family="t5",
    source="transformers",
    task="seq2seq",
    defaults=dict(layers=2, hidden=64, heads=4, ffn=256, vocab=512, dropout=0.1),
    ranges=dict(
        layers=[2, 4, 6, 12],
        hidden=_WIDTH,
        heads=_HEADS,
        ffn=[256, 1024, 2048, 3072],
        vocab=[512, 8192, 32128],
        dropout=[0.0, 0.1],
    ),
    dims={"B": 4, "S": 64, "T": 32},
    factory=make_t5,
    description="T5ForConditionalGeneration; S encoder length, T decoder length",
)
VIT = Family(
    name="vit",
    family="vit",
    source="transformers",
    task="image-cls",
    defaults=dict(
        layers=2, hidden=64, heads=4, ffn=256, image=32, patch=8, classes=10, dropout=0.0
    ),
    ranges=dict(
        layers=[2, 4, 6, 12],
        hidden=_WIDTH,
        heads=_HEADS,
        ffn=[256, 1024, 3072],
        image=[32, 64, 128, 224],
        patch=[8, 16],
        classes=[10, 100, 1000],
    ),
    dims={"B": 4},
    factory=make_vit,
    description="ViTForImageClassification",
)
MIXTRAL = Family(
    name="mixtral",
    family="mixtral",
    source="transformers",
    task="causal-lm",
    defaults=dict(
        layers=2,
        hidden=64,
        heads=4,
        kv_heads=2,
        ffn=128,
        experts=4,
        top_k=2,
        vocab=512,
        max_positions=2048,
        experts_impl="eager",
    ),
    ranges=dict(
        layers=[2, 4, 8],
        hidden=_WIDTH,
        heads=_HEADS,
        kv_heads=[1, 2],
        ffn=[256, 512, 1024],
        experts=[4, 8],
        top_k=[1, 2],
        vocab=[512, 4096, 32000],
        experts_impl=["eager", "batched_mm"],
    ),
    dims={"B": 4, "S": 64},
    factory=make_mixtral,
    description="MixtralForCausalLM (top-k MoE, router aux loss); experts_impl eager routes "
    "tokens data-dependently, batched_mm runs every expert on every token",
)
FAMILIES = (GPT2, LLAMA, BERT, T5, VIT, MIXTRAL)
