"""Compiled (numba) replay of the CUDA caching allocator; the Python simulator in
:mod:`predictor.sim.allocator` stays the readable reference and the test oracle."""

from memgnn.predictor.sim.replay.api import FastReplayResult, replay_fast
from memgnn.predictor.sim.replay.events import EventArrays, encode_events

__all__ = ["EventArrays", "FastReplayResult", "encode_events", "replay_fast"]
