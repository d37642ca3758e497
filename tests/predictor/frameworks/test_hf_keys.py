"""The TrainingArguments / TRL key tables (predictor/frameworks/hf_keys.py)."""

from __future__ import annotations

import dataclasses

import pytest
from memgnn.predictor.frameworks.hf_keys import FEATURES, HF_ONLY, NO_EFFECT, TRL_ONLY


def test_the_tables_do_not_overlap():
    tables = [set(NO_EFFECT), set(FEATURES), set(HF_ONLY)]
    for i, a in enumerate(tables):
        for b in tables[i + 1 :]:
            assert a & b == set()


def test_every_field_of_the_installed_trainingarguments_is_in_a_table():
    transformers = pytest.importorskip("transformers")
    fields = {f.name for f in dataclasses.fields(transformers.TrainingArguments)}
    known = set(NO_EFFECT) | set(FEATURES) | HF_ONLY | TRL_ONLY
    assert sorted(fields - known) == []
