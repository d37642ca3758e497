"""`memgnn models`: the catalog's counts, checked."""

import json

import pytest

from memgnn.cli import main


def test_models_lists_catalog_counts_and_checks_them(capsys):
    pytest.importorskip("transformers")
    assert main(["models", "opt-125m", "pythia-70m", "--check", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert set(rows) == {"facebook/opt-125m", "EleutherAI/pythia-70m"}
    assert rows["facebook/opt-125m"]["params"] == 125_239_296
    assert rows["facebook/opt-125m"]["class"] == "OPTForCausalLM"
    assert all(r["params_match"] for r in rows.values())
    assert main(["models", "no-such-model"]) == 2
    assert "no catalog model matches" in capsys.readouterr().err
