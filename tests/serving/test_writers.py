"""Named write credentials: `NAME:TOKEN` items from flags, a file and the environment."""

from __future__ import annotations

import pytest
from memgnn.serving.config import ServeConfig
from memgnn.serving.writers import (
    parse_writers,
    read_tokens_file,
    writer_of,
    writers_from_env,
    writers_to_env,
)


def test_items_files_and_the_environment(tmp_path):
    assert parse_writers(["alice:s3cret", "bob:t:with:colons"]) == {
        "alice": "s3cret",
        "bob": "t:with:colons",
    }
    path = tmp_path / "tokens"
    path.write_text("# writers\nalice:a-token\n\n  bob:b-token  \n")
    assert read_tokens_file(path) == {"alice": "a-token", "bob": "b-token"}
    env = writers_to_env({"alice": "a", "bob": "b"})
    assert writers_from_env(env) == {"alice": "a", "bob": "b"}
    assert writers_from_env("alice:a\nbob:b,") == {"alice": "a", "bob": "b"}
    assert writers_from_env(None) == {}


@pytest.mark.parametrize(
    "items",
    [
        ["no-colon"],
        [":token"],
        ["bad name:tok"],
        ["alice:"],
        ["alice:a", "alice:b"],  # a name twice
        ["alice:same", "bob:same"],  # a shared token could not say who wrote
        ["token:x"],  # reserved: the single --token's writer
        ["anonymous:x"],
    ],
)
def test_malformed_items_are_refused(items):
    with pytest.raises(ValueError):
        parse_writers(items)


def test_errors_do_not_print_the_token(tmp_path):
    with pytest.raises(ValueError) as info:
        parse_writers(["bad name:very-secret"])
    assert "very-secret" not in str(info.value)
    with pytest.raises(ValueError, match="tokens-file"):
        read_tokens_file(tmp_path / "missing")


def test_the_presented_token_names_its_writer(tmp_path):
    writers = {"alice": "a-token", "bob": "b-token"}
    assert writer_of(writers, "b-token") == "bob"
    assert writer_of(writers, "b-toke") is None and writer_of({}, "x") is None
    cfg = ServeConfig(state_dir=tmp_path, token="legacy", writers=writers)
    assert cfg.writer_of("legacy") == "token" and cfg.writer_of("a-token") == "alice"
    assert cfg.has_writers and not ServeConfig(state_dir=tmp_path).has_writers
    with pytest.raises(ValueError):  # the single token may not be a writer's too
        ServeConfig(state_dir=tmp_path, token="a-token", writers=writers)
    # the credentials travel to worker processes beside the config, not inside it
    env = cfg.to_env()
    assert "a-token" not in env["MEMGNN_SERVE_CONFIG"]
    assert ServeConfig.from_env(env) == cfg
