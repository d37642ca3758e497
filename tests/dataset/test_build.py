"""Corpus builds: sim and cpu backends, resume, kill -9 and corrupt parts, ray == local."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from memgnn.dataset.build import BuildConfig, build_corpus
from memgnn.dataset.corpus import Corpus
from memgnn.dataset.sampler import sample_jobs

from memgnn.cli.dataset import add_build_arguments, build_cmd, config_from_args

ROOT = Path(__file__).resolve().parents[2]
TINY = {
    "mlp": {"features": 128, "hidden": 256, "layers": 2, "classes": 10},
    "resnet": {"stages": 2, "blocks": 1, "width": 16, "image": 32, "classes": 10},
    "lstm": {"vocab": 512, "hidden": 128, "layers": 1},
    "gpt2": {"layers": 2, "hidden": 96, "heads": 2, "vocab": 512},
}
CAPS = {"max_tokens": 256, "max_batch": 8, "max_image": 32, "max_static_seq": 16}


def tiny(out: Path, families: list[str], size: int, **kw) -> BuildConfig:
    args = dict(out=out, size=size, families=families, sizes_per_config=3, chunk_size=4)
    args |= dict(caps=CAPS, hparams={f: TINY[f] for f in families}, progress=False)
    return BuildConfig(**args | kw)


def expected_ids(cfg: BuildConfig) -> set[str]:
    return {j.job_id for j in sample_jobs(cfg.sampler())}


def raw_job_ids(root: Path) -> list[str]:
    """Job ids of every readable part, duplicates kept (the reader would hide them)."""
    ids = []
    for part in sorted((root / "parts").glob("part-*.parquet")):
        ids += pq.read_table(part, columns=["job_id"]).column("job_id").to_pylist()
    return ids


def comparable(root: Path) -> list[dict]:
    # run-specific: timings, and the graph file's checksum (its meta has capture_seconds)
    rows = Corpus(root).table().drop(["seconds", "graph_sha256"]).to_pylist()
    return sorted(rows, key=lambda r: r["job_id"])


@pytest.fixture(scope="module")
def sim_corpus(tmp_path_factory):
    cfg = tiny(tmp_path_factory.mktemp("sim"), ["mlp", "resnet", "lstm", "gpt2"], 10)
    return cfg, build_corpus(cfg)


def test_sim_build(sim_corpus):
    cfg, summary = sim_corpus
    assert summary.jobs == summary.profiled == 10 and summary.already_done == 0
    assert summary.ok + summary.errors + summary.skipped == 10
    corpus = Corpus(cfg.out)
    rows = corpus.records(ok_only=False)
    assert {r["job_id"] for r in rows} == expected_ids(cfg)
    assert {r["family"] for r in rows} == {"mlp", "resnet", "rnn", "gpt2"}
    ok = [r for r in rows if not r["error"]]
    assert len(ok) >= 8, [r["error"] for r in rows if r["error"]]
    for row in ok:
        assert row["backend"] == "sim" and row["peak_reserved_bytes"] >= row["peak_allocated_bytes"]
        graph = corpus.graph(row["graph_id"])  # stored, and it is this config's capture
        assert graph.model["name"] == row["model"] and graph.train == row["train"]
    assert not (cfg.out / "capture-cache").exists()  # removed once every job is done
    skipped = [r for r in rows if r["error"] and r["error"].startswith("skipped:")]
    assert all("bfloat16" in r["error"] for r in skipped)


def test_resume_profiles_nothing_new(sim_corpus):
    cfg, _ = sim_corpus
    parts = sorted((cfg.out / "parts").iterdir())
    again = build_corpus(cfg)
    assert again.already_done == 10 and again.profiled == 0 and again.parts_written == 0
    assert sorted((cfg.out / "parts").iterdir()) == parts


def test_growing_the_size_only_adds_jobs(sim_corpus, tmp_path):
    cfg, _ = sim_corpus
    small = tiny(tmp_path, ["mlp"], 2)
    build_corpus(small)
    bigger = build_corpus(tiny(tmp_path, ["mlp"], 4))
    assert bigger.already_done == 2 and bigger.profiled == 2
    assert len(raw_job_ids(tmp_path)) == 4


def test_cpu_build(tmp_path):
    cfg = tiny(tmp_path, ["mlp", "resnet"], 4, backend="cpu", sizes_per_config=2)
    summary = build_corpus(cfg)
    assert summary.profiled == 4 and summary.errors == 0
    rows = Corpus(tmp_path).records(ok_only=False)
    assert {r["job_id"] for r in rows} == expected_ids(cfg)
    skipped = [r for r in rows if r["error"]]
    assert len(skipped) == summary.skipped
    assert all(r["error"].startswith("skipped: ") for r in skipped)  # e.g. fp16 conv on CPU
    rows = [r for r in rows if not r["error"]]
    assert rows
    for row in rows:
        assert row["backend"] == "cpu" and row["device"] == "cpu"
        assert row["peak_allocated_bytes"] > 0 and row["peak_reserved_bytes"] is None
        assert row["graph_id"] in Corpus(tmp_path).graph_ids()


def test_a_failing_job_becomes_an_error_row(tmp_path, monkeypatch):
    import memgnn.dataset.profile

    real = memgnn.dataset.profile.profile

    def flaky(bundle, train, sizes, config, *, graph=None):
        if sizes["B"] == min(j.sizes["B"] for j in jobs):
            raise RuntimeError("boom")
        return real(bundle, train, sizes, config, graph=graph)

    cfg = tiny(tmp_path, ["mlp"], 3, devices=["h100-80gb"])
    jobs = sample_jobs(cfg.sampler())
    monkeypatch.setattr(memgnn.dataset.profile, "profile", flaky)
    summary = build_corpus(cfg)
    assert summary.profiled == 3 and summary.errors == 1 and summary.ok == 2
    (bad,) = [r for r in Corpus(tmp_path).records(ok_only=False) if r["error"]]
    assert bad["error"] == "RuntimeError: boom" and bad["model"] == "mlp"
    assert bad["hparams"]["hidden"] == 256  # the failed job's config is kept


def _cli_args(out: Path) -> list[str]:
    args = ["--out", str(out), "--size", "16", "--families", "mlp,resnet", "--seed", "7"]
    args += ["--chunk-size", "2", "--sizes-per-config", "4", "--no-progress"]
    args += ["--max-batch", "8", "--max-image", "32", "--devices", "h100-80gb"]
    for name in ("mlp", "resnet"):
        args += [f"--hparam={name}.{k}={v}" for k, v in TINY[name].items()]
    return args


def test_kill_9_mid_build_then_resume_then_corrupt_part(tmp_path):
    out = tmp_path / "corpus"
    parser = argparse.ArgumentParser()
    add_build_arguments(parser)
    cfg = config_from_args(parser.parse_args(_cli_args(out)))
    expected = expected_ids(cfg)
    assert len(expected) == 16
    cmd = [sys.executable, "-m", "memgnn.cli", "dataset", "build", *_cli_args(out)]
    proc = subprocess.Popen(
        cmd, cwd=ROOT, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 180
        while not list((out / "parts").glob("part-*.parquet")):
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "no part file within 180 s"
            time.sleep(0.02)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL
    before = raw_job_ids(out)
    assert 2 <= len(before) < 16 and set(before) <= expected

    summary = build_corpus(cfg)  # the restart
    after = raw_job_ids(out)
    assert summary.already_done == len(before) and summary.profiled == 16 - len(before)
    assert len(after) == len(set(after)) == 16 and set(after) == expected
    assert not list(out.rglob("*.tmp"))

    victim = sorted((out / "parts").glob("part-*.parquet"))[0]
    lost = pq.read_table(victim, columns=["job_id"]).column("job_id").to_pylist()
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    redo = build_corpus(cfg)
    assert redo.profiled == len(lost) and redo.already_done == 16 - len(lost)
    assert (victim.parent / (victim.name + ".corrupt")).is_file()
    final = raw_job_ids(out)
    assert len(final) == len(set(final)) == 16 and set(final) == expected


def test_a_truncated_graph_fails_stats_and_is_re_captured_by_the_next_build(tmp_path, capsys):
    from memgnn.predictor.ir.graph import file_sha256

    from memgnn.cli.dataset import add_stats_arguments, stats_cmd

    cfg = tiny(tmp_path, ["mlp"], 3)
    assert build_corpus(cfg).profiled == 3
    (path,) = (tmp_path / "graphs").glob("*.json.gz")
    gid = path.name.removesuffix(".json.gz")
    half = path.read_bytes()[: path.stat().st_size // 2]
    path.write_bytes(half)  # a crash or a full disk mid-write
    parser = argparse.ArgumentParser()
    add_stats_arguments(parser)
    assert stats_cmd(parser.parse_args([str(tmp_path), "--json"])) == 1
    stats = json.loads(capsys.readouterr().out)
    assert list(stats["integrity"]["corrupt_graphs"]) == [gid]
    assert stats["integrity"]["records_with_corrupt_graph"] == 3
    assert path.read_bytes() == half  # stats changed nothing

    repair = build_corpus(cfg)
    assert repair.graphs_repaired == [gid] and repair.graphs_unrepaired == {}
    assert repair.already_done == 0 and repair.profiled == 3  # its jobs were redone
    assert path.with_name(path.name + ".corrupt").is_file()  # the bad copy is kept aside
    corpus = Corpus(tmp_path)
    assert corpus.graph(gid).graph_id == gid and corpus.graph_problems(missing=True) == {}
    redone = pq.read_table(sorted((tmp_path / "parts").glob("*.parquet"), key=os.path.getmtime)[-1])
    assert set(redone.column("graph_sha256").to_pylist()) == {file_sha256(path)}
    assert stats_cmd(parser.parse_args([str(tmp_path)])) == 0
    again = build_corpus(cfg)
    assert again.profiled == 0 and again.graphs_repaired == []


def test_ray_and_local_give_identical_records(tmp_path):
    ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'memgnn[ray]')")
    families = ["mlp", "resnet"]
    local = tiny(tmp_path / "local", families, 6, sizes_per_config=2, workers=2, seed=5)
    build_corpus(local)
    remote = tiny(tmp_path / "ray", families, 6, sizes_per_config=2, workers=2, seed=5)
    remote.executor = "ray"
    ray.init(num_cpus=2, include_dashboard=False)
    try:
        summary = build_corpus(remote)
    finally:
        ray.shutdown()
    assert summary.profiled == 6
    a, b = comparable(local.out), comparable(remote.out)
    assert len(a) == 6 and a == b
    assert Corpus(local.out).graph_ids() == Corpus(remote.out).graph_ids()


def test_build_cmd_prints_a_summary(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    add_build_arguments(parser)
    args = parser.parse_args(_cli_args(tmp_path) + ["--size", "2", "--families", "mlp"])
    assert build_cmd(args) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["profiled"] == 2 and summary["records_per_min"] > 0
    bad = parser.parse_args(["--out", str(tmp_path), "--size", "1", "--families", "nope"])
    assert build_cmd(bad) == 2


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(size=1, executor="dask"), "executor"),
        (dict(size=1, backend="tpu"), "backend"),
        (dict(size=1, workers=0), "workers"),
        (dict(size=1, chunk_size=0), "chunk_size"),
        (dict(size=1, ray_address="ray://x:10001"), "--address"),
        (dict(size=1, caps={"max_flops": 1}), "caps"),
        (dict(size=-2), "size"),
    ],
)
def test_build_config_validation(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        BuildConfig(out=tmp_path, **kwargs)


def crash_on_bad(task: dict) -> dict:
    """A worker function whose 'bad' task kills its process (top level: spawn pickles it)."""
    if task["group"] == "bad":
        os._exit(3)
    return {"rows": [{"job_id": d["job_id"], "error": None} for d in task["jobs"]], "graphs": {}}


def test_a_task_that_kills_its_worker_is_retried_alone_then_recorded():
    from memgnn.dataset.executors import run_local
    from memgnn.dataset.sampler import Job

    def task(group: str, n: int) -> dict:
        job = Job(
            job_id=f"{group}-{n}", group=group, family="mlp", model="mlp", hparams={},
            sizes={"B": n}, train={}, backend="sim", device="h100-80gb",
        )  # fmt: skip
        return {"group": group, "jobs": [job.to_dict()]}

    tasks = [task("ok", 1), task("bad", 2), task("ok", 3), task("ok", 4)]
    results = {t["jobs"][0]["job_id"]: r for t, r in run_local(tasks, 2, fn=crash_on_bad)}
    assert sorted(results) == ["bad-2", "ok-1", "ok-3", "ok-4"]
    assert all(results[k]["rows"][0]["error"] is None for k in ("ok-1", "ok-3", "ok-4"))
    assert "worker process died" in results["bad-2"]["rows"][0]["error"]


def test_results_pickle_also_when_the_graph_comes_from_the_capture_cache(tmp_path):
    """A resumed build loads half-done configs' graphs from the cache; pool workers must
    still be able to send them back."""
    import pickle

    from memgnn.dataset.build import make_tasks
    from memgnn.dataset.executors import run_group

    cfg = tiny(tmp_path, ["mlp"], 2, sizes_per_config=2)
    (task,) = make_tasks(sample_jobs(cfg.sampler()), str(tmp_path / "cache"), 1)
    first, again = run_group(task), run_group(task)  # the second one hits the cache
    assert list(first["graphs"]) == list(again["graphs"])
    assert pickle.loads(pickle.dumps(again))["rows"] == again["rows"]


def _labels(row):
    return row["peak_allocated_bytes"], row["peak_reserved_bytes"], row["device_total_bytes"]


def test_sim_labels_use_the_symbolic_graph_once_it_agrees_with_a_concrete_capture(tmp_path):
    from memgnn.dataset.profile import ProfileConfig, profile
    from memgnn.predictor.spec.train import TrainSpec
    from memgnn.predictor.zoo import make_bundle

    build_corpus(tiny(tmp_path, ["gpt2"], 3, devices=["a100-80gb"]))
    rows = Corpus(tmp_path).records()
    assert len(rows) == 3
    kinds = sorted(r["stats"]["label_graph"] for r in rows)
    assert kinds == ["concrete", "symbolic", "symbolic"]
    (checked,) = [r for r in rows if r["stats"]["label_graph"] == "concrete"]
    assert checked["stats"]["symbolic_check"].startswith("symbolic == concrete")
    assert min(checked["sizes"].values()) == max(min(r["sizes"].values()) for r in rows)
    bundle = make_bundle("gpt2", rows[0]["hparams"])
    for row in rows:  # a concrete capture gives the same labels at every size
        again = profile(
            bundle, TrainSpec.of(**row["train"]), row["sizes"], ProfileConfig(device="a100-80gb")
        )
        assert _labels(row) == (
            again.peak_allocated_bytes,
            again.peak_reserved_bytes,
            again.device_total_bytes,
        )


def test_sim_labels_stay_concrete_where_the_symbolic_graph_disagrees(tmp_path, monkeypatch):
    import memgnn.dataset.profile

    monkeypatch.setattr(
        memgnn.dataset.profile, "symbolic_agrees", lambda g, r, c: (False, "differs")
    )
    build_corpus(tiny(tmp_path, ["mlp"], 3, devices=["a100-80gb"]))
    rows = Corpus(tmp_path).records()
    assert len(rows) == 3
    assert {r["stats"]["label_graph"] for r in rows} == {"concrete"}
    assert [r["stats"].get("symbolic_check") for r in rows].count("differs") == 1
