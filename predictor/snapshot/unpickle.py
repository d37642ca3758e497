"""A data-only unpickler that bounds its work while it builds (snapshot files are untrusted).

Python's C unpickler cannot be asked how much it has built, so a 7.8 KB gzip upload that
decompresses to 8 MB of ``EMPTY_DICT`` opcodes used to cost 1.33 GB before anything looked
at its shape. :func:`bounded_load` runs the standard library's pure-Python unpickler
(``pickle._Unpickler``) with a dispatch table of its own:

* only the opcodes of plain data (None, bool, int, float, str, bytes, tuple, list, dict,
  set, frozenset, the memo and framing) run; ``GLOBAL`` / ``STACK_GLOBAL`` reach
  :meth:`find_class`, which refuses; every other opcode (``REDUCE``, ``BUILD``, ``INST``,
  ``OBJ``, ``NEWOBJ``, ``EXT*``, persistent ids, out-of-band buffers) is refused;
* every value pushed (new or a memo reference) counts against ``max_objects``;
* the bytes of what is built (``sys.getsizeof`` of each new value, the growth of each
  container, memo and stack slots) count against ``max_memory_bytes``;
* containers carry their nesting depth as they are filled (``max_depth``), and the input
  is read through a reader that stops after ``max_bytes`` decompressed bytes, so a gzip
  bomb is never inflated beyond the limit.

The first limit crossed raises :class:`SnapshotError` naming it. A container filled after
it was placed inside another can deepen its parents without the parents seeing it; the
loader's walk of the finished (bounded) object catches that case.

Counting costs time (the pure-Python unpickler is 20-50x slower than the C one), so an
input too small to break any limit (:func:`fast_path_bytes`: one opcode byte builds at
most 256 bytes of objects) goes through the C unpickler, still refusing every global.
"""

from __future__ import annotations

import gzip
import io
import pickle
import sys
import zlib
from dataclasses import dataclass
from typing import Any, BinaryIO

from memgnn.predictor.errors import UserError

__all__ = ["GZIP_MAGIC", "LoadLimits", "SnapshotError", "bounded_load", "fast_path_bytes"]

GZIP_MAGIC = b"\x1f\x8b"
_CONTAINERS = (dict, list, tuple, set, frozenset)
_PLAIN = (str, int, float, bool, bytes, type(None))


class SnapshotError(UserError):
    """The file is not a snapshot this loader accepts (the message says why)."""


