"""The numbers of docs/how-to/your-own-step.md: the user's own step and a Trainer's.

1. A hand-written contrastive encoder (a forward hook keeps its features for a custom
   loss term; two forwards, InfoNCE, clipping, AdamW): `predict_step` on an A100-80GB,
   and on `cpu` against the same step function run for real (memgnn's CPU recorder).
2. A `transformers.Trainer` over SmolLM2-135M (its config from memgnn's catalog, the
   model built on the meta device: no weights) with gradient accumulation 2:
   `predict_trainer` on an A100-80GB, and on `cpu` at a small size against the Trainer's
   own step run for real.

    .venv/bin/python benchmarks/your_own_step.py
    # writes benchmarks/results/your_own_step.{json,md}
"""

from __future__ import annotations

import json
import logging
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from memgnn.dataset.cpu_backend import profile_cpu
from memgnn.predictor.answer.user_step import predict_step, predict_trainer
from memgnn.predictor.capture.hf_trainer import TrainerStep, no_weights, trainer_bundle
from memgnn.predictor.capture.user_step import UserStep, user_bundle
from memgnn.predictor.spec.train import TrainSpec
from results_io import write_results
from torch import nn

CATALOG = Path(__file__).resolve().parents[1] / "predictor/zoo/catalog"


# --- 1. the user's own step -------------------------------------------------------------
class Encoder(nn.Module):
    def __init__(self, d_in: int = 784, width: int = 2048, d_out: int = 256):
        super().__init__()
        self.body = nn.Sequential(
            nn.Linear(d_in, width), nn.GELU(), nn.Linear(width, width), nn.GELU()
        )
        self.head = nn.Linear(width, d_out)
        self.features = None
        self.body.register_forward_hook(self._keep)

    def _keep(self, module, args, out):
        self.features = out  # kept for the loss (and alive until the next forward)

    def forward(self, x):
        return self.head(self.body(x))


def info_nce_step(model, optimizer, batch):
    x1, x2 = batch  # two views of the same B samples
    z1 = F.normalize(model(x1), dim=1)
    feats = model.features
    z2 = F.normalize(model(x2), dim=1)
    logits = z1 @ z2.T / 0.1
    labels = torch.arange(z1.shape[0], device=z1.device)
    loss = F.cross_entropy(logits, labels) + 1e-4 * feats.pow(2).mean()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()


def make_views(B):  # noqa: N803 - the size's name
    return torch.randn(B, 784), torch.randn(B, 784)


def adamw(params):
    return torch.optim.AdamW(params, lr=3e-4)


def _row(answer) -> dict:
    (a,) = answer.predictions
    keep = ("categories", "tensor_peak_bytes", "phase", "assumptions")
    return {
        "device": a.device, "sizes": a.sizes, "method": a.method, "metric": a.metric,
        "predicted_peak_bytes": a.predicted_peak_bytes, "upper_bound_bytes": a.upper_bound_bytes,
        "breakdown": {k: a.breakdown[k] for k in keep if k in a.breakdown},
        "model": {k: a.model[k] for k in ("module_class", "parameters")} if a.model else None,
        "train": a.train, "predict_seconds": a.predict_seconds,
    }  # fmt: skip


def _real(real: dict) -> dict:
    return {"real_cpu_peak_bytes": real["peak_allocated_bytes"],
            "real_cpu_categories": real["breakdown"]["categories"]}  # fmt: skip


def own_step() -> dict:
    out: dict = {}
    t0 = time.perf_counter()
    gpu = predict_step(Encoder, info_nce_step, make_views, optimizer=adamw,
                       sizes={"B": 4096}, device="a100-80gb")  # fmt: skip
    out["a100"] = _row(gpu) | {"seconds": round(time.perf_counter() - t0, 1)}
    sizes = {"B": 512}
    cpu = predict_step(Encoder, info_nce_step, make_views, optimizer=adamw, sizes=sizes,
                       device="cpu")  # fmt: skip

    def make(target: str) -> UserStep:
        cpu = torch.device("cpu")
        return UserStep(Encoder, info_nce_step, make_views, adamw, device=cpu, target=target)

    real = profile_cpu(user_bundle(Encoder, sizes), TrainSpec(), sizes, make_step=make)
    out["cpu"] = _row(cpu) | _real(real)
    return out


# --- 2. a Trainer's step ----------------------------------------------------------------
def smollm_trainer(tmp: str, *, meta: bool):
    import transformers

    data = json.loads((CATALOG / "HuggingFaceTB__SmolLM2-135M.json").read_text())
    config = transformers.AutoConfig.for_model(data.pop("model_type"), **data)
    args = transformers.TrainingArguments(
        output_dir=tmp, per_device_train_batch_size=8, gradient_accumulation_steps=2,
        report_to=[], use_cpu=True,
    )  # fmt: skip
    if meta:
        with no_weights():
            model = transformers.AutoModelForCausalLM.from_config(config)
            return transformers.Trainer(model=model, args=args)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    return transformers.Trainer(model=model, args=args)


def trainer_step() -> dict:
    out: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        trainer = smollm_trainer(tmp, meta=True)
        t0 = time.perf_counter()
        gpu = predict_trainer(trainer, sizes={"B": 8, "S": 1024}, device="a100-80gb")
        out["a100"] = _row(gpu) | {"seconds": round(time.perf_counter() - t0, 1)}
        sizes = {"B": 1, "S": 32}
        cpu = predict_trainer(trainer, sizes=sizes, device="cpu")
        real_trainer = smollm_trainer(tmp, meta=False)
        runner = TrainerStep(real_trainer)
        try:
            bundle = trainer_bundle(real_trainer, sizes)
            model = real_trainer.model
            real = profile_cpu(bundle, TrainSpec(), sizes,
                               make_step=lambda t: runner.user_step(model, t))  # fmt: skip
        finally:
            runner.restore()
        out["cpu"] = _row(cpu) | _real(real)
    return out


def markdown(result: dict) -> str:
    lines = ["# The user's own step and a Trainer's (benchmarks/your_own_step.py)", "",
             f"torch {torch.__version__}", "",
             "| example | device | sizes | method | metric | predicted | bound | "
             "real CPU step |", "|---|---|---|---|---|---:|---:|---:|"]  # fmt: skip
    for name, rows in result["examples"].items():
        for row in rows.values():
            sizes = ", ".join(f"{k}={v}" for k, v in row["sizes"].items())
            real = row.get("real_cpu_peak_bytes")
            lines.append(
                f"| {name} | {row['device']} | {sizes} | {row['method']} | {row['metric']} | "
                f"{row['predicted_peak_bytes']:,} | {row['upper_bound_bytes']:,} | "
                f"{'' if real is None else f'{real:,}'} |"
            )
    lines += ["", "Categories at the peak (bytes):", ""]
    for name, rows in result["examples"].items():
        for row in rows.values():
            lines.append(f"- {name} on {row['device']}: {row['breakdown']['categories']}")
    return "\n".join(lines) + "\n"


def main() -> None:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    result = {"torch": torch.__version__,
              "examples": {"own_step": own_step(), "trainer": trainer_step()}}  # fmt: skip
    write_results("your_own_step", result, markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
