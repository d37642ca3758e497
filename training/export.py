"""Export a trained MemoryGNN to ONNX (encoder.onnx + head.onnx) with its model card.

The encoder is exported through `GraphEncoder.forward_csr` (prefix-sum aggregation, no
scatter) with dynamic node and edge counts; the head with a dynamic query count. Weights
are embedded (no `.onnx.data`). After export both files are run in onnxruntime and
compared with PyTorch on real inputs; a mismatch beyond rtol 1e-4 raises.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from memgnn.predictor.memory.features import (
    FEATURE_SCHEMA_VERSION,
    NUM_NODE_FEATURES,
    NUM_QUERY_FEATURES,
    GraphInputs,
)
from memgnn.predictor.memory.gnn import MemoryGNN
from torch import nn

log = logging.getLogger(__name__)

CARD_FORMAT = "memgnn.model_card"
ENCODER_INPUTS = ("x", "in_src", "in_ptr", "out_dst", "out_ptr")
HEAD_INPUTS = ("embedding", "query")
OPSET = 17


class _CsrEncoder(nn.Module):
    def __init__(self, model: MemoryGNN):
        super().__init__()
        self.encoder = model.encoder

    def forward(self, x, in_src, in_ptr, out_dst, out_ptr):
        return self.encoder.forward_csr(x, in_src, in_ptr, out_dst, out_ptr)


def encoder_feed(inputs: GraphInputs) -> dict[str, np.ndarray]:
    return dict(zip(ENCODER_INPUTS, (inputs.x, *inputs.csr())))


def export_onnx(
    model: MemoryGNN, sample: GraphInputs, out_dir: Path, *, exporter: str = "legacy"
) -> dict[str, Any]:
    """Write encoder.onnx and head.onnx into out_dir; returns export facts for the card."""
    if exporter not in ("legacy", "dynamo"):
        raise ValueError(f"exporter must be legacy or dynamo, got {exporter!r}")
    out_dir.mkdir(parents=True, exist_ok=True)
    model.eval()
    feed = encoder_feed(sample)
    args = tuple(torch.from_numpy(v) for v in feed.values())
    q = torch.zeros(3, NUM_QUERY_FEATURES)
    with torch.no_grad():
        emb = _CsrEncoder(model)(*args)
        head_args = (emb.expand(3, -1).contiguous(), q)
    t0 = time.perf_counter()
    enc_dims = {"x": {0: "nodes"}, "in_src": {0: "edges"}, "in_ptr": {0: "nodes1"},
                "out_dst": {0: "edges"}, "out_ptr": {0: "nodes1"}}  # fmt: skip
    head_dims = {"embedding": {0: "queries"}, "query": {0: "queries"}, "out": {0: "queries"}}
    _export(_CsrEncoder(model), args, out_dir / "encoder.onnx", ENCODER_INPUTS, ("embedding",),
            enc_dims, exporter)  # fmt: skip
    _export(
        model.head, head_args, out_dir / "head.onnx", HEAD_INPUTS, ("out",), head_dims, exporter
    )
    seconds = time.perf_counter() - t0
    check = verify_onnx(model, sample, out_dir)
    return {
        "encoder": "encoder.onnx",
        "head": "head.onnx",
        "exporter": exporter,
        "opset": OPSET if exporter == "legacy" else 18,
        "encoder_inputs": list(ENCODER_INPUTS),
        "head_inputs": list(HEAD_INPUTS),
        "embedding_dim": int(emb.shape[1]),
        "export_seconds": round(seconds, 2),
        "ort_max_rel_error": check,
    }


def _export(module, args, path: Path, names, outputs, dims, exporter: str) -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "legacy":
            torch.onnx.export(module, args, str(path), input_names=list(names),
                              output_names=list(outputs), dynamic_axes=dims, opset_version=OPSET,
                              dynamo=False)  # fmt: skip
        else:
            from torch.export import Dim

            shapes = {n: {ax: Dim(label) for ax, label in dims[n].items()} for n in names}
            torch.onnx.export(module, args, str(path), input_names=list(names),
                              output_names=list(outputs), dynamic_shapes=shapes, dynamo=True,
                              opset_version=18, external_data=False)  # fmt: skip
    data_file = path.with_name(path.name + ".data")
    if data_file.exists():
        raise RuntimeError(f"{path}: exporter wrote external weights ({data_file.name})")


def ort_session(path: Path):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1  # deterministic and fastest for these small graphs
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def verify_onnx(
    model: MemoryGNN, sample: GraphInputs, out_dir: Path, rtol: float = 1e-4, atol: float = 1e-5
) -> float:
    """Run both ONNX files in onnxruntime against PyTorch; raise unless every output is
    within atol + rtol * |torch|. Returns the largest |ort - torch| / (|torch| + atol/rtol)."""
    feed = encoder_feed(sample)
    with torch.no_grad():
        ref_emb = _CsrEncoder(model)(*(torch.from_numpy(v) for v in feed.values())).numpy()
    emb = ort_session(out_dir / "encoder.onnx").run(None, feed)[0]
    rng = np.random.default_rng(0)
    q = (rng.normal(size=(4, NUM_QUERY_FEATURES)) * model.head.q_std.numpy()
         + model.head.q_mean.numpy()).astype(np.float32)  # fmt: skip
    e4 = np.repeat(emb, 4, axis=0)
    with torch.no_grad():
        ref_out = model.head(torch.from_numpy(e4), torch.from_numpy(q)).numpy()
    out = ort_session(out_dir / "head.onnx").run(None, {"embedding": e4, "query": q})[0]
    worst = 0.0
    for a, b in ((emb, ref_emb), (out, ref_out)):
        if not np.allclose(a, b, rtol=rtol, atol=atol):
            diff = float(np.max(np.abs(a - b)))
            raise RuntimeError(f"onnxruntime disagrees with PyTorch: max abs diff {diff:.2e}")
        worst = max(worst, float(np.max(np.abs(a - b) / (np.abs(b) + atol / rtol))))
    return worst


def weights_hash(model: MemoryGNN) -> str:
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().cpu().numpy().tobytes())
    return h.hexdigest()


def write_card(out_dir: Path, card: dict[str, Any]) -> Path:
    card = {"format": CARD_FORMAT, "feature_schema_version": FEATURE_SCHEMA_VERSION,
            "num_node_features": NUM_NODE_FEATURES,
            "num_query_features": NUM_QUERY_FEATURES} | card  # fmt: skip
    path = out_dir / "model_card.json"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(card, indent=2, sort_keys=True, default=_jsonable))
    tmp.replace(path)
    return path


def _jsonable(v: Any) -> Any:
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, Path):
        return str(v)
    raise TypeError(f"not JSON serialisable: {type(v).__name__}")
