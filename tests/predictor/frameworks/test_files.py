"""Loading config files safely and the refusals (predictor/frameworks/files.py)."""

from __future__ import annotations

import pickle

import pytest
from memgnn.predictor.errors import UserError
from memgnn.predictor.frameworks import read_config
from memgnn.predictor.frameworks.files import flatten, load_file


def test_a_pickled_training_args_bin_is_refused_unopened(tmp_path):
    path = tmp_path / "training_args.bin"
    path.write_bytes(pickle.dumps({"per_device_train_batch_size": 4}))
    with pytest.raises(UserError, match=r"training_args.bin: a pickled file .*to_json_string\(\)"):
        read_config(path)


def test_a_pickle_under_a_text_name_is_refused_too(tmp_path):
    path = tmp_path / "args.json"
    path.write_bytes(pickle.dumps({"a": 1}, protocol=4))
    with pytest.raises(UserError, match="unpickling runs arbitrary code"):
        load_file(path)


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("bad.yaml", "batch_size: 2\nmodel:\n  - a\n  b: 1\n", r"bad.yaml: not valid YAML: line 4"),
        ("bad.toml", "[training]\nseq_len = \n", r"bad.toml: not valid TOML: line 2"),
        ("bad.json", '{"bf16": true,\n "fp16": }', r"bad.json: not valid JSON: line 2"),
        (
            "dup.yaml",
            "batch_size: 2\ndtype: bf16\nbatch_size: 4\n",
            r"dup.yaml: not valid YAML: line 3.*'batch_size' appears twice \(lines 1 and 3\)",
        ),
    ],
)
def test_malformed_text_names_the_file_and_line(write, name, text, message):
    with pytest.raises(UserError, match=message):
        read_config(write(name, text))


@pytest.mark.parametrize(
    ("text", "what"),
    [("- a\n- b\n", "got a list"), ("3\n", "got a int"), ("", "got empty"), ("# only\n", "empty")],
)
def test_a_top_level_that_is_no_mapping_is_refused(write, text, what):
    with pytest.raises(UserError, match=f"the top level must be a mapping.*{what}"):
        read_config(write("c.yaml", text))


def test_a_missing_file_and_non_text_are_refused(tmp_path):
    with pytest.raises(UserError, match="config file not found"):
        read_config(tmp_path / "nope.yaml")
    path = tmp_path / "c.yaml"
    path.write_bytes(b"a: \xff\xfe\n")
    with pytest.raises(UserError, match="not a UTF-8 text file"):
        read_config(path)


def test_yaml_builds_no_python_objects(write):
    with pytest.raises(UserError, match="not valid YAML"):
        read_config(write("evil.yaml", "a: !!python/object/apply:os.system ['true']\n"))


def test_flatten_keeps_atomic_and_empty_mappings_whole():
    data = {"a": {"b": 1, "c": {"d": 2}}, "e": {}, "f": {"g": 3}}
    assert flatten(data, atomic=("f",)) == {"a.b": 1, "a.c.d": 2, "e": {}, "f": {"g": 3}}
