"""Size expressions: exact integer formulas in named symbols (B, S, ...), stored as text.

A captured storage's byte size is a sympy expression over the shape environment's symbols
(`32*s44*((s63 - 3)//2 + 1)**2`). We store it as Python source over the user's names
(`32*B*((S - 3)//2 + 1)**2`), check it against a small grammar when loading (no `eval` of
arbitrary text), and compile a whole table of them into one function that evaluates them
all at once, for Python ints (exact) or numpy int64 arrays (vectorised over many sizes).
"""

from __future__ import annotations

import ast
import keyword
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from memgnn.predictor.errors import UserError

_ALLOWED_BINOPS = (ast.Add, ast.Sub, ast.Mult, ast.FloorDiv, ast.Mod, ast.Pow)
_ALLOWED_CALLS = {"max", "min"}
_ALLOWED_NODES = (
    ast.Expression,
    ast.Load,
    ast.BinOp,
    ast.UnaryOp,
    ast.USub,
    ast.UAdd,
    *_ALLOWED_BINOPS,
    # guards are boolean formulas over sizes
    ast.Compare,
    ast.Lt,
    ast.LtE,
    ast.Gt,
    ast.GtE,
    ast.Eq,
    ast.NotEq,
    ast.BoolOp,
    ast.And,
    ast.Or,
    ast.Not,
)
_RELATIONS = {
    "StrictLessThan": "<",
    "LessThan": "<=",
    "StrictGreaterThan": ">",
    "GreaterThan": ">=",
    "Equality": "==",
    "Unequality": "!=",
}


def sympy_to_source(expr: Any, names: Mapping[Any, str]) -> str:
    """Python source for a sympy integer expression, with symbols renamed by `names`.

    Handles what torch's shape environment produces for sizes: +, *, integer powers,
    FloorDiv, CeilToInt-free Mod, Max/Min. Anything else raises ValueError naming it.
    """
    import sympy

    if isinstance(expr, int):
        return str(expr)
    if isinstance(expr, sympy.Integer):
        return str(int(expr))
    if expr is sympy.true or expr is sympy.false:
        return "(1 == 1)" if expr is sympy.true else "(1 == 0)"
    if isinstance(expr, sympy.Symbol):
        if expr not in names:
            raise UserError(f"size expression uses unknown symbol {expr}")
        return names[expr]
    fname = type(expr).__name__
    if fname in ("CeilToInt", "FloorToInt") and type(expr.args[0]).__name__ in (
        "IntTrueDiv",
        "TrueDiv",
    ):
        num, den = (sympy_to_source(a, names) for a in expr.args[0].args)
        if fname == "FloorToInt":
            return f"(({num})//({den}))"
        return f"(-((-({num}))//({den})))"
    args = [sympy_to_source(a, names) for a in expr.args]
    if isinstance(expr, sympy.Add):
        return "(" + " + ".join(args) + ")"
    if isinstance(expr, sympy.Mul):
        return "*".join(f"({a})" if a.startswith("-") else a for a in args)
    if isinstance(expr, sympy.Pow):
        base, exp = expr.args
        if not (isinstance(exp, sympy.Integer) and int(exp) >= 0):
            raise UserError(f"non-integer power in size expression: {expr}")
        return f"({args[0]})**{int(exp)}"
    if fname == "FloorDiv":
        return f"(({args[0]})//({args[1]}))"
    if fname == "CeilDiv":
        return f"(-((-({args[0]}))//({args[1]})))"
    if fname in ("Mod", "PythonMod"):
        return f"(({args[0]})%({args[1]}))"
    if fname in _RELATIONS:
        return f"({args[0]} {_RELATIONS[fname]} {args[1]})"
    if fname in ("And", "Or"):
        return "(" + f" {fname.lower()} ".join(args) + ")"
    if fname == "Not":
        return f"(not {args[0]})"
    if fname == "Max":
        return "max(" + ", ".join(args) + ")"
    if fname == "Min":
        return "min(" + ", ".join(args) + ")"
    raise UserError(f"unsupported operation {fname} in size expression {expr}")


