"""Untrusted StepGraphs from the network: decode, check, build, and flag unknown ops.

Uploads are the `StepGraph.save` file (gzip-compressed JSON) or plain JSON. Before a
graph reaches `StepGraph.from_dict` it is checked here for what the library does not
guard against with untrusted input: symbol names must be plain identifiers (they become
parameter names of compiled size formulas), powers need a small constant exponent
(exact big-int evaluation of `B**B**B` never ends), and sizes are bounded (node count,
bytes before and after decompression). Errors are `RequestError`s (a ValueError with the
HTTP status and the location of the offending field) that the API layer turns into
413 / 422 responses.
"""

from __future__ import annotations

import ast
import gzip
import json
import keyword
import logging
import re
import zlib
from collections.abc import Iterable
from typing import Any

from memgnn.predictor.errors import UserError
from memgnn.predictor.ir.graph import FORMAT, StepGraph

log = logging.getLogger(__name__)

MAX_EXPONENT = 16
INT64_MAX = (1 << 63) - 1
MAX_EXPR_CHARS = 4096
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


class RequestError(UserError):
    """A bad request: `status` (404, 413, 422) and `loc`, the path of the field at fault."""

    def __init__(self, message: str, *, status: int = 422, loc: Iterable[str | int] = ("body",)):
        super().__init__(message, loc=loc)
        self.status = status


def decode_body(body: bytes, encoding: str | None, *, max_bytes: int) -> bytes:
    """The JSON bytes of an upload: gunzip when the header or the magic bytes say gzip,
    stopping at `max_bytes` of output (413 past it)."""
    enc = (encoding or "").strip().lower()
    if enc not in ("", "identity", "gzip", "x-gzip"):
        raise RequestError(
            f"unsupported Content-Encoding {encoding!r}; use gzip or none",
            status=415,
            loc=("header", "content-encoding"),
        )
    if enc in ("gzip", "x-gzip") or body[:2] == b"\x1f\x8b":
        inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
        try:
            out = inflater.decompress(body, max_bytes + 1)
        except zlib.error as exc:
            raise RequestError(f"body is not valid gzip: {exc}") from None
        if len(out) > max_bytes or inflater.unconsumed_tail:
            raise RequestError(f"decompressed body exceeds {max_bytes} bytes", status=413)
        if not inflater.eof:
            raise RequestError("body is truncated gzip")
        return out
    if len(body) > max_bytes:
        raise RequestError(f"body exceeds {max_bytes} bytes", status=413)
    return body


