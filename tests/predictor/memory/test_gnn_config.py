"""GNNConfig: validation, and that it imports without torch-geometric."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from memgnn.predictor.memory.gnn_config import GNNConfig

ROOT = Path(__file__).resolve().parents[3]


def test_config_validation():
    for bad in ({"hidden": 0}, {"quantile": 0.3}, {"dropout": 1.0}, {"layers": -1}):
        with pytest.raises(ValueError):
            GNNConfig(**bad)
    assert GNNConfig(hidden=8).to_dict()["hidden"] == 8


def test_the_cli_parser_does_not_import_torch_geometric():
    # every `memgnn` command builds the parser, `train`'s included: importing
    # torch-geometric there cost seconds per command
    code = ("import sys, memgnn.cli as c; c.build_parser(); "
            "assert 'torch_geometric' not in sys.modules, 'torch_geometric imported'")  # fmt: skip
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         env={"PYTHONPATH": str(ROOT), "PATH": ""}, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
