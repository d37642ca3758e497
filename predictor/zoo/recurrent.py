"""In-house recurrent language model: `lstm` (hparam `cell`: lstm | gru).

Two implementations (hparam `impl`):
- `native` (default): `nn.LSTM` / `nn.GRU` (cuDNN on a GPU). Under a FakeTensorMode with
  symbolic sizes (torch 2.13) nn.LSTM fails ("Cannot call numel() on tensor with symbolic
  sizes") and nn.GRU specializes B and S, so the bundle declares B and S static: a capture
  holds for its own sizes (recorded as guards) and other sizes are captured anew.
- `scan`: the time loop is `torch._higher_order_ops.scan` over per-gate weights.
  It keeps the sequence length symbolic under a fake-tensor mode, so one capture serves
  every S. Its eager autograd re-traces under the capture's dispatch mode and fails there
  (torch 2.13: "all fw_gm output nodes must be torch.fx.Node with 'val' in meta"), so it
  is not in the sampler's ranges.
"""

from __future__ import annotations

import logging
import math
from functools import partial
from typing import Any

import torch
from memgnn.predictor.spec.bundle import ModelBundle
from torch import nn

from .layers import causal_lm_step, token_inputs
from .registry import Family, check_choice, check_float, check_ints

logger = logging.getLogger(__name__)

CELLS = {"lstm": 4, "gru": 3}  # gates per cell
IMPLS = ("scan", "native")


def _scan() -> Any:
    try:
        from torch._higher_order_ops.scan import scan
    except ImportError as exc:  # pragma: no cover - depends on the torch version
        raise ValueError("impl=scan needs torch._higher_order_ops.scan (torch >= 2.6)") from exc
    return scan


class RecurrentLayer(nn.Module):
    """One LSTM or GRU layer over (B, S, dim), batch first."""

    def __init__(self, dim: int, cell: str, impl: str) -> None:
        super().__init__()
        self.dim, self.cell, self.impl = dim, cell, impl
        self.gates = CELLS[cell]
        if impl == "native":
            rnn = nn.LSTM if cell == "lstm" else nn.GRU
            self.rnn = rnn(dim, dim, batch_first=True)
            return
        bound = 1.0 / math.sqrt(dim)
        self.ih = nn.Linear(dim, self.gates * dim)
        self.hh = nn.Parameter(torch.empty(self.gates, dim, dim).uniform_(-bound, bound))
        self.hh_bias = nn.Parameter(torch.zeros(self.gates, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.impl == "native":
            return self.rnn(x)[0]
        # (B, S, G*dim) -> G tensors (S, B, dim): scan runs over the leading (time) dim.
        xs = self.ih(x).transpose(0, 1).unflatten(-1, (self.gates, self.dim)).movedim(2, 0)
        xs = tuple(xs.unbind(0))
        h0 = x.new_zeros(x.shape[0], self.dim)
        w, b = self.hh, self.hh_bias
        # Inside the step, only select from the weights: slicing a symbolic-size tensor in a
        # scan body fails under a fake-tensor mode (slice_copy meta, torch 2.13).
        if self.cell == "lstm":

            def step(carry: Any, xt: Any) -> Any:
                h, c = carry
                i, f, g, o = (xt[k] + h @ w[k] + b[k] for k in range(4))
                c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
                h = torch.sigmoid(o) * torch.tanh(c)
                return (h, c), h.clone()

            _, ys = _scan()(step, (h0, torch.zeros_like(h0)), xs)
        else:

            def step(carry: Any, xt: Any) -> Any:
                (h,) = carry
                r = torch.sigmoid(xt[0] + h @ w[0] + b[0])
                z = torch.sigmoid(xt[1] + h @ w[1] + b[1])
                n = torch.tanh(xt[2] + r * (h @ w[2] + b[2]))
                h = (1 - z) * n + z * h
                return (h,), h.clone()

            _, ys = _scan()(step, (h0,), xs)
        return ys.transpose(0, 1)


class RecurrentLM(nn.Module):
    def __init__(
        self, vocab: int, hidden: int, layers: int, cell: str, impl: str, dropout: float
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.layers = nn.ModuleList(RecurrentLayer(hidden, cell, impl) for _ in range(layers))
        self.drop = nn.Dropout(dropout)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.drop(self.embed(input_ids))
        for layer in self.layers:
            x = self.drop(layer(x))
        return self.head(x)


def make_lstm(hp: dict[str, Any]) -> ModelBundle:
    check_ints("lstm", hp, "vocab", "hidden", "layers")
    cell = check_choice("lstm", hp, "cell", tuple(CELLS))
    impl = check_choice("lstm", hp, "impl", IMPLS)
    dropout = check_float("lstm", hp, "dropout")
    if impl == "scan":
        _scan()
    build = partial(RecurrentLM, hp["vocab"], hp["hidden"], hp["layers"], cell, impl, dropout)
    return ModelBundle(
        name="lstm",
        family="rnn",
        build=build,
        make_inputs=partial(token_inputs, vocab=hp["vocab"]),
        loss=causal_lm_step,
        dims=dict(LSTM.dims),
        hparams=dict(hp),
        static_dims=("B", "S") if impl == "native" else (),
    )


LSTM = Family(
    name="lstm",
    family="rnn",
    source="in-house",
    task="causal-lm",
    defaults=dict(vocab=512, hidden=64, layers=1, cell="lstm", impl="native", dropout=0.0),
    ranges=dict(
        vocab=[512, 8192, 32000],
        hidden=[128, 256, 512, 1024],
        layers=[1, 2, 3, 4],
        cell=["lstm", "gru"],
        dropout=[0.0, 0.2],
    ),
    dims={"B": 4, "S": 32},
    factory=make_lstm,
    description="LSTM/GRU language model; time loop as a scan (symbolic S) or nn.LSTM/GRU",
)
FAMILIES = (LSTM,)
