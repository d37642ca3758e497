"""The GPU validation: its matrix, summary and report, and its resume logic (no GPU needed:
`profile` is replaced by a fake returning canned records)."""

from __future__ import annotations

import json

import memgnn.dataset.validate_gpu as vg
import pytest
import torch
from memgnn.dataset.record import ProfileRecord
from memgnn.dataset.validate_gpu import (
    RECORDS_FILE,
    SUMMARY_JSON,
    SUMMARY_MD,
    ValidationConfig,
    config_matrix,
    load_pairs,
    render_markdown,
    run_validation,
    summarize,
)
from memgnn.predictor.spec.train import TrainSpec

# ---- the matrix --------------------------------------------------------------------------


def test_config_matrix_size_and_coverage():
    configs = config_matrix()
    assert len(configs) >= 30
    assert len({c.job_id for c in configs}) == len(configs)
    assert len({c.family for c in configs}) >= 5
    trains = [c.train_spec() for c in configs]  # every one a valid TrainSpec
    assert all(isinstance(t, TrainSpec) for t in trains)
    assert {t.numerics.precision for t in trains} >= {"fp32", "bf16", "amp-bf16", "amp-fp16"}
    assert {t.optim.name for t in trains} >= {"adamw", "sgd", "adafactor"}
    assert {t.optim.impl for t in trains if t.optim.name == "adamw"} >= {"foreach", "fused"}
    assert {t.activations.checkpointing for t in trains} == {"none", "full"}
    assert {t.loop.grad_accum for t in trains} == {1, 2}
    assert config_matrix() == configs  # deterministic


def test_config_matrix_sizes_stay_small():
    for c in config_matrix():
        tokens = c.sizes["B"] * c.sizes.get("S", 1)
        assert tokens <= 16384, c.label()


def test_validation_config_checks_and_job_id():
    cfg = ValidationConfig(model="gpt2", hparams={"layers": 2}, sizes={"B": 2, "S": 8})
    assert cfg.family == "gpt2"
    assert cfg.train == TrainSpec().flat()  # defaults made explicit
    same = ValidationConfig(model="gpt2", hparams={"layers": 2}, sizes={"S": 8, "B": 2})
    assert same.job_id == cfg.job_id and len(cfg.job_id) == 40
    other = ValidationConfig(model="gpt2", hparams={"layers": 2}, sizes={"B": 4, "S": 8})
    assert other.job_id != cfg.job_id
    for bad in (
        dict(model="no-such-model"),
        dict(model="gpt2", hparams={"depth": 3}),
        dict(model="gpt2", sizes={"T": 3}),
        dict(model="gpt2", sizes={"B": 0}),
        dict(model="gpt2", train={"precision": "fp8"}),
        dict(model="gpt2", train={"speed": 2}),
    ):
        with pytest.raises(ValueError):
            ValidationConfig(**bad)


# ---- summary and report ------------------------------------------------------------------


def _side(alloc, reserved, total, **stats):
    return {
        "peak_allocated_bytes": alloc,
        "peak_reserved_bytes": reserved,
        "device_total_bytes": total,
        "stats": stats,
        "error": None,
    }


def _pair(n, real, sim, family="gpt2", **extra):
    cfg = {"model": "gpt2", "hparams": {}, "sizes": {"B": n, "S": 8}, "train": {}}
    return {"job_id": f"job{n}", "config": cfg, "family": family, "cuda": real, "sim": sim,
            "errors": {}} | extra  # fmt: skip


def test_summarize_by_hand():
    pairs = [
        _pair(1, _side(100, 200, 1000), _side(110, 200, 1000)),  # +10%, 0, 0
        _pair(2, _side(100, 200, 1000), _side(90, 220, None)),  # -10%, +10%, -
        _pair(3, _side(100, 200, 1000), _side(150, 100, 900), family="bert"),  # +50%, -50%, -10%
        _pair(4, _side(100, 200, 1000), _side(100, 260, 1300)),  # 0, +30%, +30%
        _pair(5, _side(100, 200, 1000, oom=True), _side(1, 1, 1)),  # OOM: not compared
        _pair(6, None, _side(1, 1, 1), errors={"cuda": "RuntimeError: x"}),  # failed
    ]
    s = summarize(pairs)
    assert (s["pairs"], s["failed"], s["cuda_oom"]) == (6, 1, 1)
    a, r, t = (s["metrics"][m] for m in ("allocated", "reserved", "device_total"))
    # allocated errors: +0.1, -0.1, +0.5, 0 -> |.|: 0, 0.1, 0.1, 0.5
    assert a["n"] == 4
    assert a["median_abs"] == pytest.approx(0.1)
    assert a["p90_abs"] == pytest.approx(0.1 + 0.7 * 0.4)  # linear, at index 2.7
    assert a["max_abs"] == pytest.approx(0.5)
    assert a["median_signed"] == pytest.approx(0.05)  # -0.1, 0, 0.1, 0.5
    assert a["mean_signed"] == pytest.approx(0.125)
    assert a["worst"][0]["job_id"] == "job3" and a["worst"][0]["rel_error"] == pytest.approx(0.5)
    assert [w["job_id"] for w in a["worst"]][-1] == "job4"  # ties keep the input order
    # reserved: 0, +0.1, -0.5, +0.3 -> |.|: 0, 0.1, 0.3, 0.5
    assert r["median_abs"] == pytest.approx(0.2) and r["median_signed"] == pytest.approx(0.05)
    assert r["by_family_median_abs"] == {"bert": pytest.approx(0.5), "gpt2": pytest.approx(0.1)}
    # device_total: 0, -0.1, +0.3 (pair 2 has no sim value)
    assert t["n"] == 3 and t["median_abs"] == pytest.approx(0.1)
    assert t["max_abs"] == pytest.approx(0.3)


