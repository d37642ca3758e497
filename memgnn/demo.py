"""`memgnn demo`: the end-to-end job on an embedded default, CPU only, a few minutes.

1. capture one training step of a small GPT-2 (transformers, built offline) with symbolic
   batch and sequence sizes, and save it;
2. evaluate that one capture at several sizes, far from the trace size too (the analytic
   liveness sweep, tensor bytes);
3. ground truth: simulate the CUDA caching allocator for an H100 at one size, and check the
   simulator against a real CPU run at a small size;
4. predict with the shipped model (the analytic baseline where none ships) next to the
   simulated value;
5. start the HTTP service on loopback, ask `/predict` and `/plan`, stop it;
6. a short governed training run on a memory-capped emulated device with variable-length
   batches: the decisions it made and the OOMs it avoided.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from memgnn.display import fmt_bytes, print_table

log = logging.getLogger(__name__)

DEMO_MODEL = "gpt2"
DEMO_ARGS = {"layers": 2, "hidden": 128, "heads": 4, "vocab": 1000}


def run_demo(out: Path) -> int:
    from dataset.profile import ProfileConfig, profile
    from dataset.zoo import make_bundle
    from predictor.analytic import sweep
    from predictor.capture import capture
    from predictor.spec import TrainSpec

    out.mkdir(parents=True, exist_ok=True)
    bundle = make_bundle(DEMO_MODEL, DEMO_ARGS)
    train = TrainSpec(optimizer="adamw")
    print(f"== 1. capture {bundle.name} {bundle.hparams} ({train.optimizer}, {train.precision})")
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
    for b, s in [(1, 32), (8, 128), (32, 512), (64, 2048)]:
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
    return 0
