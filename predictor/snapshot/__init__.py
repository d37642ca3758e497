"""Real CUDA allocator snapshots: safe loading, initial state, replay, plots, export."""
