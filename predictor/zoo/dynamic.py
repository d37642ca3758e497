"""In-house families with data-dependent control flow or sizes.

- `early_exit`: after each block (but the last) an exit head scores confidence, and
  `if bool(conf.mean() > threshold): break` leaves the loop: a Python-level branch on data.
  The loss adds a small ponder cost on the confidences so the exit heads train.
- `moe`: transformer blocks whose FFN is a top-k mixture of experts; tokens per expert are
  data-dependent (`(topk_idx == e).nonzero()`, gather, expert MLP, `index_add_`), plus a
  Switch-style load-balancing loss.
- `layerdrop`: in training each block is skipped with probability p, by
  `torch.cond(torch.rand(()) < p, skip, block, (x,))` (impl=cond, works in eager autograd
  and under fake tensors in torch 2.13) or by a Python `if bool(torch.rand(()) < p)`
  (impl=python).
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from memgnn.predictor.spec.bundle import ModelBundle
from torch import nn

from .layers import (
    Block,
    FeedForward,
    TransformerLM,
    check_transformer,
    lm_loss,
    token_inputs,
    transformer_blocks,
    transformer_lm,
)
from .registry import Family, check_choice, check_float, check_ints

logger = logging.getLogger(__name__)

_TRANSFORMER_DEFAULTS = dict(vocab=512, hidden=64, heads=4, ffn=256, layers=3, max_positions=1024)
_TRANSFORMER_RANGES = dict(
    layers=[2, 4, 6, 12],
    hidden=[96, 192, 384, 768],
    heads=[2, 4, 6, 12],
    ffn=[256, 1024, 2048, 3072],
    vocab=[512, 8192, 32000],
)


def _dynamic_step(model: nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """LM loss plus the auxiliary loss the model returns next to its logits."""
    logits, aux = model(**inputs)
    return lm_loss(logits, inputs["input_ids"]) + aux


# ---- early exit ----------------------------------------------------------------------------


class EarlyExitLM(TransformerLM):
    def __init__(self, *args: Any, threshold: float, ponder: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        dim = self.head.out.in_features
        self.exits = nn.ModuleList(nn.Linear(dim, 1) for _ in range(len(self.blocks) - 1))
        self.threshold = threshold
        self.ponder = ponder

    def forward(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.embed(input_ids)
        confidences = []
        for i, block in enumerate(self.blocks):
            x = block(x)
            if i < len(self.exits):
                conf = torch.sigmoid(self.exits[i](x)).mean()
                confidences.append(conf)
                if bool(conf > self.threshold):  # data-dependent exit
                    break
        aux = x.new_zeros(())
        if confidences:
            aux = self.ponder * torch.stack(confidences).mean()
        return self.head(x), aux


def make_early_exit(hp: dict[str, Any]) -> ModelBundle:
    check_transformer("early_exit", hp)
    threshold = check_float("early_exit", hp, "threshold")
    ponder = check_float("early_exit", hp, "ponder", high=10.0)
    build = partial(transformer_lm, dict(hp), EarlyExitLM, threshold=threshold, ponder=ponder)
    return ModelBundle(
        name="early_exit",
        family="early-exit",
        build=build,
        make_inputs=partial(token_inputs, vocab=hp["vocab"]),
        loss=_dynamic_step,
        dims=dict(EARLY_EXIT.dims),
        hparams=dict(hp),
        blocks=transformer_blocks,
        max_paths=max(16, hp["layers"]),
    )


# ---- mixture of experts --------------------------------------------------------------------


class MoELayer(nn.Module):
    """Top-k routed experts; `aux_loss` holds the last forward's load-balancing loss."""

    def __init__(self, dim: int, ffn: int, experts: int, top_k: int) -> None:
        super().__init__()
        self.top_k = top_k
        self.router = nn.Linear(dim, experts, bias=False)
        self.experts = nn.ModuleList(FeedForward(dim, ffn) for _ in range(experts))
        self.aux_loss: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.flatten(0, -2)  # (tokens, dim)
        probs = F.softmax(self.router(flat), dim=-1)
        weights, topk_idx = probs.topk(self.top_k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            token, slot = (topk_idx == e).nonzero(as_tuple=True)  # data-dependent count
            y = expert(flat[token]) * weights[token, slot].unsqueeze(-1)
            out.index_add_(0, token, y.to(out.dtype))
        n = len(self.experts)
        routed = (topk_idx.unsqueeze(-1) == torch.arange(n, device=x.device)).to(probs.dtype)
        self.aux_loss = n * (routed.mean(dim=(0, 1)) * probs.mean(dim=0)).sum()
        return out.view_as(x)


class MoELM(TransformerLM):
    def __init__(
        self,
        vocab: int,
        dim: int,
        heads: int,
        ffn: int,
        layers: int,
        max_positions: int,
        *,
        experts: int,
        top_k: int,
        aux_weight: float,
        dropout: float = 0.0,
    ) -> None:
        mlp = partial(MoELayer, dim, ffn, experts, top_k)
        super().__init__(vocab, dim, heads, ffn, layers, max_positions, dropout=dropout, mlp=mlp)
        self.aux_weight = aux_weight

    def forward(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.embed(input_ids)
        for block in self.blocks:
            x = block(x)
        aux = [b.mlp.aux_loss for b in self.blocks if b.mlp.aux_loss is not None]
        total = self.aux_weight * torch.stack(aux).sum() if aux else x.new_zeros(())
        return self.head(x), total


def make_moe(hp: dict[str, Any]) -> ModelBundle:
    check_transformer("moe", hp)
    check_ints("moe", hp, "experts", "top_k")
    if hp["top_k"] > hp["experts"]:
        raise ValueError(f"moe: top_k={hp['top_k']} exceeds experts={hp['experts']}")
    aux_weight = check_float("moe", hp, "aux_weight", high=10.0)
    build = partial(
        transformer_lm,
        dict(hp),
        MoELM,
        experts=hp["experts"],
        top_k=hp["top_k"],
        aux_weight=aux_weight,
    )
    return ModelBundle(
        name="moe",
        family="moe",
        build=build,
        make_inputs=partial(token_inputs, vocab=hp["vocab"]),
        loss=_dynamic_step,
        dims=dict(MOE.dims),
        hparams=dict(hp),
        blocks=transformer_blocks,
    )


# ---- layer drop ----------------------------------------------------------------------------


def _skip(x: torch.Tensor) -> torch.Tensor:
    return x.clone()  # torch.cond branches may not return their inputs


class LayerDropBlock(nn.Module):
    """A Block that training skips with probability p (a data-dependent branch)."""

    def __init__(self, block: Block, p: float, impl: str) -> None:
        super().__init__()
        self.block, self.p, self.impl = block, p, impl

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return self.block(x)
        drop = torch.rand((), device=x.device) < self.p
        if self.impl == "cond":
            return torch.cond(drop, _skip, self.block, (x,))
        return x if bool(drop) else self.block(x)  # data-dependent skip


class LayerDropLM(TransformerLM):
    def __init__(self, *args: Any, p: float, impl: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.blocks = nn.ModuleList(LayerDropBlock(b, p, impl) for b in self.blocks)


def make_layerdrop(hp: dict[str, Any]) -> ModelBundle:
    check_transformer("layerdrop", hp)
    p = check_float("layerdrop", hp, "p")
    impl = check_choice("layerdrop", hp, "impl", ("cond", "python"))
    build = partial(transformer_lm, dict(hp), LayerDropLM, p=p, impl=impl)
    return ModelBundle(
        name="layerdrop",
        family="layerdrop",
        build=build,
        make_inputs=partial(token_inputs, vocab=hp["vocab"]),
        loss=_layerdrop_step,
        dims=dict(LAYERDROP.dims),
        hparams=dict(hp),
        blocks=transformer_blocks,
    )


def _layerdrop_step(model: nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    return lm_loss(model(**inputs), inputs["input_ids"])


EARLY_EXIT = Family(
    name="early_exit",
    family="early-exit",
    source="in-house",
    task="causal-lm",
    defaults=dict(_TRANSFORMER_DEFAULTS, threshold=0.5, ponder=0.01),
    ranges=dict(_TRANSFORMER_RANGES, threshold=[0.3, 0.5, 0.7, 0.9]),
    dims={"B": 4, "S": 64},
    factory=make_early_exit,
    description="transformer LM with per-block exit heads and a data-dependent break",
)
MOE = Family(
    name="moe",
    family="moe",
    source="in-house",
    task="causal-lm",
    defaults=dict(_TRANSFORMER_DEFAULTS, layers=2, ffn=128, experts=4, top_k=2, aux_weight=0.01),
    ranges=dict(
        _TRANSFORMER_RANGES,
        layers=[2, 4, 6],
        ffn=[256, 512, 1024],
        experts=[4, 8, 16],
        top_k=[1, 2],
    ),
    dims={"B": 4, "S": 64},
    factory=make_moe,
    description="transformer LM with top-k MoE FFNs (data-dependent tokens per expert)",
)
LAYERDROP = Family(
    name="layerdrop",
    family="layerdrop",
    source="in-house",
    task="causal-lm",
    defaults=dict(_TRANSFORMER_DEFAULTS, layers=2, p=0.2, impl="cond"),
    ranges=dict(_TRANSFORMER_RANGES, p=[0.1, 0.2, 0.3], impl=["cond"]),
    dims={"B": 4, "S": 64},
    factory=make_layerdrop,
    description="transformer LM whose blocks training skips at random (torch.cond)",
)
FAMILIES = (EARLY_EXIT, MOE, LAYERDROP)
