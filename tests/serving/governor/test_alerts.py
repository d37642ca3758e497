"""Alerts, elastic precision, live samples and per-step records of the governor."""

from __future__ import annotations

import gzip
import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
import torch
from memgnn.predictor.ir.graph import StepGraph
from memgnn.predictor.spec.train import TrainSpec
from memgnn.serving.governor.alerts import AlertBook, HttpSampleSink, StepRecord, tier_of
from memgnn.serving.governor.demo import fixed_batches, long_tail_samples, tiny_varlen_bundle
from memgnn.serving.governor.runtime import OverflowTracker, sensitive_modules

from tests.serving.governor.governed import governor

MiB = 1 << 20


pytestmark = pytest.mark.usefixtures("one_thread")


def run(gov, steps=6, size=8, length=48):
    batches = fixed_batches(long_tail_samples(steps * size, lo=length, hi=length), size)
    return [gov.step(b) for b in batches]


class FakeScaler:
    """GradScaler look-alike: from call `overflow_from` on, every step overflows (the
    optimizer step is skipped and the scale halves), as with a huge loss scale."""

    def __init__(self, overflow_from: int) -> None:
        self.value, self.calls, self.overflow_from = 1024.0, 0, overflow_from
        self.skipped = False

    def scale(self, loss):
        return loss

    def step(self, optimizer):
        self.calls += 1
        self.skipped = self.calls >= self.overflow_from
        if not self.skipped:
            optimizer.step()

    def update(self):
        if self.skipped:
            self.value /= 2

    def get_scale(self):
        return self.value


def test_sustained_overflow_moves_sensitive_layers_to_fp32(cache):
    scaler = FakeScaler(overflow_from=3)
    gov = governor(
        cache,
        train=TrainSpec.of(optimizer_impl="foreach", precision="amp-bf16"),
        scaler=scaler,
        overflow_window=5,
        overflow_sustained=3,
    )
    head_dtypes = []
    gov.model.head.register_forward_hook(lambda m, i, o: head_dtypes.append(o.dtype))
    records = run(gov, steps=8)
    assert [r.overflow for r in records] == [False, False] + [True] * 6
    assert records[-1].loss_scale == 1024.0 / 2**6
    names = set(gov.elastic.promoted)
    assert "head" in names and any("ln" in n for n in names)
    promoted_at = next(r.step for r in records if any("precision" in a for a in r.alerts))
    assert promoted_at == 5  # the third overflow (steps 3, 4, 5) after good steps
    assert head_dtypes[0] == torch.bfloat16 and head_dtypes[-1] == torch.float32
    kinds = gov.alerts.counts
    assert kinds.get("overflow", 0) >= 1  # rate > 1% over the window
    assert gov.overflow.total == 6


def test_overflow_before_the_first_good_step_is_calibration():
    tracker = OverflowTracker(window=4)
    assert tracker.observe(65536.0, 32768.0) is True
    assert tracker.observe(32768.0, 32768.0) is False
    assert tracker.rate == 0.5 and tracker.recent == 1
    names = sensitive_modules(tiny_varlen_bundle().build())
    assert "head" in names and all(not n.startswith("head.") for n in names)


@pytest.mark.parametrize(
    ("tiers", "expected"),
    [((0.01, 1.3, 1.4), "log"), ((0.01, 0.02, 1.4), "optimize"), ((0.01, 0.02, 0.03), "pause")],
)
def test_alert_tiers(cache, tiers, expected):
    paused = []
    gov = governor(cache, tiers=tiers, on_pause=paused.append, stability_window=1)
    records = run(gov, steps=3)
    assert {r.tier for r in records} == {expected}
    tier_alerts = [a for a in gov.alerts.alerts if a.kind == "tier"]
    assert tier_alerts and expected in tier_alerts[0].message
    if expected == "pause":
        assert len(paused) == 3 and isinstance(paused[0], StepRecord)
        assert records[-1].micro_batch < records[0].micro_batch  # shrinks after the pause
    else:
        assert not paused
    if expected == "optimize":
        assert gov.policy.forced >= 1  # re-planned with the latest correction


