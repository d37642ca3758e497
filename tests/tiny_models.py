"""Tiny hand-built models shared by the tests (each a ModelBundle factory).

A plain module (not conftest) so tests can import it: several conftest.py files exist.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from memgnn.predictor.spec.bundle import ModelBundle
from torch import nn


class Block(nn.Module):
    def __init__(self, d: int, heads: int = 2):
        super().__init__()
        self.heads = heads
        self.ln = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln(x)).split(d, dim=-1)
        q, k, v = (t.view(b, s, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, d))
        return x + self.fc2(F.gelu(self.fc1(x)))


class TinyGPT(nn.Module):
    def __init__(self, d: int = 32, vocab: int = 50, layers: int = 2):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d) for _ in range(layers))
        self.head = nn.Linear(d, vocab)

    def forward(self, ids):
        x = self.emb(ids)
        for blk in self.blocks:
            x = blk(x)
        return self.head(x)


def _lm_inputs(sizes, device, dtype):
    return {"ids": torch.randint(0, 50, (sizes["B"], sizes["S"]), device=device)}


def _lm_loss(model, inputs):
    logits = model(inputs["ids"])
    return F.cross_entropy(logits.flatten(0, 1), inputs["ids"].flatten())


def tiny_gpt_bundle(layers: int = 2, model=None, *, depth_knob: bool = False) -> ModelBundle:
    """The tiny GPT (or `model`, a TinyGPT subclass); `depth_knob`: with `layers` /
    `with_layers`, so a capture replicates its blocks."""
    model = model or TinyGPT
    return ModelBundle(
        name="tiny-gpt",
        family="gpt",
        build=lambda: model(layers=layers),
        make_inputs=_lm_inputs,
        loss=_lm_loss,
        dims={"B": 3, "S": 17},
        hparams={"layers": layers},
        layers=layers if depth_knob else None,
        with_layers=(lambda n: tiny_gpt_bundle(n, model, depth_knob=True)) if depth_knob else None,
    )


def tiny_mlp_bundle() -> ModelBundle:
    def make(sizes, device, dtype):
        return {
            "x": torch.randn(sizes["B"], 24, device=device, dtype=dtype),
            "y": torch.randint(0, 5, (sizes["B"],), device=device),
        }

    def build():
        return nn.Sequential(nn.Linear(24, 64), nn.ReLU(), nn.Linear(64, 5))

    return ModelBundle(
        name="tiny-mlp",
        family="mlp",
        build=build,
        make_inputs=make,
        loss=lambda m, i: F.cross_entropy(m(i["x"]), i["y"]),
        dims={"B": 4},
    )


class EarlyExit(nn.Module):
    """Exits after the first block when a data-dependent confidence is high."""

    def __init__(self, d: int = 16):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(d, d) for _ in range(2))
        self.exit_head = nn.Linear(d, 1)
        self.out = nn.Linear(d, 3)

    def forward(self, x):
        x = torch.relu(self.blocks[0](x))
        if bool(torch.sigmoid(self.exit_head(x)).mean() > 0.5):
            return self.out(x)
        x = torch.relu(self.blocks[1](x))
        return self.out(x)


class CondModel(nn.Module):
    def __init__(self, d: int = 16):
        super().__init__()
        self.a, self.b = nn.Linear(d, d), nn.Linear(d, 4 * d)
        self.head = nn.Linear(d, 3)

    def forward(self, x):
        def small(x):
            return self.a(x)

        def big(x):
            return self.b(x).view(*x.shape[:-1], 4, -1).sum(-2)

        return self.head(torch.cond(x.sum() > 0, big, small, (x,)))


class TopKMoE(nn.Module):
    def __init__(self, d: int = 16, num_experts: int = 4, top_k: int = 2):
        super().__init__()
        self.num_experts, self.top_k = num_experts, top_k
        self.router = nn.Linear(d, num_experts)
        self.experts = nn.ModuleList(nn.Linear(d, d) for _ in range(num_experts))
        self.head = nn.Linear(d, 3)

    def forward(self, x):
        tokens = x.flatten(0, -2)
        weights, idx = self.router(tokens).softmax(-1).topk(self.top_k, dim=-1)
        out = torch.zeros_like(tokens)
        for e, expert in enumerate(self.experts):
            tok, slot = (idx == e).nonzero(as_tuple=True)
            y = expert(tokens[tok]) * weights[tok, slot].unsqueeze(-1)
            out = out.index_add(0, tok, y)
        return self.head(out.view_as(x))


def _seq_bundle(name: str, build) -> ModelBundle:
    def make(sizes, device, dtype):
        return {
            "x": torch.randn(sizes["B"], sizes["S"], 16, device=device, dtype=dtype),
            "y": torch.randint(0, 3, (sizes["B"], sizes["S"]), device=device),
        }

    def loss(m, i):
        return F.cross_entropy(m(i["x"]).flatten(0, 1), i["y"].flatten())

    return ModelBundle(
        name=name,
        family=name,
        build=build,
        make_inputs=make,
        loss=loss,
        dims={"B": 3, "S": 5},
    )


def tiny_gpt2_config(*, layers: int = 1, vocab: int = 128, positions: int = 64, **extra):
    """A 32-wide, 2-head GPT-2 as a transformers.GPT2Config (needs transformers)."""
    import transformers

    return transformers.GPT2Config(n_layer=layers, n_embd=32, n_head=2, vocab_size=vocab,
                                   n_positions=positions, bos_token_id=0, eos_token_id=0,
                                   **extra)  # fmt: skip


def write_tiny_gpt2_config(path, **kw):
    """`tiny_gpt2_config(**kw)` as the config.json at `path` (an `hf:PATH` spec); `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tiny_gpt2_config(**kw).to_json_file(str(path))
    return path


# A tiny Llama as a published config.json (hf:PATH): 4 query heads, 2 key/value heads.
LLAMA_HIDDEN, LLAMA_KV, LLAMA_LAYERS, LLAMA_VOCAB, LLAMA_MLP = 64, 32, 2, 256, 128
LLAMA_HEADS = 4


def tiny_llama_config(max_positions: int = 64):
    """The tiny Llama above as a transformers.LlamaConfig (needs transformers)."""
    import transformers

    return transformers.LlamaConfig(
        hidden_size=LLAMA_HIDDEN,
        intermediate_size=LLAMA_MLP,
        num_hidden_layers=LLAMA_LAYERS,
        num_attention_heads=LLAMA_HEADS,
        num_key_value_heads=LLAMA_HEADS * LLAMA_KV // LLAMA_HIDDEN,
        vocab_size=LLAMA_VOCAB,
        max_position_embeddings=max_positions,
    )


def tiny_hf_llama_bundle(directory, max_positions: int = 64) -> ModelBundle:
    """The tiny Llama above, its config.json written in `directory` (needs transformers)."""
    from memgnn.predictor import zoo

    path = directory / "config.json"
    tiny_llama_config(max_positions).to_json_file(str(path))
    return zoo.resolve(f"hf:{path}")
