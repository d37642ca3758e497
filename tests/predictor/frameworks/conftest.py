"""Fixtures shared by the config readers' tests."""

from __future__ import annotations

import json

import pytest
from memgnn.predictor.frameworks import ConfigReading, merge_options, spec_options
from memgnn.predictor.spec.train import TrainSpec


@pytest.fixture(scope="session")
def catalog() -> dict[str, dict]:
    """memgnn's bundled catalog as a reader takes it: Hub name -> config.json contents."""
    from memgnn.predictor.zoo.hub import catalog_entries

    return {e.name: json.loads(e.path.read_text()) for e in catalog_entries()}


def _became(reading: ConfigReading) -> dict[str, str]:
    return {k.key: k.became for k in reading.keys if not k.default}


def _accounted(reading: ConfigReading, keys: list[str]) -> None:
    read = [k.key for k in reading.keys if not k.default]
    assert len(read) == len(set(read)), f"a key read twice: {read}"
    missing = [k for k in keys if k not in read and not any(k in w for w in reading.warnings)]
    assert missing == [], f"keys neither read nor warned: {missing}"


def _valid_spec(reading: ConfigReading, **explicit) -> TrainSpec:
    options, _ = merge_options(reading, explicit)
    kept, _ = spec_options(options)
    return TrainSpec.of(**kept)


@pytest.fixture
def became():
    """became(reading) -> {the file's key: what it became} (defaults left out)."""
    return _became


@pytest.fixture
def accounted():
    """accounted(reading, keys): every key is read or warned about, none read twice."""
    return _accounted


@pytest.fixture
def valid_spec():
    """valid_spec(reading, **explicit flags) -> the TrainSpec its options build."""
    return _valid_spec


@pytest.fixture
def write(tmp_path):
    """write(name, text) -> the path of a file with that text in a fresh folder."""

    def _write(name: str, text: str):
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path

    return _write