def test_summarize_empty():
    s = summarize([])
    assert s["pairs"] == 0
    assert s["metrics"]["reserved"] == s["metrics"]["reserved"] | {"n": 0, "median_abs": None}
    assert "(none compared)" in render_markdown(s)


def test_render_markdown_has_every_metric():
    pairs = [_pair(n, _side(100, 200, 1000), _side(100 + n, 200 - n, 1000)) for n in range(1, 4)]
    md = render_markdown(summarize(pairs) | {"device": "h200-141gb"})
    for metric in ("allocated", "reserved", "device_total"):
        assert f"| {metric} |" in md
        assert f"## Worst configs: {metric}" in md
    assert "h200-141gb" in md and "gpt2[B=3,S=8]" in md and "+3.0%" in md


# ---- running, with a fake profile --------------------------------------------------------


class FakeProfile:
    """Stands in for dataset.profile.profile: canned records, sim 10% above cuda."""

    def __init__(self, fail_sim_for: str | None = None) -> None:
        self.calls: list[tuple[str, str]] = []
        self.fail_sim_for = fail_sim_for

    def __call__(self, bundle, train, sizes, config):
        self.calls.append((config.backend, bundle.name))
        if config.backend == "sim" and bundle.name == self.fail_sim_for:
            raise ValueError("capture failed")
        real = 1000 * sum(sizes.values())
        value = real if config.backend == "cuda" else real * 11 // 10
        return ProfileRecord(
            backend=config.backend,
            device=config.device or "h200-141gb",
            torch_version=torch.__version__,
            model=bundle.name,
            family=bundle.family,
            sizes=sizes,
            train=train.flat(),
            peak_allocated_bytes=value,
            peak_reserved_bytes=2 * value,
            device_total_bytes=2 * value + 5000,
            stats={"oom": False},
        )


def test_run_validation_writes_and_resumes(tmp_path, monkeypatch):
    fake = FakeProfile()
    monkeypatch.setattr(vg, "profile", fake)
    summary = run_validation(tmp_path, limit=4, device_name="h200-141gb")
    assert len(fake.calls) == 8  # 4 configs x (cuda, sim)
    assert {backend for backend, _ in fake.calls} == {"cuda", "sim"}
    pairs = load_pairs(tmp_path / RECORDS_FILE)
    assert [p["job_id"] for p in pairs] == [c.job_id for c in config_matrix()[:4]]
    assert all(p["cuda"]["backend"] == "cuda" and p["sim"]["device"] == "h200-141gb" for p in pairs)
    assert summary["metrics"]["allocated"]["median_abs"] == pytest.approx(0.1, abs=1e-3)
    assert summary["device"] == "h200-141gb"
    on_disk = json.loads((tmp_path / SUMMARY_JSON).read_text())
    assert on_disk["pairs"] == 4
    assert "| reserved |" in (tmp_path / SUMMARY_MD).read_text()

    fake.calls.clear()
    again = run_validation(tmp_path, limit=4, device_name="h200-141gb")
    assert fake.calls == []  # everything was already there
    assert again["pairs"] == 4
    assert len(load_pairs(tmp_path / RECORDS_FILE)) == 4

    with (tmp_path / RECORDS_FILE).open("a") as fh:
        fh.write('{"job_id": "cut sh')  # an interrupted write
    more = run_validation(tmp_path, limit=6, device_name="h200-141gb")
    assert len(fake.calls) == 4  # only the 2 new configs
    assert more["pairs"] == 6


def test_run_validation_records_a_failing_side_and_goes_on(tmp_path, monkeypatch):
    cfgs = [
        ValidationConfig(model="mlp", sizes={"B": 8}),
        ValidationConfig(model="resnet", sizes={"B": 2}),
    ]
    monkeypatch.setattr(vg, "profile", FakeProfile(fail_sim_for="mlp"))
    summary = run_validation(tmp_path, configs=cfgs, device_name="a100-80gb")
    pairs = load_pairs(tmp_path / RECORDS_FILE)
    assert pairs[0]["errors"] == {"sim": "ValueError: capture failed"}
    assert pairs[0]["cuda"] is not None and pairs[0]["sim"] is None
    assert pairs[1]["errors"] == {}
    assert summary["failed"] == 1 and summary["metrics"]["reserved"]["n"] == 1


def test_run_validation_rejects_bad_options(tmp_path):
    with pytest.raises(ValueError, match="limit"):
        run_validation(tmp_path, limit=0, device_name="h200-141gb")
    with pytest.raises(ValueError, match="unknown device profile"):
        run_validation(tmp_path, device_name="tpu-v9")
