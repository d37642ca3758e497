"""The on-disk cache of captured step graphs, keyed on everything that decides the graph.

`capture_cached` captures a model's training step once and keeps it in
`$MEMGNN_CACHE/graphs` (default `~/.cache/memgnn/graphs`; `MEMGNN_CACHE=off` disables
the cache, as `use_cache=False` / the CLI's `--no-cache` do for one call).

The key (`capture_key`) holds what determines the graph, so an edited model is captured
anew instead of answered from a stale graph:
- the model: the bundle's name, family, hparams, dims and static dims; the bundle's
  `fingerprint` when it has one (an `hf:` config's contents as canonical JSON), else the
  model's structure built on fake tensors (`predictor.capture.model_info.structure`: modules and
  their settings, parameter and buffer names, shapes, dtypes, requires_grad, ties, and a
  transformers config) and the source files of its module classes and of the bundle's
  callables (build, make_inputs, loss, blocks), torch's own excepted;
- how it trains and where: the `TrainSpec`, target, compute capability, static sizes;
- how it is captured: the capture mode (blocks: repeated blocks replicated; full);
- the software: torch, transformers and memgnn versions and `CAPTURE_VERSION`.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import inspect
import json
import logging
import os
from pathlib import Path
from typing import Any

import torch
from memgnn.predictor.capture.model_info import fake_step, module_classes, structure
from memgnn.predictor.ir.graph import StepGraph
from memgnn.predictor.spec.bundle import ModelBundle
from memgnn.predictor.spec.train import TrainSpec

__all__ = ["CAPTURE_VERSION", "cache_dir", "cache_enabled", "capture_cached", "capture_key"]

log = logging.getLogger(__name__)

# bumped whenever capture records a step differently, so cached graphs are captured anew
CAPTURE_VERSION = 17  # 3: model_info in meta; key on model structure and sources
# 4: position-table bounds recorded as guards (predictor.capture.bounds)
# 5: HF models without a KV cache: no packed-sequence mask (predictor.emulate.attention)
# 6: DTensor's shape propagation is not recorded (predictor.ir.recorder.unrecorded)
# 7: repeated blocks captured once and replicated (predictor.capture.replicate); the mode is keyed
# 8: checkpointing turns a transformers model's KV cache off (predictor.capture.step._no_kv_cache)
# 9: ... in every submodule's config (T5's decoder keeps its own copy); held outputs
# 10: CUDA targets record CUDA's kernels (predictor.emulate.cuda_kernels): dropout's bool mask,
#     fp32 layer-norm statistics, grouped-query flash / math attention, backward scratch
# 11: graph format 2 (storage places: offloading); host state probed per optimizer class
# 12: each node's file:line in the user's code in meta["sources"] (predictor.ir.sources)
# 13: a compiled region's random ops (the RNG-state wrapper) read recorded buffers
# 14: hybrid models (Bamba, Jamba, RecurrentGemma, ...) not captured as repeated blocks;
#     symbolic pads and triangular solves (linear-attention reference kernels)
# 15: every pad of a symbolic-size input made by the hook (negative pads narrowed: RWKV's
#     time shift; a constant pad no longer pins B and S to their hints: Mamba2's chunk scan)
# 16: a compiled region runs inductor's own partition function and generated wrapper
#     (predictor.emulate.inductor); a checkpointed one is traced under SAC's dispatch mode
# 17: a compiled region's inputs in first-use order, its parameters static by position (as
#     dynamo and AOTAutograd hand them to the partitioner); FSDP's float8 all-gather
_OFF = ("off", "none", "0", "false", "no")


def cache_dir() -> Path:
    """Where captured graphs are kept: $MEMGNN_CACHE, else ~/.cache/memgnn."""
    return Path(os.environ.get("MEMGNN_CACHE") or Path.home() / ".cache" / "memgnn")


def cache_enabled() -> bool:
    """False when MEMGNN_CACHE says off (off, none, 0, false, no)."""
    return os.environ.get("MEMGNN_CACHE", "").strip().lower() not in _OFF


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.cache
def _torch_root() -> Path:
    return Path(torch.__file__).resolve().parent


def _file_digest(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def _source_file(obj: Any) -> str | None:
    """The file defining a callable or class (partials and methods unwrapped)."""
    while isinstance(obj, functools.partial):
        obj = obj.func
    obj = getattr(obj, "__func__", obj)
    obj = inspect.unwrap(obj) if callable(obj) else obj
    if not (inspect.isfunction(obj) or inspect.isclass(obj)):
        obj = type(obj)
    try:
        path = inspect.getsourcefile(obj)
    except TypeError:  # builtins
        return None
    if path is None or not Path(path).is_file():
        return None
    if Path(path).resolve().is_relative_to(_torch_root()):
        return None  # torch's own code: its version is in the key
    return path


def _sources(objects: list[Any]) -> dict[str, str]:
    files = {f for f in map(_source_file, objects) if f is not None}
    return {f: _file_digest(f) for f in sorted(files)}


def model_fingerprint(bundle: ModelBundle, train: TrainSpec, target: str) -> dict[str, Any]:
    """What decides the model's part of the graph (see the module docstring)."""
    callables = [bundle.build, bundle.make_inputs, bundle.loss, bundle.blocks]
    out: dict[str, Any] = {
        "callables": _sources([c for c in callables if c is not None]),
    }
    if bundle.fingerprint:
        out["fingerprint"] = bundle.fingerprint
        return out
    model = fake_step(bundle, train, target).model
    out["structure"] = structure(model)
    out["classes"] = _sources(module_classes(model))
    return out


