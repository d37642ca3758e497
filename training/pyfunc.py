"""The mlflow pyfunc wrapper of a memgnn ONNX model (imports mlflow: import it lazily)."""

from __future__ import annotations

from mlflow.pyfunc import PythonModel


class MemgnnPyfunc(PythonModel):
    """mlflow pyfunc over `OnnxMemoryModel`: input {"graph": StepGraph file, "queries":
    [{"sizes": {...}, "device": ..., "metric": ...}, ...]}, output a list of prediction
    dicts."""

    def load_context(self, context) -> None:
        from memgnn.predictor.memory.onnx_model import OnnxMemoryModel

        self.model = OnnxMemoryModel.load(context.artifacts["model_dir"])

    def predict(self, context, model_input, params=None):
        from memgnn.predictor.ir.graph import StepGraph
        from memgnn.predictor.memory.base import Query

        graph = StepGraph.load(model_input["graph"])
        queries = [Query(**q) for q in model_input["queries"]]
        return [p.to_dict() for p in self.model.predict(graph, queries)]
