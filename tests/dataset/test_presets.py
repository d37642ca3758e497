"""Corpus presets: one command, fixed recipe, identical rows on every build."""

from __future__ import annotations

import argparse
import json

import pytest
from memgnn.dataset.corpus import Corpus
from memgnn.dataset.presets import PRESETS, preset_kwargs

from memgnn.cli.dataset import add_build_arguments, build_cmd, configs_from_args


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_build_arguments(parser)
    return parser.parse_args(list(argv))


def _rows(root) -> list[dict]:
    # run-specific: timings, and the graph file's checksum (its meta has capture_seconds)
    rows = Corpus(root).table().drop(["seconds", "graph_sha256"]).to_pylist()
    return sorted(rows, key=lambda r: r["job_id"])


def test_two_builds_of_a_preset_give_identical_rows(tmp_path, capsys):
    for name in ("a", "b"):
        argv = ["--out", str(tmp_path / name), "--preset", "smoke", "--no-progress"]
        assert build_cmd(_args(*argv)) == 0
    out = capsys.readouterr().out
    assert out.count('"preset": "smoke"') == 2
    a, b = _rows(tmp_path / "a"), _rows(tmp_path / "b")
    stages = PRESETS["smoke"]
    assert len(a) == sum(s.size for s in stages)
    assert {r["backend"] for r in a} == {"sim", "cpu"}
    assert all(r["error"] is None and r["peak_allocated_bytes"] > 0 for r in a)
    assert a == b  # labels, breakdowns, stats, graph ids: byte for byte
    assert Corpus(tmp_path / "a").graph_ids() == Corpus(tmp_path / "b").graph_ids()
    # rerunning the preset profiles nothing: resumable, no redone work
    assert build_cmd(_args("--out", str(tmp_path / "a"), "--preset", "smoke", "--no-progress")) == 0
    summary = json.loads(capsys.readouterr().out)
    assert [s["profiled"] for s in summary["stages"]] == [0, 0]


def test_a_preset_fixes_its_recipe(tmp_path, capsys):
    args = _args("--out", str(tmp_path), "--preset", "v1", "--size", "10", "--seed", "3")
    with pytest.raises(ValueError, match="--preset v1 fixes --size, --seed; drop those"):
        configs_from_args(args)
    assert build_cmd(args) == 2 and "fixes --size" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--size is required"):
        configs_from_args(_args("--out", str(tmp_path)))
    with pytest.raises(ValueError, match="unknown --preset 'v9'"):
        preset_kwargs("v9", out=tmp_path)
    with pytest.raises(ValueError, match="fixes seed"):
        preset_kwargs("v1", out=tmp_path, seed=2)


def test_preset_stages_become_build_configs(tmp_path):
    cfgs = configs_from_args(_args("--out", str(tmp_path), "--preset", "v1", "--workers", "2"))
    assert [(c.backend, c.size, c.seed, c.workers) for c in cfgs] == [
        ("sim", 264, 1, 2),
        ("cpu", 60, 1, 2),
    ]
    assert all(c.finetune for c in cfgs) and not PRESETS["readme-3960"][0].finetune
    plain = configs_from_args(_args("--out", str(tmp_path), "--size", "5"))
    assert [(c.backend, c.seed, c.size) for c in plain] == [("sim", 0, 5)]


def test_v2_is_v1_then_a_fine_tuning_stage(tmp_path):
    from memgnn.dataset.build import BuildConfig
    from memgnn.dataset.sampler import sample_jobs

    v1 = preset_kwargs("v1", out=tmp_path)
    v2 = preset_kwargs("v2", out=tmp_path)
    assert v2[:2] == v1  # v1's rows, job for job
    stage = v2[2]
    assert stage["backend"] == "sim" and "adamw8bit" in stage["finetune_kinds"]
    configs = {j.group: j.train for j in sample_jobs(BuildConfig(**stage).sampler())}
    drawn = {(t["peft"], t["quantize_base"] != "none", t["attention"], t["optimizer"])
             for t in configs.values()}  # fmt: skip
    assert {d[0] for d in drawn} == {"none", "lora"}
    assert {d[2] for d in drawn} == {"eager", "sdpa", "flash"}
    assert any(d[1] for d in drawn) and any(d[3] == "adamw8bit" for d in drawn)
    assert sum(t["peft"] == "lora" for t in configs.values()) > len(configs) / 2


def test_the_repository_corpus_is_preset_v2_packed():
    from pathlib import Path

    from memgnn.dataset.pack import preset_job_ids
    from memgnn.predictor.memory.features import FEATURE_SCHEMA_VERSION

    root = Path(__file__).resolve().parents[2] / "dataset" / "data" / "corpus-v2"
    manifest = json.loads((root / "manifest.json").read_text())
    corpus = Corpus(root)
    table = corpus.table()
    assert manifest["preset"] == "v2" and manifest["rows"] == table.num_rows
    assert manifest["feature_schema_version"] == FEATURE_SCHEMA_VERSION
    assert set(table.column("job_id").to_pylist()) == preset_job_ids("v2")
    assert corpus.graph_problems(missing=True) == {}
    assert manifest["bytes"] < 30 * 2**20  # a repository carries no more
