"""Compiled (numba) replay of the CUDA caching allocator; the Python simulator in
:mod:`dataset.allocator` stays the readable reference and the test oracle."""

from memgnn.dataset.replay.api import FastReplayResult, replay_fast
from memgnn.dataset.replay.events import EventArrays, encode_events

__all__ = ["EventArrays", "FastReplayResult", "encode_events", "replay_fast"]
