"""memgnn's base layer: capture a training step, answer what its peak memory is.

Sub-packages, bottom to top (each imports only those above it in this list):

- `ir`: the graph representation: size expressions, the recorder, `StepGraph`.
- `spec`: what to predict: the training spec (`TrainSpec`), the model (`ModelBundle`),
  device profiles, memory limits.
- `emulate`: libraries and kernels as they allocate on the target (peft LoRA, bitsandbytes,
  attention kernels, FSDP/DDP/ZeRO), run under capture on fake tensors.
- `capture`: one training step as real code runs it, recorded as a `StepGraph`.
- `zoo`: models by name (the zoo families, the Hub catalog, `hf:`, `py:`).
- `memory`: the memory models: the analytic sweep, the learned GNN (ONNX), their features.
- `sim`: the CUDA caching allocator simulator and its compiled replay.
- `snapshot`: real `torch.cuda.memory._dump_snapshot` files: load, replay, export, plot.
- `answer`: the answers every front end gives (the exact replay, routing between methods).
- `plan`: the best training configuration under a memory limit.
"""
