"""The Stanford CS336 (spring 2025) TransformerLM as a ``py:`` factory, for comparing the
shared ``cs336-memory_*`` CUDA snapshots with memgnn's prediction of the same step.

The recordings (kkaitlyn111/cs336-a2-systems, ``cs336_systems/benchmark.py``,
``run_memory_foward_fullstep``) run the course's "2.7B" configuration: d_model 2560, d_ff
10240, 32 layers, 32 heads, vocabulary 10,000, context 128 (or 256), RoPE theta 10,000,
batch 4, fp32, and one step of ``zero_grad``, forward, the course's cross-entropy,
backward and the course's AdamW, recorded after the model and the optimizer were made.
The model below is written from the assignment's specification, as the student's
``cs336_systems/transformer_annotated.py`` uses it: pre-norm blocks of RMSNorm (eps 1e-5,
computed in fp32), multi-head self-attention with RoPE on queries and keys, a causal
mask built per call (``triu`` of ones, negated, broadcast to every head) applied with
``masked_fill`` to einsum scores, a max-subtracting softmax, and a SwiGLU feed-forward
(``w2(silu(w1 x) * w3 x)``, SiLU as ``x * sigmoid(x)``); a final RMSNorm and an untied
LM head; linear layers are einsums with (out, in) weights. RoPE is read off the
recording, whose model file is not public (the student's ``cs336_basics``): one buffer of
40,960 bytes per layer before recording (cos and sin, 2 x 128 x 40 fp32), (B, S, 40) fp32
gathers of it per call, and (B, H, S, 40) products: the even and odd features rotated
pairwise and interleaved again.
The loss is a max-subtracting log-softmax cross-entropy, the inputs the targets too (as
the benchmark passes ``batch`` for both). What memgnn cannot take from this file is the
course's AdamW: it models ``torch.optim.AdamW``; ``--optimizer-impl for-loop`` (one
parameter at a time, as the course's loop) is the closer, and the diff shows what differs.
The recordings' device: the two 32 MiB cuBLAS workspaces are Hopper's (``h100-80gb``).

    memgnn profile --backend sim --model py:benchmarks.cs336_lm:make --batch 4 --seq 128 \\
        --device h100-80gb --steps first --optimizer-impl for-loop --snapshot OUT.pickle
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from functools import partial
from typing import Any

import torch
from memgnn.predictor.spec.bundle import ModelBundle
from torch import nn

__all__ = ["make"]

CONFIG_2_7B = {"d_model": 2560, "d_ff": 10240, "layers": 32, "heads": 32}


class Linear(nn.Module):
    def __init__(self, d_in: int, d_out: int) -> None:
        super().__init__()
        std = math.sqrt(2.0 / (d_in + d_out))  # the course truncates at 3 std (not here:
        self.weight = nn.Parameter(torch.randn(d_out, d_in) * std)  # fake tensors; bytes alike)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.einsum("...i,oi->...o", x, self.weight)


class Embedding(nn.Module):
    def __init__(self, vocab: int, d_model: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(vocab, d_model))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.weight[ids]


class RMSNorm(nn.Module):
    def __init__(self, d_model: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.to(torch.float32)
        rms = torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return (x / rms * self.weight).to(dtype)


class RoPE(nn.Module):
    """Angles as one (2, max_seq_len, d_k / 2) buffer of cos and sin; the even and odd
    features rotated pairwise, then interleaved again."""

    def __init__(self, theta: float, d_k: int, max_seq_len: int) -> None:
        super().__init__()
        freqs = theta ** (-torch.arange(0, d_k, 2).float() / d_k)
        angles = torch.outer(torch.arange(max_seq_len).float(), freqs)
        self.register_buffer("cos_sin", torch.stack([angles.cos(), angles.sin()]), False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        cos = self.cos_sin[0][positions].unsqueeze(1)  # (B, 1, S, d_k / 2)
        sin = self.cos_sin[1][positions].unsqueeze(1)
        even, odd = x[..., 0::2], x[..., 1::2]
        return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)


def softmax(x: torch.Tensor, dim: int) -> torch.Tensor:
    e = torch.exp(x - x.max(dim=dim, keepdim=True).values)
    return e / e.sum(dim=dim, keepdim=True)


class Attention(nn.Module):
    def __init__(self, d_model: int, heads: int, max_seq_len: int, theta: float) -> None:
        super().__init__()
        self.heads = heads
        self.q_proj, self.k_proj = Linear(d_model, d_model), Linear(d_model, d_model)
        self.v_proj, self.output_proj = Linear(d_model, d_model), Linear(d_model, d_model)
        self.rope = RoPE(theta, d_model // heads, max_seq_len)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        return x.reshape(b, s, self.heads, d // self.heads).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = (self._split(p(x)) for p in (self.q_proj, self.k_proj, self.v_proj))
        positions = torch.arange(s, device=x.device).unsqueeze(0).expand(b, -1)
        q, k = self.rope(q, positions), self.rope(k, positions)
        mask = ~torch.triu(torch.ones(s, s, device=x.device), diagonal=1).to(torch.bool)
        mask = mask.unsqueeze(0).unsqueeze(0).expand(b, self.heads, -1, -1)
        scores = torch.einsum("...qd,...kd->...qk", q, k) / math.sqrt(q.shape[-1])
        scores = scores.masked_fill(mask == False, -1e9)  # noqa: E712 - as the course's code
        out = torch.einsum("...qk,...kd->...qd", softmax(scores, dim=-1), v)
        return self.output_proj(out.transpose(1, 2).reshape(b, s, d))


class SwiGLU(nn.Module):
    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.w1, self.w2, self.w3 = Linear(d_model, d_ff), Linear(d_ff, d_model), Linear(
            d_model, d_ff)  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.w1(x)
        return self.w2(a * torch.sigmoid(a) * self.w3(x))


class Block(nn.Module):
    def __init__(self, d_model: int, heads: int, d_ff: int, max_seq_len: int, theta: float):
        super().__init__()
        self.ln1, self.ln2 = RMSNorm(d_model), RMSNorm(d_model)
        self.attn = Attention(d_model, heads, max_seq_len, theta)
        self.ffn = SwiGLU(d_model, d_ff)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.ffn(self.ln2(x))


class TransformerLM(nn.Module):
    def __init__(self, *, vocab: int, context: int, d_model: int, d_ff: int, layers: int,
                 heads: int, theta: float) -> None:  # fmt: skip
        super().__init__()
        self.token_embeddings = Embedding(vocab, d_model)
        self.layers = nn.ModuleList(
            Block(d_model, heads, d_ff, context, theta) for _ in range(layers)
        )
        self.ln_final = RMSNorm(d_model)
        self.lm_head = Linear(d_model, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.token_embeddings(ids)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.ln_final(x))


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    shifted = logits - logits.max(dim=-1, keepdim=True).values
    log_z = torch.log(torch.exp(shifted).sum(dim=-1, keepdim=True))
    picked = shifted.gather(-1, targets.unsqueeze(-1))
    return (log_z - picked).mean()


def _inputs(sizes: Mapping[str, Any], device: torch.device, dtype: torch.dtype, *, vocab: int):
    return {"ids": torch.randint(0, vocab, (sizes["B"], sizes["S"]), device=device)}


def _bundle(hp: dict[str, Any]) -> ModelBundle:
    return ModelBundle(
        name="cs336-lm",
        family="transformer",
        build=lambda: TransformerLM(**hp),
        make_inputs=partial(_inputs, vocab=hp["vocab"]),
        loss=lambda model, batch: cross_entropy(model(batch["ids"]), batch["ids"]),
        dims={"B": 4, "S": hp["context"]},
        hparams=dict(hp),
        blocks=lambda model: list(model.layers),
        layers=hp["layers"],
        with_layers=lambda n: _bundle(hp | {"layers": n}),
    )


def make(size: str = "2.7b", vocab: str = "10000", context: str = "128", theta: str = "10000",
         layers: str = "") -> ModelBundle:  # fmt: skip
    """``--model-arg size=2.7b`` (the recordings'); ``layers=N`` overrides the depth."""
    if size != "2.7b":
        raise ValueError(f"only the recordings' size 2.7b is defined here, got {size!r}")
    hp: dict[str, Any] = dict(CONFIG_2_7B, vocab=int(vocab), context=int(context),
                              theta=float(theta))  # fmt: skip
    if layers:
        hp["layers"] = int(layers)
    return _bundle(hp)
