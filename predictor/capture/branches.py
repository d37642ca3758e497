"""Data-dependent control flow during capture: branch paths and data-dependent sizes.

- A boolean read of a tensor (`if bool(t)`, `t.item()` on a bool, `torch.cond`) is a
  branch point. Capture runs the step once per path: each run follows a prefix of
  decisions and takes False at every new branch point; the other side of each new point is
  queued (depth-first), so all paths are enumerated, up to a cap. Decision k of every
  micro-step and step follows decision k of the first, so one path is one choice sequence.
- `nonzero` (and `torch.where(mask)`, `nonzero(as_tuple=True)`) has a data-dependent length
  n. Capture gives n a named symbol with explicit bounds: min 0, worst = numel(mask) (a
  sound upper bound), balanced = numel / num_experts of the innermost module that declares
  `num_experts` (tokens spread evenly over experts), else numel / 2.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from typing import Any

import torch
from memgnn.predictor.ir.recorder import StepRecorder

log = logging.getLogger(__name__)

aten = torch.ops.aten


class CaptureError(ValueError):
    """A model step that cannot be captured; the message names the op and the module."""


@dataclass(slots=True)
class BranchState:
    """Decisions for one capture run plus the data-dependent symbols it created."""

    prefix: list[bool]
    values: list[bool] = field(default_factory=list)
    conditions: list[dict[str, Any]] = field(default_factory=list)
    counter: int = 0
    pending_kind: str | None = None
    # data symbols: name -> {"lo","balanced","hi" (SymInt/int), op, module}
    data: dict[str, dict[str, Any]] = field(default_factory=dict)
    nonzero_counter: int = 0

    def reset_counters(self) -> None:
        self.counter = 0
        self.nonzero_counter = 0

    def decide(self, kind: str, module: str) -> bool:
        i = self.counter
        self.counter += 1
        if i < len(self.values):
            return self.values[i]
        value = self.prefix[i] if i < len(self.prefix) else False
        self.values.append(value)
        self.conditions.append({"index": i, "kind": kind, "module": module, "value": value})
        return value


def alternatives(state: BranchState) -> list[list[bool]]:
    """Prefixes of the paths not yet taken that branch off this run's new decisions."""
    out = []
    for j in range(len(state.prefix), len(state.values)):
        if not state.values[j]:
            out.append(state.values[:j] + [True])
    return out


def _innermost_attr(model_modules: dict[str, torch.nn.Module], stack: list[str], attr: str):
    for name in reversed(stack):
        mod = model_modules.get(name)
        value = getattr(mod, attr, None) if mod is not None else None
        if isinstance(value, int) and value > 0:
            return value
    return None


class DataHooks:
    """Dispatch hooks for the recorder: branch decisions and data-dependent sizes."""

    def __init__(
        self,
        state: BranchState,
        modules: dict[str, torch.nn.Module],
        *,
        shape_env: Any | None,
        scenario: str,
    ):
        self.state = state
        self.modules = modules
        self.shape_env = shape_env
        self.scenario = scenario

    def table(self) -> dict[Any, Any]:
        return {
            aten._local_scalar_dense.default: self.local_scalar,
            aten.nonzero.default: self.nonzero,
        }

    def _module(self, rec: StepRecorder) -> str:
        return rec.module_stack[-1] if rec.module_stack else "<root>"

    def local_scalar(self, rec: StepRecorder, func, args, kwargs):
        (t,) = args
        try:
            value = func(*args, **kwargs)
        except Exception:  # fake tensors hold no data
            value = None
        if isinstance(value, (bool, int, float)) and not isinstance(value, torch.SymBool):
            return value  # a known constant (e.g. a scalar created from a Python number)
        if t.dtype != torch.bool and rec.phase == "optimizer":
            # Optimizers read their step counter on the host (Adafactor's `step.item()`);
            # it changes values, never sizes: give the counter it would hold.
            count = rec.step + 1
            return float(count) if t.dtype.is_floating_point else count
        if t.dtype != torch.bool:
            raise CaptureError(
                f"data-dependent {t.dtype} value read with .item()/int() in module "
                f"{self._module(rec)!r} (op aten._local_scalar_dense); memgnn captures boolean "
                "branches and nonzero-sized routing, not arbitrary data-dependent scalars"
            )
        kind = self.state.pending_kind or "bool"
        return self.state.decide(kind, self._module(rec))

    def nonzero(self, rec: StepRecorder, func, args, kwargs):
        (t,) = args
        module = self._module(rec)
        numel = t.numel()
        experts = _innermost_attr(self.modules, rec.module_stack, "num_experts")
        balanced = numel // experts if experts else numel // 2
        bounds = {"lo": 0, "balanced": balanced, "hi": numel}
        name = f"nz{self.state.nonzero_counter}"
        self.state.nonzero_counter += 1
        if name not in self.state.data:
            self.state.data[name] = {**bounds, "op": "nonzero", "module": module}
        if self.shape_env is not None:
            data = self.state.data[name]
            if "symint" not in data:  # later micro-steps and steps reuse the symbol
                data["symint"] = self._symbol(name, bounds)
                data["symbol"] = data["symint"].node.expr
            n = data["symint"]
        else:
            key = {"min": "lo", "balanced": "balanced", "worst": "hi"}[self.scenario]
            n = bounds[key]
        out = torch.empty((n, t.dim()), dtype=torch.long, device=t.device)
        rec.record_op("nonzero.default", args, out)
        return out

    def _symbol(self, name: str, bounds: dict[str, Any]):
        from torch._dynamo.source import ConstantSource
        from torch.fx.experimental.symbolic_shapes import DimDynamic

        env = self.shape_env
        balanced, hi = bounds["balanced"], bounds["hi"]
        hint = balanced.node.hint if isinstance(balanced, torch.SymInt) else balanced
        hi_hint = hi.node.hint if isinstance(hi, torch.SymInt) else hi
        hint = max(min(int(hint), int(hi_hint)), min(2, int(hi_hint)))
        sym = env.create_symbol(hint, ConstantSource(name), dynamic_dim=DimDynamic.DYNAMIC)
        return env.create_symintnode(sym, hint=hint)


@contextlib.contextmanager
def patched_cond(state: BranchState):
    """Run `torch.cond` eagerly as a branch point: one side per path."""
    original = torch.cond

    def cond(pred, true_fn, false_fn, operands=(), *args, **kwargs):
        if isinstance(pred, torch.Tensor):
            state.pending_kind = "torch.cond"
            try:
                take = bool(pred)
            finally:
                state.pending_kind = None
        else:
            take = bool(pred)
        return (true_fn if take else false_fn)(*operands)

    torch.cond = cond
    try:
        yield
    finally:
        torch.cond = original
