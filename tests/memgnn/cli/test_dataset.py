"""`memgnn dataset build|stats|pack` as the command line runs them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from memgnn.dataset.pack import pack_corpus

from memgnn.cli import main

DEMO = Path(__file__).resolve().parents[3] / "dataset" / "data" / "demo-corpus"


def test_pack_refuses_an_existing_folder_and_an_unfinished_preset(tmp_path, capsys):
    (tmp_path / "x").mkdir()
    with pytest.raises(ValueError, match="exists; pack into a new folder"):
        pack_corpus(DEMO, tmp_path / "x")
    assert main(["dataset", "pack", str(DEMO), str(tmp_path / "y"), "--preset", "smoke"]) == 2
    assert "lacks 6 of preset smoke's jobs" in capsys.readouterr().err
    assert not (tmp_path / "y").exists()


def test_stats_of_the_demo_corpus_as_json(capsys):
    assert main(["dataset", "stats", str(DEMO), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["records"] == 84 and stats["ok"] + stats["errors"] + stats["skipped"] == 84


def test_build_needs_a_size_or_a_preset(tmp_path, capsys):
    assert main(["dataset", "build", "--out", str(tmp_path / "c")]) == 2
    assert "--size is required (or --preset NAME)" in capsys.readouterr().err
