"""The exact prediction path: captured models replayed on the compiled core give the
Python simulator's bytes, OOM verdict and per-phase peaks; `auto` routes by budget."""

import json

import numpy as np
import pytest
from memgnn.predictor.answer.backend import LocalBackend
from memgnn.predictor.answer.exact import ExactConfig, ReplayModel, decide
from memgnn.predictor.answer.predict import answer_entry
from memgnn.predictor.capture.capture import CaptureConfig, capture
from memgnn.predictor.ir.vocab import MATMUL_OPS, PHASES
from memgnn.predictor.memory.analytic import AnalyticModel, sweep
from memgnn.predictor.memory.base import Prediction, Query
from memgnn.predictor.sim.allocator import AllocatorConfig
from memgnn.predictor.sim.replay.trace import replay_trace_fast
from memgnn.predictor.sim.simulate import build_trace, replay_trace, simulate
from memgnn.predictor.spec.devices import get_profile
from memgnn.predictor.spec.train import TrainSpec
from memgnn.predictor.zoo import resolve
from tiny_models import tiny_gpt_bundle

from memgnn.cli import main
from tests.predictor.sim.test_allocator_fast import assert_same

A100 = get_profile("a100-80gb")


@pytest.fixture(scope="module")
def graphs(one_thread):
    """Symbolic CUDA captures of real zoo models at small size (and the tiny GPT)."""
    adamw = TrainSpec.of(optimizer="adamw")
    return {
        "gpt2": capture(resolve("gpt2", {}, None), adamw, CaptureConfig(target="cuda")),
        "tiny-gpt-ckpt": capture(
            tiny_gpt_bundle(), TrainSpec.of(checkpointing="full"), CaptureConfig(target="cuda")
        ),
    }


SIZES = [{"B": 2, "S": 32}, {"B": 8, "S": 256}]
CONFIGS = [
    AllocatorConfig(capacity_bytes=A100.total_bytes - A100.context_bytes),
    AllocatorConfig(expandable_segments=True),
    AllocatorConfig(capacity_bytes=60 << 20, max_split_size=20 << 20),  # OOMs the larger
]


def reference_build_trace(graph, path: int, resolved: dict[str, int], device) -> list[tuple]:
    """predictor.sim.simulate.build_trace as it was before the cached skeleton (the oracle)."""
    p = graph.paths[path]
    nbytes = graph.storage_bytes(path, resolved)
    scratch_at = graph.scratch_bytes(path, resolved)
    alloc = np.asarray(p.storages["alloc"])
    events: list[tuple] = [("alloc", int(u), int(nbytes[u])) for u in np.flatnonzero(alloc < 0)]
    allocs_at: dict[int, list[int]] = {}
    for u in np.flatnonzero(alloc >= 0):
        allocs_at.setdefault(int(alloc[u]), []).append(int(u))
    frees_at: dict[int, list[int]] = {}
    for u, f in enumerate(p.storages["free"]):
        if f >= 0:
            frees_at.setdefault(f, []).append(u)
    workspace_for: set[str] = set()
    mark = None
    for i, op in enumerate(p.nodes["op"]):
        phase = PHASES[p.nodes["phase"][i]]
        step = p.nodes["step"][i]
        if (phase, step) != mark:
            mark = (phase, step)
            events.append(("mark", phase, step))
        if device.is_gpu and op.startswith(MATMUL_OPS):
            handle = "backward" if phase == "backward" else "main"
            if handle not in workspace_for:
                workspace_for.add(handle)
                events.append(("alloc", f"cublas-{handle}", device.cublas_workspace_bytes))
        scratch = int(scratch_at[i]) if device.is_gpu else 0
        if scratch:
            events.append(("alloc", f"scratch-{i}", scratch))
        for u in allocs_at.get(i, ()):
            events.append(("alloc", u, int(nbytes[u])))
        if scratch:
            events.append(("free", f"scratch-{i}", 0))
        for u in frees_at.get(i, ()):
            events.append(("free", u, 0))
    return events