MAX_EXPONENT = 16
_INT64_MAX = int(np.iinfo(np.int64).max)
_SYMBOL = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")


def check_symbols(symbols: Sequence[str]) -> None:
    """Symbol names become parameters of compiled code: identifiers only."""
    for s in symbols:
        if not isinstance(s, str) or not _SYMBOL.match(s) or keyword.iskeyword(s):
            raise UserError(f"bad size symbol name {s!r}: expected an identifier")
        if s in _ALLOWED_CALLS:
            raise UserError(f"size symbol name {s!r} is reserved")


def validate_source(src: str, symbols: Sequence[str]) -> ast.Expression:
    """Parse `src` and check it uses only integer arithmetic over `symbols`; powers need a
    constant exponent of at most MAX_EXPONENT (no `B**B**B` that never finishes)."""
    check_symbols(symbols)
    if not isinstance(src, str):
        raise UserError(f"size expression must be text, got {type(src).__name__}")
    try:
        tree = ast.parse(src, mode="eval")
    except SyntaxError as exc:
        raise UserError(f"malformed size expression {src!r}: {exc.msg}") from None
    allowed = set(symbols)
    call_names = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            if node.id in allowed or (node.id in _ALLOWED_CALLS and id(node) in call_names):
                continue
            raise UserError(f"size expression {src!r} uses unknown symbol {node.id!r}")
        if isinstance(node, ast.Call):
            ok = isinstance(node.func, ast.Name) and node.func.id in _ALLOWED_CALLS
            if ok and not node.keywords and node.args:
                continue
        elif isinstance(node, ast.Constant):
            if type(node.value) is int and abs(node.value) <= _INT64_MAX:
                continue
            if type(node.value) is int:
                raise UserError(
                    f"size expression {src[:80]!r}: integer constant wider than 64 bits"
                )
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
            exp = node.right
            if isinstance(exp, ast.Constant) and type(exp.value) is int:
                if 0 <= exp.value <= MAX_EXPONENT:
                    continue
            raise UserError(
                f"size expression {src!r}: powers need a constant exponent in 0..{MAX_EXPONENT}"
            )
        elif isinstance(node, _ALLOWED_NODES):
            continue
        raise UserError(f"size expression {src!r} contains disallowed {type(node).__name__}")
    return tree


def _np_max(*xs: Any) -> Any:
    out = xs[0]
    for x in xs[1:]:
        out = np.maximum(out, x)
    return out


def _np_min(*xs: Any) -> Any:
    out = xs[0]
    for x in xs[1:]:
        out = np.minimum(out, x)
    return out


def magnitude(tree: ast.AST, top: int) -> int:
    """An upper bound of |value| over every subexpression of a validated formula when each
    symbol lies in [0, top]: whether int64 evaluation can overflow anywhere inside it."""
    worst = 0

    def bound(node: ast.AST) -> int:
        nonlocal worst
        if isinstance(node, ast.Expression):
            return bound(node.body)
        if isinstance(node, ast.Constant):
            b = abs(int(node.value))
        elif isinstance(node, ast.Name):
            b = top
        elif isinstance(node, ast.UnaryOp):
            b = bound(node.operand)
        elif isinstance(node, ast.BinOp):
            left, right = bound(node.left), bound(node.right)
            if isinstance(node.op, (ast.Add, ast.Sub)):
                b = left + right
            elif isinstance(node.op, ast.Mult):
                b = left * right
            elif isinstance(node.op, ast.Pow):
                assert isinstance(node.right, ast.Constant), "validated: constant exponent"
                b = left ** int(node.right.value)
            elif isinstance(node.op, ast.FloorDiv):
                b = left + 1  # |a // b| <= |a| + 1 for any non-zero integer b
            else:  # Mod: |a % b| < |b|
                b = right
        elif isinstance(node, ast.Call):
            b = max(bound(a) for a in node.args)
        elif isinstance(node, (ast.Compare, ast.BoolOp)):
            parts = [node.left, *node.comparators] if isinstance(node, ast.Compare) else node.values
            b = max(bound(a) for a in parts)
        else:
            b = 0
        worst = max(worst, b)
        return b

    bound(tree)
    return worst


