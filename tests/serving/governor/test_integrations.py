"""The governor inside Lightning and the Hugging Face Trainer (skipped where not installed)."""

from __future__ import annotations

import pytest
import torch
from memgnn.predictor.memory.analytic import AnalyticModel
from memgnn.predictor.spec.train import TrainSpec
from memgnn.serving.governor import MemoryGovernor
from memgnn.serving.governor.batching import pad_collate
from memgnn.serving.governor.demo import long_tail_samples, tiny_varlen_bundle
from memgnn.serving.governor.devices import EmulatedDevice

from tests.serving.governor.governed import config

MiB = 1 << 20


pytestmark = pytest.mark.usefixtures("one_thread")


def test_lightning_callback_plans_predicts_and_logs(cache):
    L = pytest.importorskip(
        "lightning.pytorch", reason="lightning is not installed (pip install memgnn[lightning])"
    )
    from memgnn.serving.governor.integrations.lightning import GovernorCallback

    bundle = tiny_varlen_bundle()
    samples = list(long_tail_samples(64, lo=40, hi=60))

    class Lit(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = bundle.build()
            self.batch_size = 2

        def training_step(self, batch, idx):
            return bundle.loss(self.model, batch)

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3, foreach=True)

        def train_dataloader(self):
            return torch.utils.data.DataLoader(
                samples, batch_size=self.batch_size, collate_fn=lambda s: pad_collate(s, 64)
            )

    torch.manual_seed(0)
    lit = Lit()
    device = EmulatedDevice(256 * MiB, byte_scale=64)
    gov = MemoryGovernor(
        lit.model,
        TrainSpec.of(optimizer_impl="foreach"),
        bundle=bundle,
        device=device,
        predictor=AnalyticModel(),
        config=config(cache_dir=cache, checkpointing=["none"], max_length=256),
    )
    callback = GovernorCallback(gov, plan_sizes={"S": 64})
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=3,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[callback],
    )
    with device:
        trainer.fit(lit)
    assert callback.planned and callback.planned > 2 and lit.batch_size == callback.planned
    assert len(callback.records) == 3
    rec = callback.records[-1]
    assert rec.samples == callback.planned and rec.bound_bytes <= rec.limit_bytes
    assert rec.measured_allocated_bytes is not None and rec.measured_allocated_bytes > 0
    assert (
        abs(rec.predicted_bytes - rec.measured_allocated_bytes) < 0.1 * rec.measured_allocated_bytes
    )
    assert "governor/predicted_bytes" in trainer.callback_metrics


def test_hf_trainer_callback_configures_and_logs(cache, tmp_path):
    transformers = pytest.importorskip(
        "transformers", reason="transformers is not installed (pip install memgnn[transformers])"
    )
    pytest.importorskip("accelerate", reason="the HF Trainer needs accelerate (not installed)")
    from memgnn.predictor.zoo import make_bundle
    from memgnn.serving.governor.integrations.hf import GovernorTrainerCallback

    bundle = make_bundle("gpt2", {"layers": 2, "hidden": 32, "heads": 2, "vocab": 128,
                                  "dropout": 0.0})  # fmt: skip
    torch.manual_seed(0)
    model = bundle.build()
    device = EmulatedDevice(1024 * MiB, byte_scale=64)
    gov = MemoryGovernor(
        model,
        TrainSpec.of(optimizer_impl="foreach"),
        bundle=bundle,
        device=device,
        predictor=AnalyticModel(),
        config=config(cache_dir=cache, checkpointing=["none"], max_length=256),
    )
    callback = GovernorTrainerCallback(gov)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=64,
        gradient_accumulation_steps=1,
        max_steps=2,
        report_to=[],
        use_cpu=True,
        logging_steps=1,
        save_strategy="no",
        disable_tqdm=True,
    )
    args = callback.configure(args, {"S": 64})
    b, g = args.per_device_train_batch_size, args.gradient_accumulation_steps
    assert b * g >= 64 and g > 1  # 64 x 64 tokens do not fit: accumulate, same effective
    data = [{"input_ids": ids, "labels": ids} for ids in torch.randint(0, 128, (b * g * 2, 64))]
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data, callbacks=[callback])
    with device:
        trainer.train()
    assert len(callback.records) == 2
    rec = callback.records[-1]
    assert rec.grad_accum == g and rec.micro_batch == b
    assert rec.measured_allocated_bytes and rec.bound_bytes <= rec.limit_bytes
    logged = [h for h in trainer.state.log_history if "governor/predicted_bytes" in h]
    assert logged
