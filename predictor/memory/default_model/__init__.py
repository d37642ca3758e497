"""The shipped learned memory model (encoder.onnx, head.onnx, model_card.json).

A package only so wheels carry the files (package-data *.onnx, *.json). Retrain with
`memgnn ship`; load with `predictor.memory.onnx_model.load_default_model()`.
"""
