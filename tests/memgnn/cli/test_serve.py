"""`memgnn serve`'s options into a validated ServeConfig."""

from __future__ import annotations

import argparse

import pytest

from memgnn.cli.serve import add_serve_arguments, config_from_args


def test_serve_arguments(tmp_path, monkeypatch):
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    args = parser.parse_args(
        [
            "--port",
            "9001",
            "--db",
            "sqlite:///x.db",
            "--token",
            "t",
            "--workers",
            "2",
            "--max-nodes",
            "10",
        ]
    )
    cfg = config_from_args(args)
    assert (args.host, args.port, args.workers) == ("127.0.0.1", 9001, 2)
    assert cfg.db_url == "sqlite:///x.db" and cfg.token == "t" and cfg.max_nodes == 10
    monkeypatch.setenv("MEMGNN_TOKEN", "from-env")
    cfg = config_from_args(parser.parse_args(["--state-dir", str(tmp_path)]))
    assert cfg.token == "from-env" and cfg.db_url == f"sqlite:///{tmp_path / 'samples.db'}"
    monkeypatch.delenv("MEMGNN_TOKEN")
    cfg = config_from_args(parser.parse_args([]))
    assert cfg.token is None and not cfg.allow_anonymous_writes  # writes refused by default
    cfg = config_from_args(
        parser.parse_args(["--allow-anonymous-writes", "--capture-timeout", "9"])
    )
    assert cfg.allow_anonymous_writes and cfg.capture_timeout_s == 9.0


def test_several_named_writers(tmp_path, monkeypatch):
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    tokens = tmp_path / "tokens"
    tokens.write_text("# the CI fleet\nci:tok-ci\n")
    monkeypatch.setenv("MEMGNN_TOKENS", "ops:tok-ops")
    args = ["--writer", "alice:tok-a", "--writer", "bob:tok-b", "--tokens-file", str(tokens)]
    cfg = config_from_args(parser.parse_args([*args, "--writer-max-scale", "1.5"]))
    assert cfg.writers == {"ops": "tok-ops", "ci": "tok-ci", "alice": "tok-a", "bob": "tok-b"}
    assert cfg.correction_writer_max_scale == 1.5 and cfg.token is None and cfg.has_writers
    for bad in (
        ["--writer", "ci:other"],  # a name twice (the file has it)
        ["--writer", "eve:tok-a"],  # a token twice
        ["--writer", "token:x"],  # the single --token's name
        ["--writer-max-scale", "9"],  # above correction_max_scale
    ):
        with pytest.raises(ValueError):
            config_from_args(parser.parse_args([*args, *bad]))
