"""A tiny corpus (two zoo families, sim + real cpu rows) shared by the training tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_corpus(tmp_path_factory):
    from training.make_corpus import CorpusPlan, build

    root = tmp_path_factory.mktemp("corpus")
    plan = CorpusPlan(configs=1, sizes=2, devices=2, cpu_configs=1, families=["mlp", "lstm"],
                      sample_hparams=False)  # fmt: skip
    build(root, plan, workers=0, cache=str(root / ".cache"))
    return root
