"""Index bounds a captured step relies on: sizes past a model's lookup tables.

Fake tensors hold no values, so a fake step never fails where the real one raises
`IndexError: index out of range` (GPT-2 at more positions than its `wpe` table has rows:
the real step fails, the capture does not). The indices of such a lookup are, in every
model that derives positions from the sequence length, a `torch.arange` over it; their
values are then known exactly without data: [start, end - 1] (shifted by an integer
added to them).

`index_bound_hooks()` gives the recorder dispatch hooks that remember the value range of
each storage an `arange` allocates and, at `aten.embedding`, check that the largest index
is below the table's rows. With symbolic sizes the check is a comparison of SymInts, so
the shape environment records it as a guard (`S <= 1024`) like any other the step relies
on; a query past it is then refused (`predict.GuardViolation`). Where the check fails at
the traced sizes themselves the capture raises `CaptureError` naming the module.
An in-place write to an arange's storage drops its range (its values are no longer known).
"""

from __future__ import annotations

from typing import Any

import torch
from memgnn.predictor.capture.branches import CaptureError

__all__ = ["index_bound_hooks"]

aten = torch.ops.aten


class _Bounds:
    def __init__(self) -> None:
        # (recorder, storage uid) -> (lowest, highest, node that made it)
        self.ranges: dict[tuple[int, int], tuple[Any, Any, int]] = {}

    def arange(self, rec: Any, func: Any, args: tuple, kwargs: dict) -> Any:
        out = func(*args, **kwargs)
        node = rec.record_op(str(func).removeprefix("aten."), (args, kwargs), out)
        if rec.scratch is not None:
            node.scratch = rec.scratch(func, args)
        start, end = (0, args[0]) if func is aten.arange.default else (args[0], args[1])
        step = args[2] if len(args) > 2 else kwargs.get("step", 1)
        uid = rec.uid_of(out)
        ints = (int, torch.SymInt)
        if uid is not None and isinstance(start, ints) and isinstance(end, ints) and step == 1:
            self.ranges[(id(rec), uid)] = (start, end - 1, len(rec.nodes) - 1)
        return out

    def add(self, rec: Any, func: Any, args: tuple, kwargs: dict) -> Any:
        """aten.add.Tensor: an arange plus an integer keeps a known range, shifted (HF's
        `arange(S) + past_seen_tokens`)."""
        out = func(*args, **kwargs)
        node = rec.record_op("add.Tensor", (args, kwargs), out)
        if rec.scratch is not None:
            node.scratch = rec.scratch(func, args)
        other, alpha = args[1], args[2] if len(args) > 2 else kwargs.get("alpha", 1)
        ints = (int, torch.SymInt)
        if isinstance(other, ints) and not isinstance(other, bool) and isinstance(alpha, int):
            hit = self._range(rec, args[0]) if isinstance(args[0], torch.Tensor) else None
            uid = rec.uid_of(out)
            if hit is not None and uid is not None:
                shift = other * alpha
                self.ranges[(id(rec), uid)] = (hit[0] + shift, hit[1] + shift, len(rec.nodes) - 1)
        return out

    def _range(self, rec: Any, indices: Any) -> tuple[Any, Any] | None:
        uid = rec.uid_of(indices)
        hit = self.ranges.get((id(rec), uid))
        if hit is None:
            return None
        for node in rec.nodes[hit[2] + 1 :]:  # an in-place write since: values unknown
            if uid in node.outputs and node.op.split(".")[0].endswith("_"):
                return None
        return hit[0], hit[1]

    def embedding(self, rec: Any, func: Any, args: tuple, kwargs: dict) -> Any:
        weight, indices = args[0], args[1]
        bound = self._range(rec, indices)
        if bound is not None:
            rows = weight.shape[0]
            if not bool(bound[1] < rows):  # symbolic: recorded as a guard of the capture
                module = rec.module_stack[-1] if rec.module_stack else "<root>"
                highest = bound[1].node.hint if isinstance(bound[1], torch.SymInt) else bound[1]
                raise CaptureError(
                    f"module {module!r} looks up index {highest} in a table of {rows} rows "
                    f"(its positions): the model supports at most {rows} there, and the real "
                    "step would fail with IndexError"
                )
        out = func(*args, **kwargs)
        node = rec.record_op("embedding.default", (args, kwargs), out)
        if rec.scratch is not None:
            node.scratch = rec.scratch(func, args)
        return out


def index_bound_hooks() -> dict[Any, Any]:
    """Recorder hooks tracking arange value ranges into embedding lookups (one capture
    run: the ranges are per recorder's storage uids, so make a new table per run)."""
    b = _Bounds()
    return {
        aten.arange.default: b.arange,
        aten.arange.start: b.arange,
        aten.arange.start_step: b.arange,
        aten.add.Tensor: b.add,
        aten.embedding.default: b.embedding,
    }