def test_trace_skeleton_equals_the_reference_trace(graphs):
    for graph in graphs.values():
        for sizes in [*SIZES, {"B": 1, "S": 2}]:
            resolved = sweep(graph, sizes, scenario="worst").sizes
            for device in (A100, get_profile("cpu")):
                want = reference_build_trace(graph, 0, resolved, device)
                assert build_trace(graph, 0, resolved, device) == want


@pytest.mark.parametrize("cfg", CONFIGS, ids=["a100", "expandable", "tight"])
def test_captured_traces_match_python_event_for_event(graphs, cfg):
    compared, ooms = 0, 0
    for graph in graphs.values():
        for sizes in SIZES:
            resolved = sweep(graph, sizes, scenario="worst").sizes
            events = build_trace(graph, 0, resolved, A100)
            ooms += assert_same(events, cfg).oom
            fast = replay_trace_fast(events, cfg)
            assert fast == replay_trace(events, cfg)
            compared += len(events)
    assert compared > 2000
    assert (ooms > 0) == (cfg.capacity_bytes == 60 << 20)  # the tight device does OOM


@pytest.mark.parametrize("metric", ["allocated", "reserved", "device_total"])
def test_replay_model_equals_simulate(graphs, metric):
    for graph in graphs.values():
        for sizes in SIZES:
            pred = ReplayModel().predict(graph, [Query(sizes=sizes, device=A100.name,
                                                       metric=metric)])[0]  # fmt: skip
            ref = simulate(graph, sizes, A100, scenario="worst")
            want = {
                "allocated": ref.peak_allocated_bytes,
                "reserved": ref.peak_reserved_bytes,
                "device_total": ref.device_total_bytes,
            }[metric]
            assert pred.method == "replay" and pred.metric == metric
            assert pred.predicted_peak_bytes == pred.upper_bound_bytes == want
            assert pred.breakdown["phases"] == ref.breakdown["phases"]
            assert not pred.breakdown["would_oom"]


