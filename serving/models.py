"""Which `MemoryModel` the server answers with: the shipped default, the analytic baseline,
an exported model directory, or an mlflow registry/run URI.

The server codes against the `EncodingModel` protocol (`predictor.memory.base`): a model that
encodes a graph once and answers batches from the encoding. A plain `MemoryModel` is
served through `Unencoded` (nothing cached per graph, calls serialised). The plain
analytic baseline is swapped for `EncodedAnalytic`, which gives the same answers with the
per-graph work cached.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from memgnn.predictor.ir.graph import StepGraph
from memgnn.predictor.memory.analytic import AnalyticModel
from memgnn.predictor.memory.base import EncodingModel, MemoryModel, Prediction, Query
from memgnn.predictor.memory.encoded_analytic import EncodedAnalytic
from memgnn.predictor.memory.onnx_model import load_default_model

log = logging.getLogger(__name__)

MLFLOW_SCHEMES = ("models:/", "runs:/", "mlflow-artifacts:/")


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
    has one, from the learned models' feature vocabulary (`predictor.memory.features.op_id`) for
    `OnnxMemoryModel`; None (the caller checks the torch op registry) otherwise."""
    if isinstance(model, Unencoded):
        model = model.model
    vocab = getattr(model, "op_vocab", None)
    if vocab is not None:
        known = {str(op) for op in vocab}
        return lambda op: op not in known
    try:
        from memgnn.predictor.memory.onnx_model import OnnxMemoryModel
    except ImportError:
        return None
    if isinstance(model, OnnxMemoryModel):
        from memgnn.predictor.memory.features import op_id

        return lambda op: op_id(op)[1]
    return None


def _load_dir(path: Path) -> MemoryModel:
    try:
        from memgnn.predictor.memory.onnx_model import OnnxMemoryModel
    except ImportError as exc:
        raise ValueError(
            f"cannot load a model from {path}: this install has no learned-model loader "
            f"(predictor.memory.onnx_model: {exc})"
        ) from None
    return OnnxMemoryModel.load(path)


def _download_mlflow(uri: str) -> Path:
    try:
        import mlflow
    except ImportError:
        raise ValueError(f"model {uri!r} needs mlflow, which is not installed") from None
    dst = Path(tempfile.mkdtemp(prefix="memgnn-model-"))
    try:
        local = mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=str(dst))
    except Exception as exc:  # mlflow raises its own exception types
        raise ValueError(f"cannot fetch model {uri!r} from mlflow: {exc}") from None
    return Path(local)


def load_model(spec: str | None) -> MemoryModel:
    """The model for a `ServeConfig.model` value; ValueError naming what went wrong."""
    if spec in (None, "", "default"):
        model: Any = load_default_model()
    elif spec == "analytic":
        model = AnalyticModel()
    elif spec.startswith(MLFLOW_SCHEMES):
        model = _load_dir(_download_mlflow(spec))
    else:
        try:
            path = Path(spec).expanduser()
            found = path.exists()
        except (OSError, RuntimeError) as exc:  # name too long, bad ~user
            raise ValueError(f"bad model path {spec[:200]!r}: {exc}") from None
        if not found:
            raise ValueError(f"model path {spec[:200]!r} does not exist")
        try:
            model = _load_dir(path)
        except OSError as exc:
            raise ValueError(f"cannot load the model in {path}: {exc}") from None
    if type(model) is AnalyticModel:
        model = EncodedAnalytic()
    version = getattr(model, "version", None)
    if not isinstance(version, str) or not callable(getattr(model, "predict", None)):
        raise ValueError(f"{type(model).__name__} is not a MemoryModel (version, predict)")
    log.info("model %s loaded (%s)", version, type(model).__name__)
    return model
