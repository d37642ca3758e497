"""Dependencies point one way: predictor <- dataset <- training <- serving <- memgnn.

The folders install as `memgnn.predictor`, `memgnn.dataset`, ... (pyproject's package-dir);
`memgnn.cli` and the other modules of memgnn/ are the top layer.

The import graph is read from the source with `ast` (no imports executed), counting every
project import, at module level or inside a function, except those under
`if TYPE_CHECKING:`. Two rules:

- a module imports only from its own layer or the layers below it (`predictor` is the base);
- no import cycles between modules, of any length.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("predictor", "dataset", "training", "serving", "memgnn")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    parts = parts[:-1] if parts[-1] == "__init__" else parts
    return ".".join(parts if parts[0] == "memgnn" else ("memgnn", *parts))


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for layer in LAYERS for p in sorted((ROOT / layer).rglob("*.py"))}


def _type_checking_nodes(tree: ast.Module) -> set[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return skip


def _absolute(module: str, path: Path, level: int, target: str | None) -> str:
    """The absolute name of `from <level dots><target> import ...` in `module`."""
    if level == 0:
        return target or ""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for _ in range(level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{target}" if target else package


def import_graph(modules: dict[str, Path] | None = None) -> dict[str, set[str]]:
    """Edges module -> project modules it imports (the longest known module prefix)."""
    modules = _modules() if modules is None else modules
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        skip = _type_checking_nodes(tree)
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(name, path, node.level, node.module)
                targets = [f"{base}.{a.name}" for a in node.names] + [base]
            else:
                continue
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name and not name.startswith(target + "."):
                    graph[name].add(target)
    return graph


def _layer(module: str) -> int:
    parts = module.split(".")
    if parts[0] == "memgnn" and len(parts) > 1 and parts[1] in LAYERS[:-1]:
        parts = parts[1:]
    return LAYERS.index(parts[0])


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_imports_point_down_the_layers():
    graph = import_graph()
    upward = sorted(
        f"{a} -> {b}" for a, targets in graph.items() for b in targets if _layer(b) > _layer(a)
    )
    assert upward == [], "imports that point up the layers " + " < ".join(LAYERS)


def test_predictor_is_the_base_layer():
    graph = import_graph()
    outside = sorted(
        f"{a} -> {b}"
        for a, targets in graph.items()
        if a.startswith("memgnn.predictor")
        for b in targets
        if not b.startswith("memgnn.predictor")
    )
    assert outside == []


def test_imports_use_the_installed_names():
    """`import predictor...` works in the checkout (the current directory is on sys.path)
    but not installed: there only `memgnn` is a top-level package."""
    sources = [
        (path, path.read_text())
        for folder in (*LAYERS, "tests", "benchmarks")
        for path in sorted((ROOT / folder).rglob("*.py"))
    ]
    # the README's and the documentation's examples are code users copy
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        text = doc.read_text()
        sources += [(doc, block) for block in re.findall(r"```python\n(.*?)```", text, re.S)]
    bare = []
    for path, text in sources:
        for node in ast.walk(ast.parse(text, filename=str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            bare += [
                f"{path.relative_to(ROOT)}:{node.lineno} {n}"
                for n in names
                if n.split(".")[0] in LAYERS[:-1]
            ]
    assert bare == []


def test_no_import_cycles():
    assert _cycles(import_graph()) == []


def test_the_checks_can_fail(tmp_path):
    """The graph reader sees a function-local import and the cycle finder sees a 3-cycle."""
    pkg = tmp_path / "predictor"
    pkg.mkdir()
    (pkg / "a.py").write_text("def f():\n    from predictor import b\n")
    (pkg / "b.py").write_text("import predictor.c\n")
    (pkg / "c.py").write_text(
        "from typing import TYPE_CHECKING\nimport predictor.a\nif TYPE_CHECKING:\n"
        "    import predictor.b\n"
    )
    modules = {f"predictor.{n}": pkg / f"{n}.py" for n in "abc"}
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        graph = import_graph(modules)
    finally:
        ROOT = saved
    assert graph == {
        "predictor.a": {"predictor.b"},
        "predictor.b": {"predictor.c"},
        "predictor.c": {"predictor.a"},
    }
    assert _cycles(graph) == [["predictor.a", "predictor.b", "predictor.c"]]
    assert _cycles({"x": {"y"}, "y": set()}) == []


def test_relative_imports_are_read(tmp_path):
    pkg = tmp_path / "predictor" / "sub"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("from . import a\n")
    (pkg / "a.py").write_text("from ..b import thing\nfrom .c import other\n")
    (tmp_path / "predictor" / "b.py").write_text("thing = 1\n")
    (pkg / "c.py").write_text("other = 2\n")
    modules = {
        "memgnn.predictor.sub": pkg / "__init__.py",
        "memgnn.predictor.sub.a": pkg / "a.py",
        "memgnn.predictor.sub.c": pkg / "c.py",
        "memgnn.predictor.b": tmp_path / "predictor" / "b.py",
    }
    graph = import_graph(modules)
    assert graph["memgnn.predictor.sub.a"] == {"memgnn.predictor.b", "memgnn.predictor.sub.c"}
    assert graph["memgnn.predictor.sub"] == {"memgnn.predictor.sub.a"}