def test_oom_verdict_and_what_the_step_needs(graphs):
    graph, sizes = graphs["gpt2"], SIZES[1]
    need = simulate(graph, sizes, A100, scenario="worst").peak_reserved_bytes
    tight = AllocatorConfig(capacity_bytes=need // 2)
    ref = simulate(graph, sizes, A100, scenario="worst", allocator=tight)
    assert ref.stats["would_oom"]
    pred = ReplayModel(tight).predict(graph, [Query(sizes=sizes, device=A100.name)])[0]
    assert pred.breakdown["would_oom"] is True
    assert pred.breakdown["oom_message"] == ref.stats["oom_message"]
    assert pred.breakdown["sim_peak_reserved_bytes"] == ref.peak_reserved_bytes
    assert pred.predicted_peak_bytes == need > tight.capacity_bytes


def test_cpu_target_is_the_sweep_and_says_analytic(graphs):
    cpu = get_profile("cpu")
    graph = graphs["gpt2"]
    pred = ReplayModel().predict(graph, [Query(sizes=SIZES[0], device="cpu")])[0]
    assert pred.method == "analytic"
    assert pred.predicted_peak_bytes == simulate(graph, SIZES[0], cpu).peak_allocated_bytes


def test_auto_routes_by_budget(graphs):
    graph = graphs["gpt2"]
    assert decide("auto", graph, ExactConfig(budget_s=10.0)).method == "replay"
    assert decide("auto", graph, ExactConfig(budget_s=0.0)).method == "gnn"
    assert decide("analytic", graph, ExactConfig(budget_s=10.0)).method == "analytic"
    with pytest.raises(ValueError, match="unknown method"):
        decide("exact", graph, ExactConfig())
    with pytest.raises(ValueError, match="budget_s"):
        ExactConfig(budget_s=-1)
    q = [Query(sizes=SIZES[0], device=A100.name)]
    backend = LocalBackend(learned=AnalyticModel())
    entry = backend.register(graph)
    (gnn,) = answer_entry(entry, q, backend.choose("auto", 0, entry), backend)
    assert gnn.prediction.method == "analytic"  # the learned slot held the analytic baseline
    (exact,) = answer_entry(entry, q, backend.choose("auto", 10_000, entry), backend)
    assert exact.prediction.method == "replay"


def test_prediction_rejects_unknown_method():
    with pytest.raises(ValueError, match="method"):
        Prediction(predicted_peak_bytes=1, upper_bound_bytes=1, metric="allocated",
                   breakdown={}, model_version="x", method="guess")  # fmt: skip


def test_cli_replay_equals_profile_sim(capsys):
    common = ["--model", "gpt2", "--batch", "4", "--seq", "64", "--device", "a100-80gb"]
    assert main(["profile", "--backend", "sim", *common, "--json"]) == 0
    prof = json.loads(capsys.readouterr().out)
    for metric in ("allocated", "reserved"):
        assert main(["predict", *common, "--method", "replay", "--metric", metric, "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["method"] == "replay"
        assert out["predicted_peak_bytes"] == prof[f"peak_{metric}_bytes"]
    assert main(["predict", *common, "--method", "analytic", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["method"] == "analytic"


def test_demo_corpus_sim_labels_are_the_replay_s_bytes():
    """Every sim row of dataset/data/demo-corpus: the replay of its stored graph at its
    sizes gives its labels to the byte (a row whose graph or label older code made fails)."""
    from dataclasses import replace
    from pathlib import Path

    from memgnn.dataset.corpus import Corpus

    demo = Corpus(Path(__file__).resolve().parents[3] / "dataset" / "data" / "demo-corpus")
    rows = [r for r in demo.records() if r["backend"] == "sim"]
    assert len(rows) == 40
    model, graphs, off = ReplayModel(), {}, []
    for r in rows:
        g = graphs.get(r["graph_id"]) or graphs.setdefault(r["graph_id"], demo.graph(r["graph_id"]))
        scenario = r["stats"].get("scenario") or "balanced"
        q = Query(sizes={s: v for s, v in r["sizes"].items() if s in g.symbols},
                  device=r["device"], scenario=scenario)  # fmt: skip
        for metric, label in (("allocated", "peak_allocated_bytes"),
                              ("reserved", "peak_reserved_bytes"),
                              ("device_total", "device_total_bytes")):  # fmt: skip
            got = model.predict(g, [replace(q, metric=metric)])[0].predicted_peak_bytes
            if got != r[label]:
                off.append((r["job_id"][:10], r["family"], r["sizes"], metric, got - r[label]))
    assert off == []


def test_a_replay_asked_again_is_remembered_not_replayed(graphs, monkeypatch):
    """The same query on the same graph: the same bytes, paths and breakdown (marked
    ``replay_memo``) without a second replay; other sizes or another metric replay anew."""
    from memgnn.predictor.answer import exact

    graph, calls = graphs["gpt2"], []
    real = exact.simulate
    monkeypatch.setattr(exact, "simulate", lambda *a, **k: calls.append(1) or real(*a, **k))
    q = Query(sizes={"B": 3, "S": 48}, device="a100-80gb")
    (first,) = ReplayModel().predict(graph, [q])
    assert len(calls) == 1 and "replay_memo" not in first.breakdown
    first.breakdown["mutated by a caller"] = True  # the memo keeps its own copy
    (again,) = ReplayModel().predict(graph, [q])
    assert len(calls) == 1 and again.breakdown.pop("replay_memo") is True
    first.breakdown.pop("mutated by a caller")
    assert (again.predicted_peak_bytes, again.paths, again.breakdown) == (
        first.predicted_peak_bytes, first.paths, first.breakdown,
    )  # fmt: skip
    ReplayModel().predict(graph, [Query(sizes={"B": 3, "S": 64}, device="a100-80gb")])
    ReplayModel().predict(graph, [Query(sizes=q.sizes, device=q.device, metric="allocated")])
    assert len(calls) == 3
