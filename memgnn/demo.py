"""`memgnn demo`: the end-to-end job on an embedded default, CPU only, a few minutes.

1. capture one training step of a small GPT-2 (transformers, built offline) with symbolic
   batch and sequence sizes, and save it;
2. evaluate that one capture at several sizes, far from the trace size too (the analytic
   liveness sweep, tensor bytes);
3. ground truth: simulate the CUDA caching allocator for an H100 at one size, and check the
   simulator against a real CPU run at a small size;
4. predict with the shipped model (the analytic baseline where none ships) next to the
   simulated value;
5. learn: build a small corpus, train a GNN tracked in mlflow (embedded SQLite store),
   register it, export it to ONNX, and predict configs of a family it never saw next to
   their measured labels (`memgnn/demo_learn.py`);
6. start the HTTP service on loopback, ask `/predict` and `/plan`, stop it;
7. a short governed training run on a memory-capped emulated device with variable-length
   batches: the decisions it made and the OOMs it avoided.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from memgnn.cli.render import fmt_bytes, print_table
from memgnn.demo_learn import learn_step

log = logging.getLogger(__name__)

DEMO_MODEL = "gpt2"
DEMO_ARGS = {"layers": 2, "hidden": 128, "heads": 4, "vocab": 1000}


def run_demo(out: Path) -> int:
    from memgnn.dataset.profile import ProfileConfig, profile
    from memgnn.predictor.capture.capture import capture
    from memgnn.predictor.memory.analytic import sweep
    from memgnn.predictor.spec.train import TrainSpec
    from memgnn.predictor.zoo import make_bundle

    out.mkdir(parents=True, exist_ok=True)
    bundle = make_bundle(DEMO_MODEL, DEMO_ARGS)
    train = TrainSpec.of(optimizer="adamw")
    print(
        f"== 1. capture {bundle.name} {bundle.hparams} "
        f"({train.optim.name}, {train.numerics.precision})"
    )
    t0 = time.perf_counter()
    graph = capture(bundle, train)
    gid = graph.save(out / "step.json.gz")
    nodes = sum(p.num_nodes for p in graph.paths)
    print(
        f"   {nodes} nodes, symbols {list(graph.symbols)}, graph id {gid}, "
        f"{time.perf_counter() - t0:.1f}s -> {out / 'step.json.gz'}"
    )

    print("== 2. one capture, any size: peak live tensor bytes (analytic sweep)")
    rows = []
    for b, s in [(1, 32), (8, 128), (32, 512), (64, 1024)]:  # 1024: its position table
        r = sweep(graph, {"B": b, "S": s})
        cats = r.best.breakdown
        rows.append(
            [
                f"B={b} S={s}",
                fmt_bytes(r.peak_bytes),
                r.best.peak_phase,
                fmt_bytes(cats["activation"]),
                fmt_bytes(cats["optimizer_state"]),
            ]
        )
    print_table(["size", "peak", "at phase", "activations", "optimizer state"], rows)

    print("== 3. ground truth")
    sizes = {"B": 8, "S": 256}
    sim = profile(bundle, train, sizes, ProfileConfig(backend="sim", device="h100-80gb"))
    print(
        f"   sim on h100-80gb at {sizes}: allocated {fmt_bytes(sim.peak_allocated_bytes)}, "
        f"reserved {fmt_bytes(sim.peak_reserved_bytes)}, "
        f"device total {fmt_bytes(sim.device_total_bytes)} ({sim.seconds:.1f}s)"
    )
    small = {"B": 4, "S": 64}
    real = profile(bundle, train, small, ProfileConfig(backend="cpu"))
    simc = profile(bundle, train, small, ProfileConfig(backend="sim", device="cpu"))
    err = (simc.peak_allocated_bytes - real.peak_allocated_bytes) / real.peak_allocated_bytes
    print(
        f"   cpu real run at {small}: {real.peak_allocated_bytes} B live tensors; "
        f"sim: {simc.peak_allocated_bytes} B ({err:+.3%})"
    )
    _predict_step(graph, sizes, sim)
    learn_step(out)
    _service_step(out)
    _governor_step(out)
    return 0


def _predict_step(graph, sizes, sim) -> None:
    from memgnn.predictor.memory.base import Query
    from memgnn.predictor.memory.onnx_model import load_default_model

    print("== 4. prediction vs the simulated ground truth (reserved bytes, h100-80gb)")
    model = load_default_model()
    t0 = time.perf_counter()
    pred = model.predict(graph, [Query(sizes=sizes, device="h100-80gb")])[0]
    ms = (time.perf_counter() - t0) * 1e3
    err = (pred.predicted_peak_bytes - sim.peak_reserved_bytes) / sim.peak_reserved_bytes
    print(
        f"   {pred.model_version}: predicted {fmt_bytes(pred.predicted_peak_bytes)}, bound "
        f"{fmt_bytes(pred.upper_bound_bytes)}, sim {fmt_bytes(sim.peak_reserved_bytes)} "
        f"({err:+.2%}), {ms:.1f} ms"
    )


def _service_step(out: Path) -> None:
    from memgnn.serving.client import service_round_trip
    from memgnn.serving.config import ServeConfig

    print("== 6. the HTTP service on loopback: /predict and /plan")
    res = service_round_trip(
        ServeConfig(state_dir=out / "service"),
        model=DEMO_MODEL,
        model_args={k: str(v) for k, v in DEMO_ARGS.items()},
        sizes={"B": 8, "S": 256},
        device="a100-80gb",
        budget_fraction=0.05,
    )
    p = res["predict"]
    print(
        f"   {res['url']}/predict: {p['metric']} {fmt_bytes(p['predicted_peak_bytes'])} "
        f"(bound {fmt_bytes(p['upper_bound_bytes'])}, model {p['model_version']})"
    )
    best = res["plan"].get("best") or {}
    print(
        f"   /plan for 5% of an A100-80GB: batch {best.get('batch_size')}, accumulation "
        f"{best.get('grad_accum')}, checkpointing {best.get('checkpointing')}, "
        f"precision {best.get('precision')}"
    )


def _governor_step(out: Path) -> None:
    from memgnn.serving.governor.demo import demo_governed_run

    print("== 7. governed training run, variable lengths, emulated memory-capped device")
    res = demo_governed_run(out / "governor", steps=120)
    for d in res["decisions"][:8]:
        print(
            f"   step {d['step']}: length bucket {d['padded_length_bucket']} -> micro-batch "
            f"{d['micro_batch']} x {d['grad_accum']}, checkpointing {d['checkpointing']}"
        )
    print(
        f"   {res['steps']} steps, {res['samples']} samples, OOMs {res['ooms']}, OOMs avoided "
        f"{res['ooms_avoided']}, rollbacks {res['rollbacks']}, overhead "
        f"{res['overhead_ms_per_step']} ms/step -> {out / 'governor' / 'governor_demo.json'}"
    )