def parse_json(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise RequestError(f"body is not JSON: {exc}") from None


def count_nodes(data: dict[str, Any]) -> int:
    total = 0
    for p in data.get("paths") or []:
        if isinstance(p, dict) and isinstance(p.get("nodes"), dict):
            ops = p["nodes"].get("op")
            total += len(ops) if isinstance(ops, list) else 0
    return total


def build_graph(data: Any, *, max_nodes: int, loc: tuple[str | int, ...] = ("body",)) -> StepGraph:
    """A validated StepGraph from untrusted JSON data (see the module docstring)."""
    if not isinstance(data, dict):
        raise RequestError("a step graph must be a JSON object", loc=loc)
    if data.get("format") != FORMAT:
        raise RequestError(
            f"not a memgnn step graph: format must be {FORMAT!r}", loc=(*loc, "format")
        )
    _check_shape(data, loc)
    n_nodes = count_nodes(data)
    if n_nodes > max_nodes:
        raise RequestError(
            f"graph has {n_nodes} nodes, over this server's limit of {max_nodes}",
            status=413,
            loc=(*loc, "paths"),
        )
    _check_symbols(data, loc)
    _check_formulas(data, loc)
    try:
        graph = StepGraph.from_dict(data, "graph")
    except ValueError as exc:
        raise RequestError(str(exc), loc=loc) from None
    except (
        TypeError,
        KeyError,
        IndexError,
        AttributeError,
        ArithmeticError,
        RecursionError,
        SyntaxError,
        MemoryError,
    ) as exc:
        raise RequestError(f"malformed step graph: {type(exc).__name__}: {exc}", loc=loc) from None
    _check_sizes_at_example(graph, loc)
    return graph


def _check_sizes_at_example(graph: StepGraph, loc: tuple) -> None:
    """Every size formula is a byte count: non-negative at the graph's example sizes."""
    try:
        values = graph.table().evaluate_exact(graph.resolve_sizes(graph.symbols))
    except (ValueError, ArithmeticError) as exc:
        raise RequestError(f"size formulas fail at the example sizes: {exc}", loc=loc) from None
    for i, v in enumerate(values):
        if v < 0:
            raise RequestError(
                f"size formula {graph.exprs[i][:80]!r} is negative ({v}) at the example sizes "
                f"{graph.symbols}",
                loc=(*loc, "exprs", i),
            )


def _check_shape(data: dict[str, Any], loc: tuple) -> None:
    types = {
        "model": dict,
        "train": dict,
        "symbols": dict,
        "data_symbols": dict,
        "guards": list,
        "exprs": list,
        "paths": list,
    }
    for name, kind in types.items():
        if not isinstance(data.get(name), kind):
            what = "object" if kind is dict else "array"
            raise RequestError(f"field {name!r} must be a JSON {what}", loc=(*loc, name))
    if "meta" in data and not isinstance(data["meta"], dict):
        raise RequestError("field 'meta' must be a JSON object", loc=(*loc, "meta"))
    for k, p in enumerate(data["paths"]):
        where = (*loc, "paths", k)
        if not isinstance(p, dict):
            raise RequestError("a path must be a JSON object", loc=where)
        if not isinstance(p.get("conditions"), list):
            raise RequestError("path conditions must be an array", loc=(*where, "conditions"))
        for part in ("nodes", "storages"):
            cols = p.get(part)
            if not isinstance(cols, dict) or not all(isinstance(v, list) for v in cols.values()):
                raise RequestError(f"path {part} must be an object of arrays", loc=(*where, part))
        for name, col in (
            ("inputs", p["nodes"].get("inputs")),
            ("outputs", p["nodes"].get("outputs")),
        ):
            if col is not None and not all(isinstance(v, list) for v in col):
                raise RequestError(f"node {name} must be arrays", loc=(*where, "nodes", name))
        ops = p["nodes"].get("op")
        if ops is not None and not all(isinstance(o, str) for o in ops):
            raise RequestError("node ops must be strings", loc=(*where, "nodes", "op"))


def _check_symbols(data: dict[str, Any], loc: tuple) -> None:
    for field in ("symbols", "data_symbols"):
        for name, value in data[field].items():
            if not _IDENT.match(name) or keyword.iskeyword(name) or name.startswith("__"):
                raise RequestError(
                    f"bad symbol name {name!r}: expected an identifier", loc=(*loc, field, name)
                )
            if field == "symbols" and (isinstance(value, bool) or not isinstance(value, int)):
                raise RequestError(
                    f"symbol {name} needs an integer example value", loc=(*loc, field, name)
                )
            if field == "data_symbols" and not (
                isinstance(value, dict) and all(isinstance(v, str) for v in value.values())
            ):
                raise RequestError(
                    f"data symbol {name} must map bound names to formulas", loc=(*loc, field, name)
                )


def _check_formulas(data: dict[str, Any], loc: tuple) -> None:
    sources: list[tuple[tuple, Any]] = [
        ((*loc, "exprs", i), s) for i, s in enumerate(data["exprs"])
    ]
    sources += [((*loc, "guards", i), s) for i, s in enumerate(data["guards"])]
    for name, ds in data["data_symbols"].items():
        sources += [((*loc, "data_symbols", name, key), v) for key, v in ds.items()]
    for where, src in sources:
        if not isinstance(src, str):
            raise RequestError("a size formula must be a string", loc=where)
        if len(src) > MAX_EXPR_CHARS:
            raise RequestError(f"size formula longer than {MAX_EXPR_CHARS} characters", loc=where)
        try:
            tree = ast.parse(src, mode="eval")
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            raise RequestError(f"malformed size formula {src[:80]!r}", loc=where) from None
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and type(node.value) is int:
                if abs(node.value) > INT64_MAX:
                    raise RequestError(
                        f"integer constant wider than 64 bits in size formula {src[:80]!r}",
                        loc=where,
                    )
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
                exp = node.right
                if not (
                    isinstance(exp, ast.Constant)
                    and type(exp.value) is int
                    and 0 <= exp.value <= MAX_EXPONENT
                ):
                    raise RequestError(
                        f"powers need a constant exponent in [0, {MAX_EXPONENT}]: {src[:80]!r}",
                        loc=where,
                    )


def graph_bytes(graph: StepGraph) -> bytes:
    """The graph as `StepGraph.save` writes it (gzip-compressed JSON), for the store."""
    data = graph.content() | {"meta": graph.meta, "graph_id": graph.graph_id}
    return gzip.compress(json.dumps(data, separators=(",", ":")).encode(), compresslevel=6)
