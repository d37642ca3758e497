"""`--loss chunked-ce:N`: torchtune's chunked cross entropy, run under capture.

torchtune's `CEWithChunkedOutputLoss(num_output_chunks=N)` with its model's chunked output
(pytorch/torchtune, torchtune/modules/loss/ce_chunked_output_loss.py and
`TransformerDecoder.chunked_output`; the recipes call `model.set_num_output_chunks(N)`):

- the model's forward ends with `[self.output(chunk) for chunk in h.chunk(N, dim=1)]`: the
  output head on each of N chunks of the sequence, all N logit chunks kept (in the model's
  dtype, never upcast as a whole) until the loss has run (`del logits` after it);
- the loss reshapes each chunk to (rows, vocab) and sums `compute_cross_entropy(chunk,
  labels)` = `F.cross_entropy(logits.float(), labels, ignore_index=-100,
  reduction="sum")` over the chunks, then divides by the count of labelled tokens; only one
  chunk is upcast to fp32 at a time;
- with `compile: True` torchtune's `compile_loss` compiles `compute_cross_entropy` alone
  (not the chunking): under `--compile blocks` each chunk's upcast + cross entropy is a
  compiled region here (`emulate.compile.Region`: what AOTAutograd's partitioner saves).

Here the head of a transformers causal LM (`get_output_embeddings()`, its peft wrapper
where LoRA adapts it) has its forward replaced by the chunked one: the model's own forward
runs (so offloading and checkpointing hooks see the step as they do), without labels, and
returns the list of chunks as its logits. The chunks are cut as `tensor_split` cuts them
(the first S mod N one longer); torchtune's `chunk` of Nov 2024 cuts the same pieces when
N divides S (packed rows of max_seq_len), fewer otherwise. The labels are the step's
shifted labels (torchtune appends ignore_index after `labels[..., 1:]` the same way).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from memgnn.predictor.emulate.compile import Region
from memgnn.predictor.errors import UserError
from memgnn.predictor.zoo.layers import IGNORE_INDEX
from torch import nn

__all__ = [
    "ChunkedCrossEntropy", "apply_chunked_loss", "assumption", "compile_model_loss",
    "split_sequence",
]  # fmt: skip

LossFn = Callable[[nn.Module, dict[str, torch.Tensor]], torch.Tensor]
# config fields that post-process the head's logits in the model's forward (a list of
# chunks cannot take them): Gemma 2's soft-capping, Cohere's logit scale
_LOGIT_POSTPROCESS = ("final_logit_softcapping", "logit_scale", "output_multiplier_scale")


def split_sequence(x: torch.Tensor, n: int, dim: int = 1) -> list[torch.Tensor]:
    """`x.tensor_split(n, dim)` as views cut by arithmetic on the (symbolic) size: piece i
    is ceil((S - i) / n) long, so a symbolic S takes no guard."""
    size = x.shape[dim]
    pieces, start = [], 0
    for i in range(n):
        length = (size - i + n - 1) // n
        pieces.append(x.narrow(dim, start, length))
        start = start + length
    return pieces


class ChunkedCrossEntropy(nn.Module):
    """torchtune's `CEWithChunkedOutputLoss.compute_cross_entropy`: one chunk upcast to
    fp32, cross entropy summed over its labelled tokens."""

    def forward(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.float(), labels, ignore_index=IGNORE_INDEX, reduction="sum")


def _base(model: nn.Module) -> nn.Module:
    return model.get_base_model() if hasattr(model, "get_base_model") else model  # peft


def _check_model(model: nn.Module, loss: str) -> nn.Module:
    """The output head of a transformers causal LM whose forward returns it as it is."""
    base = _base(model)
    config = getattr(base, "config", None)
    get = getattr(base, "get_output_embeddings", None)
    head = get() if callable(get) else None
    if config is None or not isinstance(head, nn.Module):
        raise UserError(
            f"--loss {loss}: {type(base).__name__} is not a transformers causal language "
            "model with an output head (get_output_embeddings); the chunked loss applies to "
            "those"
        )
    if getattr(config, "is_encoder_decoder", False):
        raise UserError(f"--loss {loss}: {type(base).__name__} is an encoder-decoder model")
    scaled = [k for k in _LOGIT_POSTPROCESS if getattr(config, k, None) not in (None, 1, 1.0)]
    if scaled:
        raise UserError(
            f"--loss {loss}: {type(base).__name__}'s forward post-processes its logits "
            f"({', '.join(scaled)}), which the chunked loss does not model"
        )
    return head


def apply_chunked_loss(
    model: nn.Module, n: int, *, compiled: bool, fake: bool, dynamic: bool = True
) -> LossFn:
    """Make `model`'s head return N chunks of logits; returns the step's loss function
    (torchtune's recipe: `logits = model(**batch)`, then the chunked loss, then `del
    logits`). `compiled`: each chunk's cross entropy through torch.compile (a `Region`
    under capture), as torchtune's compile_loss."""
    loss = f"chunked-ce:{n}"
    head = _check_model(model, loss)
    inner = head.forward

    def chunked_forward(hidden: torch.Tensor, *args: Any, **kwargs: Any) -> list[torch.Tensor]:
        return [inner(chunk, *args, **kwargs) for chunk in split_sequence(hidden, n)]

    head.forward = chunked_forward
    ce = ChunkedCrossEntropy()
    compute: Callable[..., torch.Tensor] = ce
    if compiled:
        compute = (
            Region(ce, ce.forward, dynamic=dynamic)
            if fake
            else torch.compile(ce.forward, dynamic=dynamic)
        )

    def step(model: nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        if "shift_labels" not in inputs:
            raise UserError(f"--loss {loss}: the model's batch has no next-token labels")
        labels = inputs["shift_labels"]
        batch = {k: v for k, v in inputs.items() if k not in ("labels", "shift_labels")}
        logits = model(**batch).logits
        if not isinstance(logits, list) or len(logits) != n:
            raise UserError(
                f"--loss {loss}: {type(_base(model)).__name__}'s forward does not return its "
                "head's output as it is; the chunked loss does not apply to it"
            )
        total_elements = (labels != IGNORE_INDEX).sum()
        label_chunks = [c.reshape(-1) for c in split_sequence(labels, n)]
        logit_chunks = [c.reshape(-1, c.size(-1)) for c in logits]
        total: Any = 0.0
        for logits_chunk, labels_chunk in zip(logit_chunks, label_chunks, strict=True):
            total += compute(logits_chunk, labels_chunk)
        return total / total_elements

    return step


class _ModelLoss(nn.Module):
    """A transformers model's `loss_function` (ForCausalLMLoss: upcast, shift, cross
    entropy) as a module, so that it compiles as a region of its own."""

    def __init__(self, fn: Callable[..., torch.Tensor]):
        super().__init__()
        self.fn = fn

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self.fn(*args, **kwargs)


def compile_model_loss(model: nn.Module, *, fake: bool, dynamic: bool = True) -> None:
    """`--compile-loss`: the model's own loss compiled, as torchtune's `compile_loss` and
    torchtitan's `compile.components = ["loss"]` compile theirs: transformers' forward calls
    `self.loss_function(logits=..., labels=..., vocab_size=...)`, here one compiled region
    (a `Region` under capture, `torch.compile` in a real step)."""
    base = _base(model)
    if not callable(getattr(base, "loss_function", None)):
        raise UserError(
            f"--compile-loss: {type(base).__name__} has no loss_function (a transformers "
            "model computes its loss with one); the option applies to those"
        )
    loss = _ModelLoss(base.loss_function)
    call = (
        Region(loss, loss.forward, dynamic=dynamic)
        if fake
        else torch.compile(loss.forward, dynamic=dynamic)
    )
    base.loss_function = call


def assumption(loss: str, compiled: bool, compile_loss: bool = False) -> str | None:
    """What an answer under `--loss` or `--compile-loss` assumed (None: the model's own
    loss, eager)."""
    if loss == "model":
        if compile_loss:
            return (
                "loss: the model's own loss function (transformers' upcast, shift and cross "
                "entropy) compiled as one region (torchtune's compile_loss, torchtitan's "
                "compile.components 'loss')"
            )
        return None
    n = loss.split(":", 1)[1]
    how = "compiled per chunk (torchtune's compile_loss)" if compiled else "eager"
    return (
        f"loss: torchtune's CEWithChunkedOutputLoss with num_output_chunks={n}: the model's "
        f"output head on each of {n} chunks of the sequence (all chunks kept in the model's "
        f"dtype until the loss has run), cross entropy per chunk upcast to fp32 ({how}), "
        "summed and divided by the labelled tokens; chunks cut as tensor_split"
    )
