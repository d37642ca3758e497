"""Building blocks shared by the in-house families: a pre-norm SDPA transformer block, token
embeddings, the causal-LM loss, and input makers that work at int and symbolic sizes alike.

Everything a bundle holds is a module-level function or a `functools.partial` of one, so
bundles pickle (dataset builders may ship them to worker processes).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .registry import check_divides, check_ints

logger = logging.getLogger(__name__)

IGNORE_INDEX = -100


def fake_mode_active() -> bool:
    """Whether a fake-tensor mode is active (model weights then need no real init)."""
    from torch._guards import detect_fake_mode

    return detect_fake_mode() is not None


class Attention(nn.Module):
    """Multi-head self-attention through `F.scaled_dot_product_attention`."""

    def __init__(self, dim: int, heads: int, *, dropout: float = 0.0) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"attention dim {dim} is not divisible by heads {heads}")
        self.heads = heads
        self.head_dim = dim // heads
        self.dropout = dropout
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(
        self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, causal: bool = True
    ) -> torch.Tensor:
        qkv = self.qkv(x).unflatten(-1, (3, self.heads, self.head_dim))
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (B, heads, S, head_dim)
        p = self.dropout if self.training else 0.0
        if attn_mask is None:
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=causal)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=p)
        return self.proj(out.transpose(1, 2).flatten(2))


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.up = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.down = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.act(self.up(x)))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln(x)), then x + ffn(ln(x)) (or an MoE layer)."""

    def __init__(
        self,
        dim: int,
        heads: int,
        ffn: int,
        *,
        dropout: float = 0.0,
        causal: bool = True,
        mlp: nn.Module | None = None,
    ) -> None:
        super().__init__()
        self.causal = causal
        self.ln1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads, dropout=dropout)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = mlp if mlp is not None else FeedForward(dim, ffn)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.drop(self.attn(self.ln1(x), attn_mask, self.causal))
        return x + self.drop(self.mlp(self.ln2(x)))


class TokenEmbedding(nn.Module):
    """Token plus learned position embeddings (sequence length <= max_positions)."""

    def __init__(self, vocab: int, dim: int, max_positions: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(max_positions, dim)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(ids.shape[1], device=ids.device)
        return self.tok(ids) + self.pos(pos)


class LMHead(nn.Module):
    def __init__(self, dim: int, vocab: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.out = nn.Linear(dim, vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.norm(x))


class TransformerLM(nn.Module):
    """Token embedding, a ModuleList of `Block`s and an LM head; subclasses vary the loop.

    `mlp` makes each block's feed-forward module (default: a GELU FeedForward).
    """

    def __init__(
        self,
        vocab: int,
        dim: int,
        heads: int,
        ffn: int,
        layers: int,
        max_positions: int,
        *,
        dropout: float = 0.0,
        mlp: Callable[[], nn.Module] | None = None,
    ) -> None:
        super().__init__()
        self.embed = TokenEmbedding(vocab, dim, max_positions)
        self.blocks = nn.ModuleList(
            Block(dim, heads, ffn, dropout=dropout, mlp=mlp() if mlp else None)
            for _ in range(layers)
        )
        self.head = LMHead(dim, vocab)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def transformer_blocks(model: nn.Module) -> list[nn.Module]:
    """The checkpointable blocks of a TransformerLM (its `blocks` ModuleList)."""
    return list(model.blocks)


def check_transformer(name: str, hp: Mapping[str, Any]) -> None:
    """The hparams every in-house transformer LM shares."""
    check_ints(name, hp, "vocab", "hidden", "heads", "ffn", "layers", "max_positions")
    check_divides(name, hp, "heads", "hidden")


def transformer_lm(
    hp: Mapping[str, Any], cls: type[TransformerLM] = TransformerLM, **extra: Any
) -> nn.Module:
    """Build `cls` from the shared hparams (plus class-specific keyword arguments)."""
    return cls(
        hp["vocab"],
        hp["hidden"],
        hp["heads"],
        hp["ffn"],
        hp["layers"],
        hp["max_positions"],
        **extra,
    )


def shifted_labels(labels: torch.Tensor) -> torch.Tensor:
    """labels[:, 1:] padded with IGNORE_INDEX at the end (torch.cat, not F.pad: F.pad
    specializes symbolic sizes under a plain FakeTensorMode in torch 2.13)."""
    pad = labels.new_full((labels.shape[0], 1), IGNORE_INDEX)
    return torch.cat([labels[:, 1:], pad], dim=1)


def lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Next-token cross entropy; positions labelled IGNORE_INDEX do not count."""
    target = shifted_labels(labels)
    return F.cross_entropy(
        logits.flatten(0, 1).float(), target.flatten(), ignore_index=IGNORE_INDEX
    )


# ---- input makers: batches from `sizes` only (ints or SymInts) -----------------------------


def token_inputs(
    sizes: Mapping[str, Any], device: torch.device, float_dtype: torch.dtype, *, vocab: int
) -> dict[str, torch.Tensor]:
    """{"input_ids": (B, S) random token ids}."""
    ids = torch.randint(0, vocab, (sizes["B"], sizes["S"]), device=device)
    return {"input_ids": ids}


def image_inputs(
    sizes: Mapping[str, Any],
    device: torch.device,
    float_dtype: torch.dtype,
    *,
    channels: int,
    image: int,
    classes: int,
    dense: bool = False,
) -> dict[str, torch.Tensor]:
    """{"pixel_values": (B, C, H, W), "labels": (B,) or, dense, (B, H, W)}."""
    batch = sizes["B"]
    pixels = torch.randn(batch, channels, image, image, device=device, dtype=float_dtype)
    shape = (batch, image, image) if dense else (batch,)
    labels = torch.randint(0, classes, shape, device=device)
    return {"pixel_values": pixels, "labels": labels}


def causal_lm_step(model: nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """Loss of an in-house LM whose forward(**inputs) returns (B, S, vocab) logits."""
    logits = model(**inputs)
    return lm_loss(logits, inputs.get("labels", inputs["input_ids"]))


def classifier_step(model: nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """Cross entropy of model(pixel_values or features) against labels (per sample/pixel)."""
    x = inputs["pixel_values"] if "pixel_values" in inputs else inputs["features"]
    return F.cross_entropy(model(x), inputs["labels"])