@dataclass(kw_only=True, slots=True)
class LoadLimits:
    """Bounds on what a snapshot file may make the loader do.

    Measured (``benchmarks/snapshot_fidelity.py``, "Loader work"): the largest shared real
    recording, 1.42 MB of pickle, pushes 306,160 values, builds 17.4 MB of objects and
    nests 5 deep: the defaults leave 26x (values), 7.7x (object bytes) and 47x
    (decompressed bytes). A synthetic recording shaped like PyTorch's with stack frames
    (100,000 events, 30 shared frames each, the ``max_entries`` PyTorch's docs suggest)
    is 19.8 MB of pickle, 4.5 M values and 131 MB: 98% of the object-bytes limit; raise
    the limits (CLI ``--max-memory``, ``--max-objects``) for larger recordings of your own.
    The hostile probe's 8 million empty dicts (a 7,811-byte gzip) are refused after 1.5 s
    with 135 MB traced (unbounded: 717 MB).
    """

    max_bytes: int = 64 << 20  # decompressed pickle bytes
    max_objects: int = 8_000_000  # values pushed while building (new or memo references)
    max_memory_bytes: int = 128 << 20  # sys.getsizeof of what is built, plus slots
    max_depth: int = 64  # nesting of containers
    max_size_bytes: int = 1 << 40  # one allocation / segment / block: beyond any device

    def __post_init__(self) -> None:
        for name in ("max_bytes", "max_objects", "max_memory_bytes", "max_size_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_depth < 4:
            raise ValueError(f"max_depth must be >= 4, got {self.max_depth}")


def check_depth(obj: Any, max_depth: int, what: str) -> None:
    """Iterative walk of the finished (bounded) object: every value is plain data and
    containers nest <= max_depth, also where a container was deepened after it was
    placed in another (which the counting unpickler cannot see)."""
    stack: list[tuple[Any, int]] = [(obj, 1)]
    seen: set[int] = set()  # shared sub-objects (pickle memo) are walked once
    while stack:
        value, depth = stack.pop()
        if isinstance(value, _PLAIN):
            continue
        if depth > max_depth:
            raise SnapshotError(
                f"{what} nests deeper than max_depth={max_depth} levels (LoadLimits.max_depth)"
            )
        if id(value) in seen:
            continue
        seen.add(id(value))
        if isinstance(value, dict):
            stack.extend((v, depth + 1) for v in value.values() if not isinstance(v, _PLAIN))
            stack.extend((k, depth + 1) for k in value.keys() if not isinstance(k, _PLAIN))
        elif isinstance(value, (list, tuple, set, frozenset)):
            stack.extend((v, depth + 1) for v in value if not isinstance(v, _PLAIN))
        else:  # pragma: no cover - the unpickler builds nothing else
            raise SnapshotError(f"{what} holds a {type(value).__name__}, not plain data")


class _BoundedReader:
    """``read`` / ``readline`` over a stream that stop past ``limit`` bytes."""

    def __init__(self, stream: BinaryIO, limit: int, what: str) -> None:
        self._stream, self._limit, self._what, self.used = stream, limit, what, 0

    def _account(self, data: bytes) -> bytes:
        self.used += len(data)
        if self.used > self._limit:
            raise SnapshotError(
                f"{self._what} is larger than max_bytes={self._limit} bytes (decompressed; "
                "LoadLimits.max_bytes)"
            )
        return data

    def read(self, n: int = -1) -> bytes:
        room = self._limit - self.used + 1
        return self._account(self._stream.read(room if n is None or n < 0 else min(n, room)))

    def readline(self) -> bytes:
        return self._account(self._stream.readline(self._limit - self.used + 1))


def _op(name: str) -> int:
    return getattr(pickle, name)[0]


_NEW = [  # push one new value
    "NONE", "NEWTRUE", "NEWFALSE", "INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1",
    "LONG4", "FLOAT", "BINFLOAT", "STRING", "BINSTRING", "SHORT_BINSTRING", "UNICODE",
    "BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8", "BINBYTES", "SHORT_BINBYTES",
    "BINBYTES8", "EMPTY_TUPLE", "EMPTY_LIST", "EMPTY_DICT", "EMPTY_SET",
]  # fmt: skip
_REF = ["GET", "BINGET", "LONG_BINGET", "DUP"]  # push a reference to a value built before
_FROM_MARK = ["TUPLE", "LIST", "DICT", "FROZENSET"]  # the items since MARK -> a new container
_WRAP = {"TUPLE1": 1, "TUPLE2": 2, "TUPLE3": 3}  # the top k items -> a new tuple
_FILL_ONE = {"APPEND": 1, "SETITEM": 2}  # the top k items into the container below them
_FILL_MARK = ["APPENDS", "SETITEMS", "ADDITEMS"]  # the items since MARK into the container
_MEMO = ["PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE"]
_PASS = ["PROTO", "FRAME", "STOP", "POP", "POP_MARK", "GLOBAL", "STACK_GLOBAL"]
_SLOT = 8  # a pointer in the stack, a list or the memo
_MEMO_ENTRY = 64  # a memo dict entry with its int key


class _Counting(pickle._Unpickler):
    """``pickle._Unpickler`` with counted, data-only opcodes (module docstring)."""

    def __init__(self, reader: _BoundedReader, limits: LoadLimits, what: str) -> None:
        super().__init__(reader)
        self.limits, self.what = limits, what
        self.objects_left, self.memory_left = limits.max_objects, limits.max_memory_bytes
        self.max_depth_seen = 1
        self._depth: dict[int, int] = {}  # id(container) -> depth, where > 1

    def find_class(self, module: str, name: str):  # noqa: ARG002 - refuse every global
        raise SnapshotError(
            f"refusing to load {module}.{name}: a snapshot holds only plain data, and this "
            "file asks to import code"
        )

    def persistent_load(self, pid):  # noqa: ARG002
        raise SnapshotError("refusing a pickle with persistent ids (not a snapshot)")

    # ---- accounting -----------------------------------------------------------------
    def over(self) -> None:
        """Raise for the limit just crossed (called when a budget went below zero)."""
        lim = self.limits
        if self.objects_left < 0:
            raise SnapshotError(
                f"{self.what} builds more than max_objects={lim.max_objects:,} values "
                "(LoadLimits.max_objects; CLI --max-objects); refused while loading"
            )
        raise SnapshotError(
            f"{self.what} builds more than max_memory_bytes={lim.max_memory_bytes:,} bytes "
            "of Python objects (LoadLimits.max_memory_bytes; CLI --max-memory); refused while "
            "loading"
        )

    def filled(self, container: Any, items: list[Any], before: int) -> None:
        """``items`` went into ``container``: its depth and growth."""
        depth = self._depth
        inner = max((depth.get(id(x), 1) for x in items if type(x) in _CONTAINER_TYPES), default=0)
        if inner:
            d = max(depth.get(id(container), 1), inner + 1)
            if d > self.limits.max_depth:
                raise SnapshotError(
                    f"{self.what} nests deeper than max_depth={self.limits.max_depth} levels "
                    "(LoadLimits.max_depth)"
                )
            depth[id(container)] = d
            if d > self.max_depth_seen:
                self.max_depth_seen = d
        self.memory_left -= getsizeof(container) - before
        if self.memory_left < 0:
            self.over()


_base = pickle._Unpickler.dispatch
_CONTAINER_TYPES = frozenset(_CONTAINERS)
getsizeof = sys.getsizeof


def _new(fn):
    def op(self: _Counting) -> None:
        fn(self)
        self.objects_left -= 1
        self.memory_left -= getsizeof(self.stack[-1]) + _SLOT
        if self.objects_left < 0 or self.memory_left < 0:
            self.over()

    return op


def _new_container(fn):
    def op(self: _Counting) -> None:
        fn(self)
        top = self.stack[-1]
        self._depth.pop(id(top), None)  # an id reused after a container died
        self.objects_left -= 1
        self.memory_left -= getsizeof(top) + _SLOT
        if self.objects_left < 0 or self.memory_left < 0:
            self.over()

    return op


def _ref(fn):
    def op(self: _Counting) -> None:
        fn(self)
        self.objects_left -= 1
        self.memory_left -= _SLOT
        if self.objects_left < 0 or self.memory_left < 0:
            self.over()

    return op


def _built(fn, k: int | None):
    """A new container from the top ``k`` items (None: the items since MARK)."""

    def op(self: _Counting) -> None:
        items = self.stack if k is None else self.stack[-k:]
        fn(self)
        top = self.stack[-1]
        self._depth.pop(id(top), None)
        self.objects_left -= 1
        self.memory_left -= _SLOT
        if self.objects_left < 0:
            self.over()
        self.filled(top, items, 0)

    return op


def _fill_one(fn, k: int):
    def op(self: _Counting) -> None:
        stack = self.stack
        container, items = stack[-k - 1], stack[-k:]
        before = getsizeof(container)
        fn(self)
        self.filled(container, items, before)

    return op


def _fill_mark(fn):
    def op(self: _Counting) -> None:
        items, container = self.stack, self.metastack[-1][-1]
        before = getsizeof(container)
        fn(self)
        self.filled(container, items, before)

    return op


def _memo(fn):
    def op(self: _Counting) -> None:
        fn(self)
        self.memory_left -= _MEMO_ENTRY
        if self.memory_left < 0:
            self.over()

    return op


def _mark(self: _Counting) -> None:
    _base[pickle.MARK[0]](self)
    self.memory_left -= getsizeof(self.stack)
    if self.memory_left < 0:
        self.over()
    if len(self.metastack) > self.limits.max_depth:
        raise SnapshotError(
            f"{self.what} nests deeper than max_depth={self.limits.max_depth} levels "
            "(LoadLimits.max_depth)"
        )


def _refuse(code: int):
    def op(self: _Counting) -> None:
        import pickletools  # deferred: only to name a refused opcode

        name = next((d.name for d in pickletools.opcodes if d.code == chr(code)), None)
        if name is None:
            raise SnapshotError(f"{self.what} is not a readable pickle (opcode {code:#04x})")
        raise SnapshotError(
            f"refusing pickle opcode {name} in {self.what}: a snapshot holds only plain data"
        )

    return op


def _dispatch() -> dict[int, Any]:
    table: dict[int, Any] = {code: _refuse(code) for code in range(256)}
    for name in _NEW:
        wrap = _new_container if name.startswith("EMPTY_") else _new
        table[_op(name)] = wrap(_base[_op(name)])
    for name in _REF:
        table[_op(name)] = _ref(_base[_op(name)])
    for name in _FROM_MARK:
        table[_op(name)] = _built(_base[_op(name)], None)
    for name, k in _WRAP.items():
        table[_op(name)] = _built(_base[_op(name)], k)
    for name, k in _FILL_ONE.items():
        table[_op(name)] = _fill_one(_base[_op(name)], k)
    for name in _FILL_MARK:
        table[_op(name)] = _fill_mark(_base[_op(name)])
    for name in _MEMO:
        table[_op(name)] = _memo(_base[_op(name)])
    for name in _PASS:
        table[_op(name)] = _base[_op(name)]
    table[pickle.MARK[0]] = _mark
    return table


_Counting.dispatch = _dispatch()


class _Plain(pickle.Unpickler):
    """The C unpickler, refusing every global (for inputs too small to break a limit)."""

    find_class = _Counting.find_class
    persistent_load = _Counting.persistent_load


class _Chain:
    """``prefix`` then the rest of ``reader``."""

    def __init__(self, prefix: bytes, reader: _BoundedReader) -> None:
        self._head, self._reader = io.BytesIO(prefix), reader

    def read(self, n: int = -1) -> bytes:
        data = self._head.read(n)
        if n is None or n < 0:
            return data + self._reader.read()
        return data + self._reader.read(n - len(data)) if len(data) < n else data

    def readline(self) -> bytes:
        data = self._head.readline()
        return data if data.endswith(b"\n") else data + self._reader.readline()


def fast_path_bytes(limits: LoadLimits) -> int:
    """Inputs up to this many decompressed bytes cannot break ``limits``: one opcode byte
    builds at most ``WORST_BYTES_PER_BYTE`` bytes of objects (an empty set and its slot,
    measured with tracemalloc) and pushes at most one value."""
    return min(
        limits.max_bytes, limits.max_memory_bytes // WORST_BYTES_PER_BYTE, limits.max_objects
    )


WORST_BYTES_PER_BYTE = 256


def bounded_load(
    raw: bytes, limits: LoadLimits, what: str, *, always_count: bool = False
) -> tuple[Any, dict[str, int | None]]:
    """Unpickle ``raw`` (plain or gzip) within ``limits``; returns the object and the work
    it took (``bytes``, ``objects``, ``memory_bytes``, ``depth``; None where not counted).

    Inputs no larger than :func:`fast_path_bytes` go through the C unpickler (data only:
    every global refused), which is 20-50x faster; larger ones (or ``always_count``)
    through the counting one."""
    gz = raw.startswith(GZIP_MAGIC)
    if not gz and len(raw) > limits.max_bytes:
        raise SnapshotError(
            f"{what} is larger than max_bytes={limits.max_bytes} bytes (LoadLimits.max_bytes)"
        )
    stream: BinaryIO = gzip.GzipFile(fileobj=io.BytesIO(raw)) if gz else io.BytesIO(raw)
    reader = _BoundedReader(stream, limits.max_bytes, what)
    try:
        fast = fast_path_bytes(limits)
        prefix = b"" if always_count else reader.read(fast + 1)
        if not always_count and len(prefix) <= fast:
            obj = _Plain(io.BytesIO(prefix)).load()
            check_depth(obj, limits.max_depth, what)
            return obj, {"bytes": len(prefix), "objects": None, "memory_bytes": None, "depth": None}
        unpickler = _Counting(_Chain(prefix, reader), limits, what)  # type: ignore[arg-type]
        obj = unpickler.load()
        check_depth(obj, limits.max_depth, what)
    except SnapshotError:
        raise
    except (OSError, EOFError, zlib.error) as exc:
        if gz and str(exc):  # gzip's errors say why; the unpickler's EOF says nothing
            raise SnapshotError(f"{what} is not a readable gzip file: {exc}") from None
        raise SnapshotError(f"{what} is not a readable pickle: {exc!r}") from None
    except MemoryError:
        raise SnapshotError(f"{what} asks for more memory than is available") from None
    except RecursionError:
        raise SnapshotError(f"{what} nests too deeply to load") from None
    except Exception as exc:  # any malformed pickle (UnpicklingError, KeyError, ...)
        raise SnapshotError(f"{what} is not a readable pickle: {exc!r}") from None
    work: dict[str, int | None] = {
        "bytes": reader.used,
        "objects": limits.max_objects - unpickler.objects_left,
        "memory_bytes": limits.max_memory_bytes - unpickler.memory_left,
        "depth": unpickler.max_depth_seen if isinstance(obj, _CONTAINERS) else 0,
    }
    return obj, work