def test_fragmentation_and_recompute_warnings(cache):
    gov = governor(
        cache,
        checkpointing=["full"],
        fragmentation_warn=1.0,
        fragmentation_every=1,
        fragmentation_min_free=0.0,
        recompute_warn=0.01,
        cooldown=0,
    )
    records = run(gov, steps=3)
    assert all(r.checkpointing == "full" for r in records)
    assert gov.alerts.counts.get("fragmentation", 0) >= 1
    assert gov.alerts.counts.get("recompute", 0) >= 1
    assert all(0 < r.recompute_fraction < 1 for r in records)
    assert all(r.fragmentation is not None and r.fragmentation < 1 for r in records)


def test_alert_book_cooldown_and_tiers():
    seen = []
    book = AlertBook(cooldown=10, on_alert=seen.append)
    from memgnn.serving.governor.alerts import Alert

    assert book.emit(Alert(step=1, kind="x", level="info", message="a"))
    assert not book.emit(Alert(step=5, kind="x", level="info", message="b"))
    assert book.emit(Alert(step=5, kind="x", level="info", message="c"), force=True)
    assert book.emit(Alert(step=15, kind="x", level="warning", message="d"))
    assert [a.message for a in seen] == ["a", "c", "d"] and book.counts == {"x": 3}
    assert [tier_of(u, (0.7, 0.8, 0.9)) for u in (0.5, 0.7, 0.85, 0.95)] == [
        "ok", "log", "optimize", "pause",
    ]  # fmt: skip


def test_records_and_samples_reach_their_sinks(cache):
    received: dict[str, list] = {"/graphs": [], "/samples": []}

    class Handler(BaseHTTPRequestHandler):  # stands in for `memgnn serve`
        def do_POST(self):  # noqa: N802 - http.server API
            body = self.rfile.read(int(self.headers["content-length"]))
            if self.path == "/graphs":
                graph = json.loads(gzip.decompress(body))
                received["/graphs"].append(graph)
                reply = {"graph_id": StepGraph.from_dict(graph).graph_id}
            else:
                received["/samples"].append(json.loads(body))
                reply = {"stored": True}
            data = json.dumps(reply).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    sink = HttpSampleSink(f"http://127.0.0.1:{server.server_port}")
    records = []
    gov = governor(cache, on_sample=sink, on_record=records.append, sample_every=2)
    run(gov, steps=4)
    sink.close()
    server.shutdown()
    assert len(records) == 4 and [r.step for r in records] == [1, 2, 3, 4]
    assert [r.measured_allocated_bytes is not None for r in records] == [False, True] * 2
    assert len(received["/graphs"]) == 1  # uploaded once
    samples = received["/samples"]
    assert len(samples) == 2 and sink.sent == 2 and sink.failed == 0
    assert set(samples[0]) == {
        "graph_id",
        "sizes",
        "device",
        "metric",
        "scenario",
        "measured_peak_bytes",
        "key",
    }  # fmt: skip  (exactly serving.schemas.SampleIn)
    assert samples[0]["graph_id"] == gov.base_graph.graph_id
    assert samples[0]["device"] == "cpu" and samples[0]["metric"] == "allocated"
    assert samples[0]["measured_peak_bytes"] > 0 and samples[0]["key"] != samples[1]["key"]
    metrics = records[-1].metrics()
    assert metrics["samples"] == 8 and "tier_level" in metrics and "step" not in metrics
    json.dumps(records[-1].to_dict())
    with pytest.raises(ValueError):
        HttpSampleSink("ftp://x")


def test_mlflow_sink_logs_each_record(cache, tmp_path):
    mlflow = pytest.importorskip("mlflow", reason="mlflow is not installed")
    from memgnn.serving.governor.alerts import mlflow_sink

    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    try:
        gov = governor(cache, on_record=mlflow_sink())
        with mlflow.start_run() as active:
            run(gov, steps=2)
        history = mlflow.tracking.MlflowClient().get_metric_history(
            active.info.run_id, "governor/bound_bytes"
        )
    finally:
        mlflow.set_tracking_uri(previous)
    assert [m.step for m in history] == [1, 2]
    assert all(m.value <= gov.limit for m in history)
