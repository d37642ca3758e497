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
from pathlib import Path
from typing import Any

from memgnn.predictor.memory.analytic import AnalyticModel
from memgnn.predictor.memory.base import MemoryModel
from memgnn.predictor.memory.encoded_analytic import EncodedAnalytic
from memgnn.predictor.memory.onnx_model import load_default_model

log = logging.getLogger(__name__)

MLFLOW_SCHEMES = ("models:/", "runs:/", "mlflow-artifacts:/")


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
