"""The demo's learning step end to end, on fewer jobs than the demo uses."""

from __future__ import annotations

import json

from memgnn.demo_learn import HELD_OUT, learn_step


def test_learn_step_builds_trains_registers_exports_and_predicts(tmp_path, capsys):
    learn_step(tmp_path, jobs=24, rows=2)
    out = capsys.readouterr().out
    assert "held-out config" in out and "demo model" in out and "analytic" in out
    model = tmp_path / "training" / "model"
    assert (model / "encoder.onnx").is_file() and (model / "head.onnx").is_file()
    card = json.loads((model / "model_card.json").read_text())
    assert card["holdout_families"] == [HELD_OUT]
    assert card["mlflow"]["alias"] == "champion" and (tmp_path / "training" / "mlflow.db").is_file()
    # a second run resumes: nothing profiled again, the finished training is reused
    learn_step(tmp_path, jobs=24, rows=2)
    assert "(0 profiled now" in capsys.readouterr().out
