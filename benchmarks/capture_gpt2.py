"""GPT-2 small (124M, 12 layers) with AdamW: symbolic capture time and node count, and the
`sim` backend at batch 8, seq 1024 (wall time, peaks, breakdown).

    .venv/bin/python benchmarks/capture_gpt2.py   # writes benchmarks/results/gpt2_small.json
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from memgnn.dataset.profile import ProfileConfig, profile
from memgnn.predictor.capture.capture import capture
from memgnn.predictor.memory.analytic import sweep
from memgnn.predictor.spec.train import TrainSpec
from memgnn.predictor.zoo import make_bundle

GPT2_SMALL = {"layers": 12, "hidden": 768, "heads": 12, "vocab": 50257, "max_positions": 1024}
OUT = Path(__file__).parent / "results" / "gpt2_small.json"


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    bundle = make_bundle("gpt2", GPT2_SMALL)
    n_params = sum(p.numel() for p in bundle.build().parameters())
    train = TrainSpec.of(optimizer="adamw")
    t0 = time.perf_counter()
    graph = capture(bundle, train)
    capture_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    swept = sweep(graph, {"B": 8, "S": 1024})
    sweep_s = time.perf_counter() - t0
    sim = profile(
        bundle, train, {"B": 8, "S": 1024}, ProfileConfig(backend="sim", device="a100-80gb")
    )
    result = {
        "model": "gpt2-small (transformers GPT2LMHeadModel, from_config)",
        "parameters": n_params,
        "symbolic_capture": {
            "seconds": round(capture_s, 2),
            "nodes": graph.paths[0].num_nodes,
            "storages": graph.paths[0].num_storages,
            "edges": int(graph.paths[0].edges().shape[1]),
        },
        "analytic_sweep_B8_S1024": {
            "seconds": round(sweep_s, 4),
            "peak_tensor_bytes": swept.peak_bytes,
            "breakdown": swept.best.breakdown,
        },
        "sim_a100_80gb_B8_S1024": {
            "seconds": sim.seconds,
            "peak_allocated_bytes": sim.peak_allocated_bytes,
            "peak_reserved_bytes": sim.peak_reserved_bytes,
            "device_total_bytes": sim.device_total_bytes,
            "breakdown": {
                k: sim.breakdown[k] for k in ("categories", "first_step", "steady_state", "phases")
            },
            "stats": sim.stats,
        },
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
