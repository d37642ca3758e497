"""A tiny corpus (two zoo families, sim + real cpu rows) shared by the training tests."""

from __future__ import annotations

import pytest

TINY = {
    "mlp": {"features": 128, "hidden": 256, "layers": 2, "classes": 10},
    "lstm": {"vocab": 512, "hidden": 128, "layers": 1},
}
CAPS = {"max_tokens": 256, "max_batch": 8, "max_static_seq": 16}


@pytest.fixture(scope="session")
def tiny_corpus(tmp_path_factory):
    from memgnn.dataset.build import BuildConfig, build_corpus

    root = tmp_path_factory.mktemp("corpus")
    common = dict(out=root, families=list(TINY), hparams=TINY, caps=CAPS, progress=False)
    build_corpus(BuildConfig(size=8, backend="sim", devices=["a100-80gb", "h100-80gb"],
                             sizes_per_config=2, **common))  # fmt: skip
    build_corpus(BuildConfig(size=4, backend="cpu", sizes_per_config=2, **common))
    return root
