"""In-house transformer families with static control flow: `varlen`, a causal LM over a
right-padded batch whose per-sample lengths come from the sizes alone.

`make_inputs` builds lengths deterministically: sample i of B has length
S - (i * (S // 2)) // B, so lengths fall from S to just over S/2 across the batch. The model
turns them into a key-padding mask combined with the causal mask (a boolean (B, 1, S, S)
attention mask for SDPA) and the loss ignores padded positions.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from memgnn.predictor.spec.bundle import ModelBundle

from .layers import (
    IGNORE_INDEX,
    TransformerLM,
    check_transformer,
    shifted_labels,
    transformer_blocks,
    transformer_lm,
)
from .registry import Family, check_float

logger = logging.getLogger(__name__)


def padding_lengths(batch: Any, seq: Any, device: torch.device) -> torch.Tensor:
    """Per-sample lengths in (S/2, S], from the sizes only (ints or SymInts)."""
    return seq - (torch.arange(batch, device=device) * (seq // 2)) // batch


def varlen_inputs(
    sizes: Mapping[str, Any], device: torch.device, float_dtype: torch.dtype, *, vocab: int
) -> dict[str, torch.Tensor]:
    batch, seq = sizes["B"], sizes["S"]
    ids = torch.randint(0, vocab, (batch, seq), device=device)
    return {"input_ids": ids, "lengths": padding_lengths(batch, seq, device)}


def valid_tokens(lengths: torch.Tensor, seq: Any) -> torch.Tensor:
    """(B, S) bool: position s of sample b is a real token (s < lengths[b])."""
    return torch.arange(seq, device=lengths.device)[None, :] < lengths[:, None]


class VarLenLM(TransformerLM):
    """A causal LM over a right-padded batch: padded keys are masked out in every block."""

    def forward(self, input_ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        seq = input_ids.shape[1]
        pos = torch.arange(seq, device=input_ids.device)
        causal = pos[None, :] <= pos[:, None]  # (S, S): query row sees keys up to itself
        keys = valid_tokens(lengths, seq)
        # Key 0 is always real (lengths >= 1), so no query row is fully masked.
        mask = keys[:, None, None, :] & causal
        x = self.embed(input_ids)
        for block in self.blocks:
            x = block(x, mask)
        return self.head(x)


def varlen_step(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    ids, lengths = inputs["input_ids"], inputs["lengths"]
    logits = model(ids, lengths)
    labels = ids.masked_fill(~valid_tokens(lengths, ids.shape[1]), IGNORE_INDEX)
    return F.cross_entropy(
        logits.flatten(0, 1).float(), shifted_labels(labels).flatten(), ignore_index=IGNORE_INDEX
    )


def make_varlen(hp: dict[str, Any]) -> ModelBundle:
    check_transformer("varlen", hp)
    dropout = check_float("varlen", hp, "dropout")
    build = partial(transformer_lm, dict(hp), VarLenLM, dropout=dropout)
    return ModelBundle(
        name="varlen",
        family="varlen",
        build=build,
        make_inputs=partial(varlen_inputs, vocab=hp["vocab"]),
        loss=varlen_step,
        dims=dict(VARLEN.dims),
        hparams=dict(hp),
        blocks=transformer_blocks,
    )


_TRANSFORMER_RANGES = dict(
    layers=[2, 4, 6, 12],
    hidden=[96, 192, 384, 768],
    heads=[2, 4, 6, 12],
    ffn=[256, 1024, 2048, 3072],
    vocab=[512, 8192, 32000],
)
VARLEN = Family(
    name="varlen",
    family="varlen",
    source="in-house",
    task="causal-lm",
    defaults=dict(
        vocab=512, hidden=64, heads=4, ffn=256, layers=2, max_positions=1024, dropout=0.0
    ),
    ranges=dict(_TRANSFORMER_RANGES, dropout=[0.0, 0.1]),
    dims={"B": 4, "S": 64},
    factory=make_varlen,
    description="causal LM on a right-padded batch with key-padding + causal SDPA masks",
)
FAMILIES = (VARLEN,)
