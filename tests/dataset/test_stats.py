"""`memgnn dataset stats`: counts, config axes, label ranges and failures of a corpus."""

from __future__ import annotations

import argparse
import json

import pytest
from memgnn.dataset.corpus import Corpus, CorpusWriter, record_row
from memgnn.dataset.executors import error_row
from memgnn.dataset.record import ProfileRecord
from memgnn.dataset.sampler import Job
from memgnn.dataset.stats import corpus_stats, failure_reason, render_stats

from memgnn.cli.dataset import add_stats_arguments, stats_cmd

MiB = 1 << 20
LORA = {"grad_accum": 4, "peft": "lora", "lora_r": 16, "quantize_base": "nf4", "attention": "flash"}


def _record(family: str, allocated: int, **train) -> ProfileRecord:
    spec = {"precision": "fp32", "optimizer": "adamw", "optimizer_impl": "auto"}
    spec |= {"checkpointing": "none", "grad_accum": 1} | train
    return ProfileRecord(
        backend="sim",
        device="h100-80gb",
        torch_version="2.13.0",
        model=family,
        family=family,
        sizes={"B": 4},
        train=spec,
        peak_allocated_bytes=allocated,
        peak_reserved_bytes=allocated + MiB,
        device_total_bytes=allocated + 300 * MiB,
        stats={"would_oom": allocated > 500 * MiB},
        seconds=1.5,
    )


def _job(n: int, family: str = "mlp") -> Job:
    return Job(
        job_id=f"job-{n}",
        group="g",
        family=family,
        model=family,
        hparams={"layers": 2},
        sizes={"B": n},
        train={"precision": "bf16", "optimizer": "sgd", "checkpointing": "full", "grad_accum": 2},
        backend="sim",
        device="v100-16gb",
    )


@pytest.fixture
def corpus(tmp_path) -> Corpus:
    writer = CorpusWriter(tmp_path)
    writer.write_rows(
        [
            record_row("a", _record("mlp", 10 * MiB), "g1"),
            record_row("b", _record("mlp", 30 * MiB, precision="bf16"), "g1"),
            record_row("c", _record("gpt2", 20 * MiB, checkpointing="blocks:2"), "g2"),
            record_row("d", _record("gpt2", 600 * MiB, **LORA), None),
        ]
    )
    writer.write_rows(
        [
            error_row(_job(1), "skipped: bf16 needs bfloat16, which v100-16gb (sm 70) lacks"),
            error_row(_job(2), "skipped: bf16 needs bfloat16, which v100-16gb (sm 70) lacks"),
            error_row(_job(3, "moe"), RuntimeError("shape (3, 64) is bad in 'blocks.3.attn'")),
        ]
    )
    return Corpus(tmp_path)


def test_corpus_stats(corpus):
    s = corpus_stats(corpus)
    assert (s["records"], s["ok"], s["errors"], s["skipped"]) == (7, 4, 1, 2)
    assert s["families"] == ["gpt2", "mlp", "moe"]
    assert s["per_family"]["mlp"] == {"records": 4, "ok": 2, "errors": 0, "skipped": 2}
    assert s["per_family"]["moe"] == {"records": 1, "ok": 0, "errors": 1, "skipped": 0}
    assert s["configs"]["precision"] == {"bf16": 4, "fp32": 3}
    assert s["configs"]["checkpointing"] == {"blocks:N": 1, "full": 3, "none": 3}
    assert s["configs"]["grad_accum"] == {"1": 3, "2": 3, "4": 1}
    assert s["configs"]["device"] == {"h100-80gb": 4, "v100-16gb": 3}
    assert s["configs"]["peft"] == {"none": 6, "lora r=16": 1}
    assert s["configs"]["quantize_base"] == {"none": 6, "nf4": 1}
    assert s["configs"]["attention"] == {"default": 6, "flash": 1}
    alloc = s["labels"]["peak_allocated_bytes"]
    assert (alloc["count"], alloc["min"], alloc["max"]) == (4, 10 * MiB, 600 * MiB)
    assert alloc["median"] == 25 * MiB
    assert s["would_oom"] == 1
    assert s["graphs"]["referenced"] == 2 and s["graphs"]["ok_records_without_graph"] == 1
    assert s["graphs"]["missing"] == 2  # the fixture names graphs it does not store
    top, other = s["failures"]
    assert top["count"] == 2 and top["skipped"] and top["families"] == {"mlp": 2}
    assert "v100-16gb (sm N)" in top["reason"]
    assert other["reason"] == "RuntimeError: shape (N, N) is bad in '…'"
    json.dumps(s)  # JSON-ready


