"""The capture cache answers an edited model from a new capture, never from a stale graph."""

from __future__ import annotations

import json
import shutil
import sys
import textwrap
from pathlib import Path

import memgnn.predictor.capture.capture
import pytest
from memgnn.predictor.capture.cache import capture_cached
from memgnn.predictor.capture.capture import CaptureConfig, capture
from memgnn.predictor.memory.analytic import AnalyticModel
from memgnn.predictor.memory.base import Query
from memgnn.predictor.spec.train import TrainSpec
from tiny_models import write_tiny_gpt2_config

TRAIN = TrainSpec.of(steps="first")
SIZES = {"B": 2, "S": 8}

CNN = """
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from memgnn.predictor.spec.bundle import ModelBundle

WIDTH = {width}


def _width():
    extra = Path(__file__).with_name("cnn_width.json")
    return json.loads(extra.read_text())["width"] if extra.exists() else WIDTH


def _inputs(sizes, device, dtype):
    return {{"x": torch.randn(sizes["B"], 3, 16, 16, device=device, dtype=dtype)}}


def _loss(model, inputs):
    return model(inputs["x"]).square().mean()


def factory():
    width = _width()
    build = lambda: nn.Sequential(
        nn.Conv2d(3, width, 3, padding=1), nn.ReLU(), nn.Conv2d(width, width, 3, padding=1)
    )
    return ModelBundle(
        name="py:user_cnn:factory", family="cnn", build=build, make_inputs=_inputs,
        loss=_loss, dims={{"B": 2}},
    )
"""


def _peak(graph, sizes) -> int:
    query = Query(sizes=sizes, device="cpu")
    return AnalyticModel().predict(graph, [query])[0].predicted_peak_bytes


def test_hf_config_edited_in_place_is_captured_anew(tmp_path):
    pytest.importorskip("transformers")
    from memgnn.predictor.zoo import resolve

    path = tmp_path / "model" / "config.json"
    write_tiny_gpt2_config(path, layers=1, vocab=64, positions=32)
    cache = tmp_path / "cache"
    small = capture_cached(resolve(f"hf:{path}"), TRAIN, target="cpu", directory=cache)
    write_tiny_gpt2_config(path, layers=3, vocab=64, positions=32)  # same path, other contents
    bundle = resolve(f"hf:{path}")
    cached = capture_cached(bundle, TRAIN, target="cpu", directory=cache)
    fresh = capture(bundle, TRAIN, CaptureConfig(target="cpu"))
    assert _peak(cached, SIZES) == _peak(fresh, SIZES) > _peak(small, SIZES)


def _write_cnn(folder: Path, width: int) -> None:
    (folder / "user_cnn.py").write_text(textwrap.dedent(CNN.format(width=width)))
    shutil.rmtree(folder / "__pycache__", ignore_errors=True)
    sys.modules.pop("user_cnn", None)


def _resolve_cnn():
    from memgnn.predictor.zoo import resolve

    return resolve("py:user_cnn:factory")


@pytest.fixture
def user_cnn(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    _write_cnn(tmp_path, 4)
    yield tmp_path
    sys.modules.pop("user_cnn", None)


def test_widened_python_model_is_captured_anew(user_cnn):
    cache = user_cnn / "cache"
    narrow = capture_cached(_resolve_cnn(), TRAIN, target="cpu", directory=cache)
    _write_cnn(user_cnn, 16)  # the user widens the CNN in its source
    bundle = _resolve_cnn()
    wide = capture_cached(bundle, TRAIN, target="cpu", directory=cache)
    fresh = capture(bundle, TRAIN, CaptureConfig(target="cpu"))
    assert _peak(wide, {"B": 2}) == _peak(fresh, {"B": 2}) > _peak(narrow, {"B": 2})


def test_model_changed_outside_its_source_is_captured_anew(user_cnn):
    """Same source files, other structure (a width read from a data file)."""
    cache = user_cnn / "cache"
    narrow = capture_cached(_resolve_cnn(), TRAIN, target="cpu", directory=cache)
    (user_cnn / "cnn_width.json").write_text(json.dumps({"width": 16}))
    wide = capture_cached(_resolve_cnn(), TRAIN, target="cpu", directory=cache)
    assert _peak(wide, {"B": 2}) > _peak(narrow, {"B": 2})


def test_unchanged_model_comes_from_the_cache(user_cnn, monkeypatch):
    cache = user_cnn / "cache"
    first = capture_cached(_resolve_cnn(), TRAIN, target="cpu", directory=cache)
    monkeypatch.setattr(memgnn.predictor.capture.capture, "capture", _no_capture)
    again = capture_cached(_resolve_cnn(), TRAIN, target="cpu", directory=cache)
    assert again.graph_id == first.graph_id


def _no_capture(*args, **kwargs):
    raise AssertionError("captured although the cache holds this graph")


def test_cache_can_be_disabled(user_cnn, monkeypatch):
    cache = user_cnn / "cache"
    capture_cached(_resolve_cnn(), TRAIN, target="cpu", directory=cache, use_cache=False)
    assert not (cache / "graphs").exists()
    monkeypatch.setenv("MEMGNN_CACHE", "off")
    capture_cached(_resolve_cnn(), TRAIN, target="cpu")
    assert not Path("off").exists()
    monkeypatch.setenv("MEMGNN_CACHE", str(cache))
    capture_cached(_resolve_cnn(), TRAIN, target="cpu")
    assert len(list((cache / "graphs").iterdir())) == 1


def test_a_zoo_model_is_keyed_without_building_it(monkeypatch):
    """A warm `predict --model gpt2` built the transformers model on fake tensors only to
    key the cache (3-5 s); a zoo bundle now carries its own fingerprint: the zoo's name and
    a digest of the zoo's sources, with its hparams beside them in the key."""
    import memgnn.predictor.capture.cache as cache
    from memgnn.predictor.zoo import make_bundle

    def no_build(*args, **kwargs):
        raise AssertionError("the cache key built the model")

    monkeypatch.setattr(cache, "fake_step", no_build)
    small, wide = make_bundle("gpt2"), make_bundle("gpt2", {"hidden": 128})
    assert json.loads(small.fingerprint)["zoo"] == "gpt2"
    keys = {cache.capture_key(b, TrainSpec(), "cuda", 80, {}) for b in (small, wide)}
    assert len(keys) == 2  # the hparams still tell two configs apart
