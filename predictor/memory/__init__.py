"""Memory models: the analytic sweep, the learned GNN served by onnxruntime, features."""