def test_render_stats(corpus):
    text = render_stats(corpus_stats(corpus))
    for needle in ("records 7: ok 4, errors 1, skipped 2", "gpt2", "600.0 MiB", "failures"):
        assert needle in text


def test_failure_reason_blanks_run_details():
    a = failure_reason("CaptureError: 'moe' has more than 16 paths in 'blocks.11.ffn'\ntrace")
    b = failure_reason("CaptureError: 'moe' has more than 16 paths in 'blocks.3.ffn'")
    assert a == b == "CaptureError: 'moe' has more than N paths in '…'"
    assert failure_reason("") == "unknown error"


def test_stats_cmd(corpus, tmp_path, capsys):
    parser = argparse.ArgumentParser()
    add_stats_arguments(parser)
    assert stats_cmd(parser.parse_args([str(corpus.root), "--json"])) == 0
    assert json.loads(capsys.readouterr().out)["records"] == 7
    assert stats_cmd(parser.parse_args([str(corpus.root)])) == 0
    assert "families" in capsys.readouterr().out
    assert stats_cmd(parser.parse_args([str(tmp_path / "missing")])) == 2
    assert "not a memgnn corpus" in capsys.readouterr().err


def test_demo_corpus_is_readable():
    """The fixed corpus in dataset/data (rebuild it when a format version changes)."""
    from pathlib import Path

    demo = Corpus(Path(__file__).resolve().parents[2] / "dataset" / "data" / "demo-corpus")
    s = corpus_stats(demo)
    assert len(s["families"]) == 14 and s["ok"] >= 50
    assert set(s["configs"]["backend"]) == {"sim", "cpu"}
    assert s["graphs"]["missing"] == 0 and s["graphs"]["referenced"] >= 20
    for gid in demo.graph_ids()[:3]:
        demo.graph(gid)  # loads and validates


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_stats_arguments(parser)
    return parser.parse_args(list(argv))


def test_stats_on_a_corrupt_part_changes_nothing_says_so_and_fails(corpus, capsys):
    bad = sorted((corpus.root / "parts").iterdir())[-1]
    bad.write_bytes(bad.read_bytes()[:50])
    files = sorted(p.name for p in (corpus.root / "parts").iterdir())
    assert stats_cmd(_args(str(corpus.root), "--json")) == 1
    out = capsys.readouterr()
    stats = json.loads(out.out)
    assert list(stats["integrity"]["corrupt_parts"]) == [bad.name]
    assert "corrupt corpus" in out.err and bad.name in out.err and "--allow-corrupt" in out.err
    assert sorted(p.name for p in (corpus.root / "parts").iterdir()) == files  # not renamed
    assert stats_cmd(_args(str(corpus.root), "--allow-corrupt")) == 0
    out = capsys.readouterr()
    assert "CORRUPT" in out.out and "warning: corrupt corpus" in out.err


def test_stats_into_a_closed_pipe_ends_quietly(corpus):
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = os.environ | {"PYTHONPATH": str(root)}
    cmd = [sys.executable, "-m", "memgnn.cli", "dataset", "stats", str(corpus.root), "--json"]
    proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader is gone before the first write (`| head` that exited)
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141, err
    assert "Traceback" not in err and "BrokenPipe" not in err, err