class ExprTable:
    """A table of size expressions compiled into one vectorised evaluator.

    `evaluate(sizes)` returns an int64 array (one entry per expression) for int sizes, or a
    2-D array [n_exprs, n_points] when the sizes are arrays of equal length.
    `evaluate_exact` returns Python ints (no overflow) for checks and tests.
    """

    def __init__(self, sources: Sequence[str], symbols: Sequence[str]):
        self.sources = list(sources)
        self.symbols = list(symbols)
        self._trees = [validate_source(src, self.symbols) for src in self.sources]
        # sizes below 2**16 cannot overflow int64 anywhere in these formulas
        self._small_is_safe = self._fits(1 << 16)
        args = ", ".join(self.symbols)
        body = ", ".join(f"({s})" for s in self.sources)
        code = f"lambda {args}: ({body}{',' if len(self.sources) == 1 else ''})"
        self._exact = eval(code, {"__builtins__": {}, "max": max, "min": min})  # validated above
        self._vector = eval(code, {"__builtins__": {}, "max": _np_max, "min": _np_min})

    def __len__(self) -> int:
        return len(self.sources)

    def _fits(self, top: int) -> bool:
        return all(magnitude(t, top) <= _INT64_MAX for t in self._trees)

    def _check_range(self, args: list[np.ndarray]) -> None:
        """Exact evaluation at the largest sizes must fit in int64 (numpy would wrap)."""
        if not args:
            return
        top = {s: int(np.max(a)) for s, a in zip(self.symbols, args)}
        if any(v < 0 for v in top.values()):
            raise UserError(f"sizes must be non-negative, got {top}")
        largest = max(top.values(), default=0)
        if (largest < 2**16 and self._small_is_safe) or self._fits(largest):
            return
        if max((abs(v) for v in self.evaluate_exact(top)), default=0) > _INT64_MAX:
            raise UserError(f"sizes {top} give byte counts beyond 2**63")
        # the results fit, an intermediate value may not (numpy would wrap it silently)
        raise UserError(f"sizes {top} overflow 64-bit integers inside a size formula")

    def _args(self, sizes: Mapping[str, Any]) -> list[Any]:
        missing = [s for s in self.symbols if s not in sizes]
        if missing:
            raise UserError(f"sizes missing for symbols {missing}")
        return [sizes[s] for s in self.symbols]

    def evaluate_exact(self, sizes: Mapping[str, int]) -> list[int]:
        try:
            return [int(v) for v in self._exact(*self._args(sizes))]
        except ZeroDivisionError:
            raise UserError(f"size expression divides by zero at {dict(sizes)}") from None

    def evaluate(self, sizes: Mapping[str, Any]) -> np.ndarray:
        """int64 values; ValueError when a value would not fit in int64 (no silent wrap)."""
        args = [np.asarray(a, dtype=np.int64) for a in self._args(sizes)]
        if not self.sources:
            return np.zeros((0,), dtype=np.int64)
        self._check_range(args)
        with np.errstate(divide="raise", over="raise"):
            try:
                vals = self._vector(*args)
            except (FloatingPointError, ZeroDivisionError, OverflowError) as exc:
                raise UserError(f"size expression cannot be evaluated: {exc}") from None
        shape = np.broadcast_shapes(*(a.shape for a in args))  # any number of symbols
        if not shape:  # scalar sizes: one conversion for the whole table
            return np.array(vals, dtype=np.int64)
        out = np.empty((len(vals), *shape), dtype=np.int64)
        for i, v in enumerate(vals):  # constants broadcast on assignment
            out[i] = v
        return out


def simplify_sum(sources: Sequence[str], symbols: Sequence[str]) -> str:
    """The sum of expressions as one expanded polynomial text (for display)."""
    import sympy

    syms = {s: sympy.Symbol(s, integer=True, positive=True) for s in symbols}
    local = {**syms, "max": sympy.Max, "min": sympy.Min}
    total = sympy.Integer(0)
    for src in sources:
        validate_source(src, symbols)
        total += sympy.sympify(src.replace("//", " // "), locals=local)
    return str(sympy.expand(total))
