"""Hand formula for a Llama-style full fine-tuning step, LitGPT's model code next to HF's.

Why LitGPT's TinyLlama full fine-tune (tiny-llama/full.yaml: B=4, padded length <= 512,
bf16-true, AdamW, global batch 32 -> 8 accumulation micro-steps) peaks where it does. All
bytes; T = B x S tokens, h hidden, kv = key/value heads x head size, I intermediate, V
vocabulary, H heads; bf16 = 2 bytes, fp32 = 4. Saved-for-backward tensors per layer, read
off each model's forward (flash SDPA saves q, k, v, out and an fp32 logsumexp B x H x S):

- LitGPT (litgpt/model.py @ 26857050): RMSNorm upcasts (x.float(), saves fp32 x and fp32
  x_normed, returns bf16): 10Th per norm, 2 norms; attention saves the rope'd q (the
  torch.cat copy), K and V repeat_interleave'd to all H heads ("flash attention requires
  it in training mode"), out, and proj's input: 10Th; LLaMAMLP fc_1, silu(fc_1), fc_2 and
  their product: 8TI. Head: norm 10Th, bf16 logits 2TV, logits[..., :-1, :].reshape copy
  2TV, chunked cross entropy's bf16 log-softmax chunks 2TV.
- HF LlamaForCausalLM (transformers 5): RMSNorm saves fp32 x, the bf16 normalized x and
  its output: 8Th per norm; attention q_embed 2Th, k_embed and v 2T kv each (GQA heads, no
  repeat: enable_gqa), out 2Th, o_proj input 2Th; MLP 8TI. Head: norm 8Th, logits upcast
  to fp32 (4TV) and fp32 log-softmax (4TV).

The steady accumulation micro-step holds parameters, gradients (kept across micro-steps)
and both AdamW states (bf16-true: all bf16) next to the activations.
"""

from __future__ import annotations

import json
from pathlib import Path

BF16, FP32 = 2, 4


def llama_shape(config_file: Path) -> dict[str, int]:
    c = json.loads(config_file.read_text())
    heads = c["num_attention_heads"]
    return {
        "h": c["hidden_size"],
        "I": c["intermediate_size"],
        "L": c["num_hidden_layers"],
        "V": c["vocab_size"],
        "H": heads,
        "kv": c.get("num_key_value_heads", heads) * c["hidden_size"] // heads,
    }


def activations(shape: dict[str, int], batch: int, seq: int, impl: str) -> dict[str, int]:
    """Saved activation bytes of one forward: per layer, all layers, and the head."""
    t = batch * seq
    h, inter, v, lse = shape["h"], shape["I"], shape["V"], FP32 * batch * shape["H"] * seq
    if impl == "litgpt":
        layer = 2 * (2 * FP32 + BF16) * t * h + 5 * BF16 * t * h + 4 * BF16 * t * inter + lse
        head = (2 * FP32 + BF16) * t * h + 3 * BF16 * t * v
    elif impl == "hf":
        norm = (FP32 + 2 * BF16) * t * h
        attn = 3 * BF16 * t * h + 2 * BF16 * t * shape["kv"] + lse
        layer = 2 * norm + attn + 4 * BF16 * t * inter
        head = norm + 2 * FP32 * t * v
    else:
        raise ValueError(f"impl must be litgpt or hf, not {impl!r}")
    return {"per_layer": layer, "layers": shape["L"] * layer, "head": head}


def full_ft_peak(params: int, shape: dict, batch: int, seq: int, impl: str) -> dict[str, int]:
    """bf16-true AdamW with accumulation: P + grads + 2 states + one forward's activations."""
    act = activations(shape, batch, seq, impl)
    state = params * BF16 * 4  # parameters, gradients, exp_avg, exp_avg_sq
    return act | {"state": state, "peak": state + act["layers"] + act["head"]}
