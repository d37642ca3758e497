"""Estimator baselines for `benchmarks/accuracy.py`: params-only and Korthikanti et al.

- params-only: weights + gradients + optimizer state (P x (2 + k), k = 2 Adam, 1 SGD
  momentum, 0 Adafactor, two 1-byte states per parameter for 8-bit AdamW), as the
  accelerate / DeepSpeed estimators do;
- korthikanti (transformer families): model state + per layer s*b*h*(34 + 5*a*s/h) bytes
  (16-bit activations; x2 in fp32; checkpointed layers keep only their 2*s*b*h input).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from memgnn.training.data import Dataset

TRANSFORMERS = {"gpt2", "llama", "bert", "t5", "vit", "mixtral", "varlen", "early-exit", "moe",
                "layerdrop"}  # fmt: skip
OPT_STATES = {"adam": 2, "adamw": 2, "sgd": 1, "adafactor": 0}


def baselines(data: Dataset, corpus: str) -> dict[str, np.ndarray]:
    """Per record: params-only and Korthikanti estimates (bytes; NaN where n/a)."""
    from memgnn.dataset.corpus import Corpus
    from memgnn.predictor.ir.recorder import CATEGORIES

    records = {r["job_id"]: r for r in Corpus(corpus).records()}
    corpus_ = Corpus(corpus)
    param_bytes: dict[str, float] = {}
    params_only = np.zeros(len(data))
    korth = np.full(len(data), np.nan)
    for i, (gid, path) in enumerate(data.keys):
        r = records[data.job_id[i]]
        if gid not in param_bytes:
            g = corpus_.graph(gid)
            p = g.paths[path]
            nb = g.storage_bytes(path, g.resolve_sizes(dict(g.symbols), "balanced"))
            cat = np.asarray(p.storages["category"])
            alloc = np.asarray(p.storages["alloc"])
            param_bytes[gid] = float(nb[(cat == CATEGORIES.index("parameter")) & (alloc < 0)].sum())
        pb = param_bytes[gid]
        state = pb * (2 + _opt_states(r["train"]))
        params_only[i] = state
        if r["family"] in TRANSFORMERS:
            korth[i] = state + _korthikanti(r)
    return {"params-only": params_only, "korthikanti": korth}


def _opt_states(train: dict[str, Any]) -> float:
    """Optimizer state in units of the parameter bytes."""
    if train["optimizer"] == "adamw8bit":  # two uint8 states per parameter
        return 2.0 / (2 if train["precision"] in ("bf16", "fp16") else 4)
    return OPT_STATES[train["optimizer"]]


def _korthikanti(r: dict[str, Any]) -> float:
    hp, sizes, train = r["hparams"], r["sizes"], r["train"]
    b, h, a, layers = sizes["B"], hp["hidden"], hp["heads"], hp["layers"]
    if r["family"] == "vit":
        seqs = [(hp["image"] // hp["patch"]) ** 2 + 1]
    elif r["family"] == "t5":
        seqs = [sizes["S"], sizes["T"]]
    else:
        seqs = [sizes["S"]]
    scale = 2.0 if train["precision"] == "fp32" else 1.0
    ckpt = train["checkpointing"]
    n_ckpt = (
        layers if ckpt == "full" else int(ckpt.split(":")[1]) if ckpt.startswith("blocks") else 0
    )
    total = 0.0
    for s in seqs:
        per_layer = s * b * h * (34 + 5 * a * s / h)
        kept = (layers - n_ckpt) * per_layer + n_ckpt * 2 * s * b * h
        total += scale * (kept + (per_layer if n_ckpt else 0))
    return total
