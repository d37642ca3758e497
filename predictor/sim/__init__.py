"""The CUDA caching allocator simulator, and its compiled (numba) replay."""
