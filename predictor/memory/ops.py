"""Which ops a memory model knows, and the plain `MemoryModel` as an `EncodingModel`.

An answer lists the ops of its graph the answering model has never seen (`unknown_ops`):
the learned model's feature vocabulary (`op_checker`), else the torch op registry. A
model without an encoding of its own is served through `Unencoded`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from memgnn.predictor.ir.graph import StepGraph
from memgnn.predictor.memory.base import EncodingModel, MemoryModel, Prediction, Query
from memgnn.predictor.memory.features import op_id
from memgnn.predictor.memory.onnx_model import OnnxMemoryModel

__all__ = ["Unencoded", "as_encoding_model", "op_checker", "unknown_ops"]

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


class Unencoded:
    """A plain `MemoryModel` as an `EncodingModel`: the encoding is the graph itself,
    every call goes to `predict`, one at a time (nothing says it is thread-safe)."""

    thread_safe = False

    def __init__(self, model: MemoryModel):
        self.model = model
        self.version = model.version

    def encode(self, graph: StepGraph) -> None:
        return None

    def predict_encoded(
        self, encoding: Any, graph: StepGraph, queries: Sequence[Query]
    ) -> list[Prediction]:
        return self.model.predict(graph, queries)

    def predict(self, graph: StepGraph, queries: Sequence[Query]) -> list[Prediction]:
        return self.model.predict(graph, queries)


def as_encoding_model(model: MemoryModel) -> EncodingModel:
    """`model` itself when it is an `EncodingModel`, else wrapped in `Unencoded`."""
    return model if isinstance(model, EncodingModel) else Unencoded(model)


def op_checker(model: Any) -> Callable[[str], bool] | None:
    """A predicate "this op is unknown to the model": from the model's `op_vocab` when it
    has one, from the learned models' feature vocabulary (`predictor.memory.features.op_id`)
    for `OnnxMemoryModel`; None (the caller checks the torch op registry) otherwise."""
    if isinstance(model, Unencoded):
        model = model.model
    vocab = getattr(model, "op_vocab", None)
    if vocab is not None:
        known = {str(op) for op in vocab}
        return lambda op: op not in known
    if isinstance(model, OnnxMemoryModel):
        return lambda op: op_id(op)[1]
    return None


_OP_CACHE: dict[str, bool] = {}


def _is_torch_op(op: str) -> bool:
    """Whether `op` ('name.overload', or 'namespace.name.overload') is a registered op."""
    known = _OP_CACHE.get(op)
    if known is not None:
        return known
    parts = op.split(".")
    ns, rest = ("aten", parts) if len(parts) <= 2 else (parts[0], parts[1:])
    ok = False
    if len(rest) == 2 and all(_IDENT.match(x) for x in (ns, *rest)):
        try:
            import torch

            packet = getattr(getattr(torch.ops, ns), rest[0])
            ok = rest[1] in packet.overloads()
        except (AttributeError, RuntimeError):
            ok = False
    if len(_OP_CACHE) < 100_000:
        _OP_CACHE[op] = ok
    return ok


def unknown_ops(graph: StepGraph, is_unknown: Callable[[str], bool] | None = None) -> list[str]:
    """Ops the model has never seen (`is_unknown`, see `op_checker`), by
    default the ops that are not registered torch ops. Sorted, unique."""
    ops = {op for p in graph.paths for op in p.nodes["op"]}
    check = is_unknown or (lambda op: not _is_torch_op(op))
    return sorted(op for op in ops if check(op))
