"""The training loop: graph-batched epochs, early stopping, checkpoints, calibration.

Graphs are PyG `Data` objects batched by PyG's `DataLoader` (`GraphSet`). Two phases.
Joint: each step takes a few graphs and every training query on them, so a graph is
encoded once per epoch however many (size, device, config) records it has. Head: the
best encoder is frozen, its embeddings cached, and the head alone trained for many cheap
epochs (message passing over ~10^5-10^6 nodes dominates a joint epoch on a CPU). Early
stopping watches the validation loss across both phases; the best weights win. The
checkpoint written after every epoch holds the model, optimizer, best weights,
early-stopping state, phase and history; `fit` started again with the same checkpoint
path continues from the epoch after it.
"""

from __future__ import annotations

import copy
import logging
import math
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from memgnn.predictor.ir.vocab import METRICS
from memgnn.predictor.memory.gnn import GNNConfig, MemoryGNN, memory_loss
from memgnn.training.data import Dataset, error_summary
from memgnn.training.fit_config import FitConfig
from torch_geometric.data import Batch, Data
from torch_geometric.loader import DataLoader

log = logging.getLogger(__name__)


class GraphSet:
    """The graph paths of a Dataset as PyG `Data` objects, batched by PyG's `DataLoader`.

    `graphs[i]` holds `x` and `edge_index` of graph path `keys[i]`. `loader` yields
    `torch_geometric.data.Batch`es of graphs that carry their queries: per graph the
    records `rows` scored on it and their query features `q`, with `q_batch` (PyG's
    `follow_batch`) naming each query's graph within the batch."""

    def __init__(self, data: Dataset):
        self.keys = list(data.graphs)
        self.index = {k: i for i, k in enumerate(self.keys)}
        self.graphs = [
            Data(x=torch.from_numpy(g.x), edge_index=torch.from_numpy(g.edge_index),
                 num_nodes=g.num_nodes)
            for g in data.graphs.values()
        ]  # fmt: skip

    def with_queries(self, data: Dataset, groups: dict[int, np.ndarray]) -> dict[int, Data]:
        """Per graph index in `groups`: its Data with the query rows `groups[g]` attached."""
        out = {}
        for g, rows in groups.items():
            base = self.graphs[g]
            q = torch.from_numpy(data.q[rows])
            out[g] = Data(x=base.x, edge_index=base.edge_index, num_nodes=base.num_nodes,
                          q=q, rows=torch.from_numpy(rows))  # fmt: skip
        return out

    @staticmethod
    def loader(items: list[Data], batch_size: int) -> DataLoader:
        """Batches of `items` in the given order (shuffling is the caller's, seeded)."""
        return DataLoader(items, batch_size=batch_size, shuffle=False, follow_batch=["q"])


def _by_graph(data: Dataset, graphs: GraphSet, idx: np.ndarray) -> dict[int, np.ndarray]:
    out: dict[int, list[int]] = {}
    for i in idx:
        out.setdefault(graphs.index[data.keys[i]], []).append(int(i))
    return {g: np.array(v, dtype=np.int64) for g, v in out.items()}


def _run(model: MemoryGNN, batch: Batch) -> tuple[torch.Tensor, np.ndarray]:
    """Outputs [queries, 6] of a batch with queries, and the record rows they score."""
    return model(batch.x, batch.edge_index, batch.batch, batch.q, batch.q_batch), batch.rows.numpy()


def _batches(graphs: GraphSet, items: dict[int, Data], ids: list[int], size: int):
    return graphs.loader([items[g] for g in ids], size)


@torch.no_grad()
def predict_log(model: MemoryGNN, data: Dataset, idx: np.ndarray, graphs: GraphSet | None = None):
    """(mu, upper) in log space, [len(idx), 3] each, in the order of `idx`."""
    graphs = graphs or GraphSet(data)
    model.eval()
    groups = _by_graph(data, graphs, idx)
    out = np.zeros((len(idx), 6), dtype=np.float64)
    pos = {int(i): k for k, i in enumerate(idx)}
    for batch in _batches(graphs, graphs.with_queries(data, groups), list(groups), 16):
        res, rows = _run(model, batch)
        out[[pos[int(r)] for r in rows]] = res.numpy()
    return out[:, :3], out[:, 3:]


def evaluate(model: MemoryGNN, data: Dataset, idx: np.ndarray, graphs=None) -> dict[str, Any]:
    """Error summaries on `idx`: per label source and metric, plus `primary` (reserved on
    GPU profiles, allocated on the CPU)."""
    if len(idx) == 0:
        return {}
    mu, upper = predict_log(model, data, idx, graphs)
    pred, bound = data.analytic[idx] * np.exp(mu), data.analytic[idx] * np.exp(upper)
    return summarize(data, idx, pred, bound)


