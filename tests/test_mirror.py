"""Every library module has a test module of the same name, or stands on the allowlist below.

`predictor/plan/search.py` is tested by `tests/predictor/test_plan.py`; a package's module
`serving/governor/policy.py` by `tests/serving/governor/test_policy.py` or
`tests/serving/test_governor_policy.py`. The allowlist is frozen: each entry says where the
module is tested instead. A new module without a test module fails here; so does an
allowlisted module that gained one (take it off the list).
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("predictor", "dataset", "training", "serving", "memgnn")

# module -> the test modules (under tests/) that exercise it instead; frozen: do not add
# to it without a reason
ALLOWLIST: dict[str, str] = {
    "predictor.ir.pathgraph": "predictor/ir/test_graph.py, test_recorder.py (per-path view)",
    "predictor.memory.base": "predictor/memory/test_trust.py, predictor/capture/test_query.py",
    "predictor.ir.vocab": "predictor/memory/test_analytic.py, test_features.py",
    "predictor.sim.blocks": "predictor/sim/test_allocator.py (blocks and pools through the rules)",
    "predictor.sim.expandable": "predictor/sim/test_allocator.py (expandable-segment rules)",
    "dataset.cpu_backend": "dataset/test_profile.py (backend cpu), predictor/emulate/test_lora.py",
    "dataset.executors": "dataset/test_build.py",
    "dataset.record": "dataset/test_corpus.py, test_stats.py",
    "predictor.sim.replay.api": "predictor/sim/test_allocator_fast.py (compiled vs Python)",
    "predictor.sim.replay.core": "predictor/sim/test_allocator_fast.py (compiled vs Python)",
    "predictor.sim.replay.events": "predictor/sim/test_allocator_fast.py",
    "predictor.sim.replay.trace": "predictor/answer/test_exact.py",
    "predictor.sim.simulate": "dataset/test_profile.py, predictor/answer/test_exact.py",
    "predictor.snapshot.conf": "predictor/snapshot/test_snapshot_replay.py (--alloc-conf parsing)",
    "predictor.snapshot.plot": "predictor/snapshot/test_export.py, memgnn/test_snapshot_cli.py",
    "predictor.snapshot.whatif": "predictor/snapshot/test_snapshot_replay.py",
    "predictor.zoo.dynamic": "predictor/zoo/test_zoo.py (every zoo family captured)",
    "predictor.zoo.hf_families": "predictor/zoo/test_zoo.py (every zoo family captured)",
    "predictor.zoo.layers": "predictor/zoo/test_zoo.py (every zoo family captured)",
    "predictor.zoo.recurrent": "predictor/zoo/test_zoo.py, predictor/emulate/test_kernels.py",
    "predictor.zoo.registry": "predictor/zoo/test_zoo.py",
    "predictor.zoo.resolve": "predictor/zoo/test_zoo.py, memgnn/test_cli_user_errors.py",
    "predictor.zoo.transformers_inhouse": "predictor/zoo/test_zoo.py (every zoo family captured)",
    "predictor.zoo.vision": "predictor/zoo/test_zoo.py (every zoo family captured)",
    "training.export": "predictor/memory/test_onnx_model.py, test_gnn.py (PyG vs ONNX)",
    "training.fit": "training/test_train.py, predictor/memory/test_gnn.py",
    "training.pyfunc": "training/test_train.py (the mlflow pyfunc model)",
    "memgnn.cli.ship": "its steps: dataset/test_build.py, training/test_train.py",
    "training.tracking": "training/test_train.py",
    "serving.app": "serving/test_api*.py, through the HTTP API",
    "serving.server": "serving/test_client.py, serving/test_api_captures.py (SIGTERM)",
    "serving.config": "serving/test_api*.py, through the HTTP API",
    "serving.deps": "serving/test_api*.py, through the HTTP API",
    "serving.engine": "serving/test_api*.py, through the HTTP API",
    "serving.errors": "serving/test_api_safety.py (422 vs 500)",
    "serving.governor.batching": "serving/governor/test_core.py",
    "serving.governor.build": "serving/governor/test_core.py",
    "serving.governor.checks": "serving/governor/test_loop.py",
    "serving.governor.config": "serving/governor/test_policy.py",
    "serving.governor.correction": "serving/governor/test_core.py, test_policy.py",
    "serving.governor.cuda": "serving/governor/test_governor_devices.py (a faked torch.cuda)",
    "serving.governor.demo": "serving/governor/test_core.py (the demo workload)",
    "serving.governor.graphs": "serving/governor/test_core.py",
    "serving.governor.integrations.hf": "serving/governor/test_integrations.py",
    "serving.governor.integrations.lightning": "serving/governor/test_integrations.py",
    "serving.governor.integrations.monitor": "serving/governor/test_integrations.py",
    "serving.governor.observe": "serving/governor/test_core.py",
    "serving.governor.runtime": "serving/governor/test_alerts.py",
    "serving.graphs": "serving/test_api_fuzz.py, test_checks.py",
    "serving.metrics": "serving/test_api*.py, through the HTTP API",
    "serving.middleware": "serving/test_api_safety.py (body limits)",
    "serving.planning": "serving/test_api*.py, through the HTTP API",
    "serving.predicting": "serving/test_api*.py, through the HTTP API",
    "serving.routes.admin": "serving/test_api*.py, through the HTTP API",
    "serving.routes.graphs": "serving/test_api*.py, through the HTTP API",
    "serving.routes.health": "serving/test_api*.py, through the HTTP API",
    "serving.routes.plan": "serving/test_api*.py, through the HTTP API",
    "serving.routes.predict": "serving/test_api*.py, through the HTTP API",
    "serving.routes.samples": "serving/test_api_samples.py",
    "serving.routes.snapshots": "serving/test_snapshots_route.py",
    "serving.schemas": "serving/test_api*.py, through the HTTP API",
    "memgnn.cli.options": "predictor/spec/test_options.py, memgnn/cli/test_user_errors.py",
    "memgnn.demo": "memgnn/test_demo_learn.py; the README's demo command runs it whole",
    "memgnn.cli.__main__": "predictor/sim/replay/test_cost.py runs python -m memgnn.cli",
    "memgnn.cli.demo": "the README's demo command runs it; memgnn/test_demo_learn.py",
}


def _library_modules() -> list[str]:
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.name == "__init__.py":
                continue
            found.append(".".join(path.relative_to(ROOT).with_suffix("").parts))
    return found


def _test_candidates(module: str) -> list[Path]:
    parts = module.split(".")
    name = parts[-1]
    folder = ROOT / "tests" / Path(*parts[:-1])
    flat = ROOT / "tests" / parts[0] / f"test_{'_'.join(parts[1:])}.py"
    found = [folder / f"test_{name}.py", flat]
    if (
        len(parts) > 2
    ):  # serving.governor.devices -> tests/serving/governor/test_governor_devices.py
        found.append(folder / f"test_{parts[-2]}_{name}.py")
    return found


def test_every_library_module_has_a_test_module():
    missing = [
        m
        for m in _library_modules()
        if m not in ALLOWLIST and not any(p.is_file() for p in _test_candidates(m))
    ]
    assert missing == [], "library modules without tests/.../test_<name>.py: " + ", ".join(missing)


def test_the_allowlist_names_only_untested_modules():
    modules = set(_library_modules())
    stale = [m for m in ALLOWLIST if m not in modules]
    tested = [m for m in ALLOWLIST if any(p.is_file() for p in _test_candidates(m))]
    assert stale == [] and tested == []
