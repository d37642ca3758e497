"""A captured graph for a query's sizes, and how long captures say they are running.

`graph_for_query` takes the cached capture of a model's step when its shape guards hold at
the query's sizes, else captures at those sizes (`Progress`: how long it has left);
`unused_sizes` warns of a size no tensor depends on.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from pathlib import Path

from memgnn.predictor.capture.branches import CaptureError
from memgnn.predictor.capture.cache import capture_cached
from memgnn.predictor.capture.progress import Progress
from memgnn.predictor.ir.graph import StepGraph
from memgnn.predictor.memory.base import GuardViolation
from memgnn.predictor.spec.bundle import ModelBundle
from memgnn.predictor.spec.train import TrainSpec

log = logging.getLogger(__name__)

__all__ = ["graph_for_query", "sizes_used", "unused_sizes"]


def graph_for_query(
    bundle: ModelBundle,
    train: TrainSpec,
    sizes: dict[str, int],
    *,
    target: str = "cuda",
    sm: int = 80,
    scenario: str = "worst",
    directory: Path | None = None,
    use_cache: bool = True,
    capture_mode: str = "blocks",
) -> StepGraph:
    """A captured graph whose guards hold at `sizes` (`capture_mode`: CaptureConfig.mode).

    The cached capture (traced at the example sizes) when its guards hold there; else a
    capture traced at `sizes` themselves (logged), cached like any capture under the
    sizes it was traced at (a sliding-window model queried past its window captures once,
    not on every call). `GuardViolation` when even that graph's guards fail at `sizes`:
    the model itself cannot run there (e.g. more positions than its position table)."""
    with Progress(f"capturing {bundle.name} for a {target} target"):
        graph = capture_cached(
            bundle, train, target=target, sm=sm, sizes=sizes, directory=directory,
            use_cache=use_cache, mode=capture_mode,
        )  # fmt: skip
    bad = graph.violated_guards(graph.resolve_sizes(sizes, scenario))
    if not bad:
        return graph
    log.info(
        "%s: the graph traced at %s does not hold at %s (guards %s): capturing at %s",
        bundle.name, graph.symbols, sizes, ", ".join(bad), sizes,
    )  # fmt: skip
    trace = bundle.sizes(sizes)
    try:
        with Progress(f"capturing {bundle.name} at {trace}"):
            graph = capture_cached(
                bundle, train, target=target, sm=sm, directory=directory, use_cache=use_cache,
                mode=capture_mode, traced_at=trace,
            )  # fmt: skip
    except CaptureError as exc:
        raise GuardViolation(f"{bundle.name} cannot run at {sizes}: {exc}", bad, sizes) from exc
    bad = graph.violated_guards(graph.resolve_sizes(sizes, scenario))
    if bad:
        raise GuardViolation(
            f"{bundle.name} cannot run at {sizes}: {', '.join(bad)} fails even when traced "
            "at these sizes (a limit of the model)",
            bad,
            dict(sizes),
        )
    return graph


def unused_sizes(
    graph: StepGraph, names: Sequence[str], used: frozenset[str] | None = None
) -> list[str]:
    """A warning per size in `names` that no byte count of `graph` depends on: the model's
    make_inputs ignored it, so the answer is the same at any value of it. `used`: the
    graph's `sizes_used` (computed here when not given)."""
    used = sizes_used(graph) if used is None else used
    return [
        f"size {name} never reaches the captured step (no tensor's bytes depend on it): "
        f"the answer is the same at any {name}; does make_inputs read sizes[{name!r}]?"
        for name in names
        if name in graph.symbols and name not in used
    ]


def sizes_used(graph: StepGraph) -> frozenset[str]:
    """The names the graph's byte formulas and data-dependent ranges mention."""
    used: set[str] = set()
    texts = [*graph.exprs, *(d[k] for d in graph.data_symbols.values() for k in ("lo", "hi"))]
    for text in texts:
        used.update(_NAME_RE.findall(text))
    return frozenset(used)


_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