def capture_key(
    bundle: ModelBundle,
    train: TrainSpec,
    target: str,
    sm: int,
    static: dict[str, int],
    mode: str = "blocks",
    traced_at: dict[str, int] | None = None,
) -> str:
    """The cache key (see the module docstring); `traced_at`: every dim's trace size of a
    capture at a query's own sizes (`capture_cached(traced_at=...)`), absent otherwise
    so that the keys of captures at the example sizes stay as they were."""
    extra = {} if traced_at is None else {"traced_at": dict(sorted(traced_at.items()))}
    blob = json.dumps(
        {
            **extra,
            "capture": CAPTURE_VERSION,
            "capture_mode": mode,
            "versions": {
                "torch": torch.__version__,
                "transformers": _version("transformers"),
                "memgnn": _version("memgnn"),
            },
            "model": bundle.name,
            "family": bundle.family,
            "hparams": bundle.hparams,
            "dims": bundle.dims,
            "static_dims": list(bundle.static_dims),
            "model_fingerprint": model_fingerprint(bundle, train, target),
            "train": train.flat(),
            "target": target,
            "sm": sm,
            "static": static,
        },
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def capture_cached(
    bundle: ModelBundle,
    train: TrainSpec,
    *,
    target: str = "cuda",
    sm: int = 80,
    sizes: dict[str, int] | None = None,
    directory: Path | None = None,
    use_cache: bool = True,
    mode: str = "blocks",
    traced_at: dict[str, int] | None = None,
) -> StepGraph:
    """A symbolic capture of the step, from the on-disk cache when it was made before.

    Dims the bundle declares static are captured at `sizes` (default: the example dims),
    so each such size has its own cached graph. `traced_at`: trace every dim at these
    sizes instead (a recapture where the example sizes' graph breaks a guard at the
    query's sizes, e.g. a sliding window: `capture.query.graph_for_query`), cached under
    them. `use_cache=False` (or MEMGNN_CACHE=off without a `directory`) captures anew and
    stores nothing. `mode`: `CaptureConfig.mode`."""
    from memgnn.predictor.capture.capture import CaptureConfig, capture

    wanted = sizes or {}
    if traced_at is not None:
        trace = bundle.sizes(traced_at)
    else:
        trace = bundle.sizes({d: wanted[d] for d in bundle.static_dims if d in wanted})
    static = {d: trace[d] for d in bundle.static_dims}
    config = CaptureConfig(target=target, sm=sm, sizes=trace, mode=mode)
    if not use_cache or (directory is None and not cache_enabled()):
        return capture(bundle, train, config)
    folder = (directory or cache_dir()) / "graphs"
    key = capture_key(bundle, train, target, sm, static, mode,
                      traced_at=trace if traced_at is not None else None)  # fmt: skip
    path = folder / f"{key}.json.gz"
    if path.is_file():
        try:
            graph = StepGraph.load(path)
            log.info("graph of %s from the cache: %s", bundle.name, path)
            return graph
        except ValueError as exc:  # corrupt or old: capture again
            log.warning("ignoring cached graph %s: %s", path, exc)
    graph = capture(bundle, train, config)
    folder.mkdir(parents=True, exist_ok=True)
    graph.save(path)
    return graph