def summarize(data: Dataset, idx: np.ndarray, pred: np.ndarray, bound: np.ndarray) -> dict:
    """Error summaries of answers `pred` (bounds `bound`, rows of `idx`) per label source
    and metric, plus `primary` (reserved on GPU profiles, allocated on the CPU)."""
    meas = data.measured[idx]
    prim = data.primary_metric()[idx]
    rows = np.arange(len(idx))
    out: dict[str, Any] = {
        "primary": error_summary(pred[rows, prim], bound[rows, prim], meas[rows, prim])
    }
    sources = np.array(data.source)[idx]
    for src in sorted(set(sources)):
        sel = sources == src
        for m, name in enumerate(METRICS):
            s = error_summary(pred[sel, m], bound[sel, m], meas[sel, m])
            if s["n"]:
                out[f"{src}/{name}"] = s
    return out


def fit(
    data: Dataset,
    train_idx: np.ndarray,
    val_idx: np.ndarray,
    gnn: GNNConfig,
    cfg: FitConfig,
    *,
    checkpoint: Path | None = None,
    on_epoch: Callable[[int, dict[str, float]], None] | None = None,
    progress: bool = False,
) -> tuple[MemoryGNN, list[dict[str, float]]]:
    """Train (joint phase, then head phase), early stopping on validation loss; returns
    the best model and the per-epoch history."""
    torch.manual_seed(cfg.seed)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    model = MemoryGNN(gnn)
    graphs = GraphSet(data)
    model.head.set_normalization(torch.from_numpy(data.q[train_idx]))
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    state = {"phase": "joint", "epoch": 0, "best": math.inf, "best_epoch": 0, "bad": 0,
             "history": []}  # fmt: skip
    best = {k: v.clone() for k, v in model.state_dict().items()}
    ck = torch.load(checkpoint, weights_only=False) if checkpoint and checkpoint.is_file() else None
    head_ck = None  # a checkpoint written in the head phase holds the head's optimizer
    if ck is not None:
        model.load_state_dict(ck["model"])
        best, state = ck["best_weights"], copy.deepcopy(ck["state"])
        head_ck = ck if state["phase"] == "head" else None
        if state["phase"] == "joint":
            opt.load_state_dict(ck["optimizer"])
        log.info("resumed from %s after epoch %d (%s phase)", checkpoint, state["epoch"],
                 state["phase"])  # fmt: skip
    groups = _by_graph(data, graphs, train_idx), _by_graph(data, graphs, val_idx)
    train_items = graphs.with_queries(data, groups[0])
    y = torch.from_numpy(np.nan_to_num(data.y, nan=0.0))
    mask = torch.from_numpy(~np.isnan(data.y))
    bar = _progress(progress, cfg.max_epochs + cfg.head_epochs, state["epoch"])

    def end_epoch(row: dict[str, float], opt_state: dict) -> None:
        nonlocal best
        if row["val_fit"] < state["best"] - 1e-6:
            state.update(best=row["val_fit"], best_epoch=row["epoch"], bad=0)
            best = {k: v.clone() for k, v in model.state_dict().items()}
        else:
            state["bad"] += 1
        state["epoch"] = row["epoch"]
        state["history"].append(row)
        if checkpoint is not None:
            _save(checkpoint, model, opt_state, best, state)
        if on_epoch is not None:
            on_epoch(row["epoch"], row)
        log.info("epoch %d (%s) train %.4f val %.4f (best %.4f @%d) %.1fs", row["epoch"],
                 state["phase"], row["train_loss"], row["val_fit"], state["best"],
                 state["best_epoch"], row["seconds"])  # fmt: skip
        if bar is not None:
            bar.update(1)
            bar.set_postfix(phase=state["phase"], val=f"{row['val_fit']:.4f}",
                            best=state["best_epoch"])  # fmt: skip

    while (
        state["phase"] == "joint"
        and state["epoch"] < cfg.max_epochs
        and state["bad"] < cfg.patience
    ):
        t0 = time.perf_counter()
        model.train()
        ids = list(groups[0])
        np.random.default_rng([cfg.seed, state["epoch"] + 1]).shuffle(ids)
        total = n = 0.0
        for batch in _batches(graphs, train_items, ids, cfg.graphs_per_batch):
            out, rows = _run(model, batch)
            loss, _ = memory_loss(out, y[rows], mask[rows], gnn.quantile)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            opt.step()
            total, n = total + loss.item() * len(rows), n + len(rows)
        val = _val_loss(model, data, graphs, groups[1], y, mask, gnn.quantile)
        end_epoch({"epoch": state["epoch"] + 1, "train_loss": total / max(n, 1), **val,
                   "seconds": time.perf_counter() - t0}, opt.state_dict())  # fmt: skip
    if state["phase"] == "joint":  # switch: best encoder frozen, head trained on its output
        model.load_state_dict(best)
        state.update(phase="head", bad=0, head_start=state["epoch"])
        if checkpoint is not None:
            _save(checkpoint, model, {}, best, state)
    if cfg.head_epochs:
        _head_phase(model, data, graphs, groups, y, mask, gnn, cfg, state, head_ck, end_epoch)
    if bar is not None:
        bar.close()
    model.load_state_dict(best)
    model.eval()
    return model, state["history"]


def _head_phase(model, data, graphs, groups, y, mask, gnn, cfg, state, ck, end_epoch) -> None:
    """Head-only epochs over cached embeddings of the frozen (best) encoder."""
    emb = _embeddings(model, graphs, sorted(set(groups[0]) | set(groups[1])))
    head = model.head
    opt = torch.optim.AdamW(head.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    if ck is not None and ck["optimizer"]:
        opt.load_state_dict(ck["optimizer"])
    rec_graph = np.array([graphs.index[k] for k in data.keys])
    train = np.concatenate(list(groups[0].values()))
    val = np.concatenate(list(groups[1].values())) if groups[1] else np.zeros(0, dtype=np.int64)
    q = torch.from_numpy(data.q)
    last = state["head_start"] + cfg.head_epochs
    while state["epoch"] < last and state["bad"] < cfg.head_patience:
        t0 = time.perf_counter()
        head.train()
        order = np.random.default_rng([cfg.seed, state["epoch"] + 1]).permutation(train)
        total = 0.0
        for start in range(0, len(order), 256):
            rows = order[start : start + 256]
            out = head(emb[rec_graph[rows]], q[rows])
            loss, _ = memory_loss(out, y[rows], mask[rows], gnn.quantile)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total += loss.item() * len(rows)
        head.eval()
        with torch.no_grad():
            if len(val):
                loss, fit_part = memory_loss(head(emb[rec_graph[val]], q[val]), y[val],
                                             mask[val], gnn.quantile)  # fmt: skip
                v = {"val_loss": loss.item(), "val_fit": fit_part.item()}
            else:
                v = {"val_loss": math.nan, "val_fit": math.nan}
        end_epoch({"epoch": state["epoch"] + 1, "train_loss": total / max(len(order), 1), **v,
                   "seconds": time.perf_counter() - t0}, opt.state_dict())  # fmt: skip


@torch.no_grad()
def _embeddings(model: MemoryGNN, graphs: GraphSet, ids: list[int]) -> torch.Tensor:
    model.eval()
    emb = torch.zeros(len(graphs.keys), model.encoder.out_dim)
    loader = graphs.loader([graphs.graphs[g] for g in ids], 16)
    for start, batch in zip(range(0, len(ids), 16), loader, strict=True):
        chunk = ids[start : start + 16]
        emb[chunk] = model.encoder(batch.x, batch.edge_index, batch.batch, batch.num_graphs)
    return emb


@torch.no_grad()
def _val_loss(model, data, graphs, groups, y, mask, quantile) -> dict[str, float]:
    if not groups:
        return {"val_loss": math.nan, "val_fit": math.nan}
    model.eval()
    total = fit_total = n = 0.0
    for batch in _batches(graphs, graphs.with_queries(data, groups), list(groups), 16):
        out, rows = _run(model, batch)
        loss, fit_part = memory_loss(out, y[rows], mask[rows], quantile)
        total += float(loss) * len(rows)
        fit_total += float(fit_part) * len(rows)
        n += len(rows)
    return {"val_loss": total / n, "val_fit": fit_total / n}


def _save(path: Path, model, opt_state: dict, best_weights, state) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save({"model": model.state_dict(), "optimizer": opt_state,
                "best_weights": best_weights, "state": state}, tmp)  # fmt: skip
    tmp.replace(path)


def _progress(enabled: bool, total: int, initial: int):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, desc="train", unit="epoch", leave=True)


def fit_config_dict(cfg: FitConfig) -> dict[str, Any]:
    return asdict(cfg)
