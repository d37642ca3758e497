"""One pipeline stage's training step (`--pp N`), with `TrainingStep`'s face.

`PipelineStep` is a `TrainingStep` whose model is the rank's stage (`emulate.pipeline`:
`DecoderStage`, built from the whole model as torchtitan splits it) and whose step is the
pipeline schedule's: every rank makes the batch (`--microbatches` x `--batch` samples, as
torchtitan's data loader feeds every pipeline rank), the first stage passes the inputs,
every stage the pre-shifted labels, to `schedule.step(..., return_outputs=False)`; the last
stage averages the micro-batch losses (`torch.mean(torch.stack(losses))`); then the
optimizer steps and `zero_grad`, as in `TrainingStep.run`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

import torch
from memgnn.predictor.capture.step import (
    NullObserver,
    StepObserver,
    TrainingStep,
    mixed_dtensor_refusal,
)
from memgnn.predictor.emulate.parallel import World, mp_policy
from memgnn.predictor.emulate.pipeline import peer_metadata, stage_bundle, stage_schedule
from memgnn.predictor.ir.recorder import unrecorded
from memgnn.predictor.spec.bundle import ModelBundle
from memgnn.predictor.spec.train import TrainSpec

__all__ = ["PipelineStep"]


class PipelineStep(TrainingStep):
    """Rank `world.rank`'s stage of a `--pp` job (see the module docstring). `fake`: the
    step runs over the fake process group, whose missing peers `peer_metadata` stands in
    for."""

    def __init__(
        self,
        bundle: ModelBundle,
        train: TrainSpec,
        *,
        device: torch.device,
        target: str,
        fake: bool = False,
        world: World,
    ):
        pp = train.parallel.pp
        if pp < 2:
            raise ValueError("PipelineStep runs a --pp >= 2 TrainSpec")
        super().__init__(
            stage_bundle(bundle, pp, world.pp_rank, train.parallel.pp_stages_per_rank),
            train, device=device, target=target,
            fake=fake, world=world,
        )  # fmt: skip
        self.bundle = bundle  # the whole model's inputs
        self.fake = fake
        group = world.pp_mesh.get_group() if world.pp_mesh is not None else None
        self.stages, self.schedule = stage_schedule(self.model, world.pp_rank, train, device, group)

    def _peers(self, ids: torch.Tensor) -> Any:
        """Over the fake process group: the neighbours' metadata (`peer_metadata`), the
        hidden states between stages of one micro-batch in the embeddings' dtype (FSDP2's
        mixed-precision param_dtype where --fsdp-param-dtype is given)."""
        if not self.fake:
            return contextlib.nullcontext()
        boundary = self._boundary(ids)
        return peer_metadata(boundary, gloo=self.target == "cpu")

    def _boundary(self, ids: torch.Tensor) -> torch.Tensor:
        micro = self.train.parallel.pp_microbatches
        hidden = self.model.config.hidden_size
        # FSDP2's MixedPrecisionPolicy computes (and sends) in its param_dtype
        policy = mp_policy(self.train) if self.train.parallel.sharding == "fsdp" else None
        dtype = getattr(policy, "param_dtype", None) or self.train.numerics.param_dtype
        with unrecorded():
            boundary = torch.empty(
                ids.shape[0] // micro, ids.shape[1], hidden, dtype=dtype, device=self.device,
                requires_grad=True,
            )  # fmt: skip
        return boundary

    def _check_boundary(self, ids: torch.Tensor) -> None:
        """What this stage sends on is what `peer_metadata` told the next stage it would
        receive (shape expressions and dtype): every stage but the last checks the
        metadata its neighbour was given."""
        if not self.fake:
            return
        told = self._boundary(ids)
        want = [(tuple(str(d) for d in told.shape), told.dtype)]
        for stage in self.stages:
            if stage.is_last:
                continue
            sent = stage._stage_meta.outputs
            got = [(tuple(str(d) for d in m.shape), m.dtype) for m in sent or ()]
            assert got == want, f"--pp stage {stage.stage_index} sends {got}, peers told {want}"

    def run(
        self,
        sizes: Mapping[str, Any],
        observer: StepObserver | None = None,
        *,
        steps: tuple[int, ...] = (0, 1),
        micro_steps: int | None = None,
    ) -> None:
        obs = observer or NullObserver()
        micro = self.train.parallel.pp_microbatches
        whole = dict(sizes) | {"B": sizes["B"] * micro}
        for step in steps:
            obs.on_phase("input", step, 0)
            inputs = self.bundle.make_inputs(whole, self.device, self.float_dtype())
            ids, labels = inputs["input_ids"], inputs["shift_labels"]
            del inputs
            obs.on_phase("forward", step, 0)
            losses: list[torch.Tensor] = []
            with self._peers(ids), self._autocast():
                args = (ids,) if any(s.is_first for s in self.stages) else ()
                self.schedule.step(*args, target=labels, losses=losses, return_outputs=False)
            self._check_boundary(ids)
            if any(s.is_last for s in self.stages):
                loss = torch.mean(torch.stack(losses))
                del loss
            del losses, ids, labels
            obs.on_backward_end(self.model, step, 0)
            obs.on_phase("optimizer", step, 0)
            with mixed_dtensor_refusal(self.train):  # --tp: DTensor and plain weights
                if self.scaler is not None:
                    self.scaler.step(self.optimizer)
                    self.scaler.update()
                else:
                    self.optimizer.step()
            obs.on_optimizer_end(self.optimizer, step)
            obs.on_phase("zero_grad", step, 0)
            self.optimizer.zero_grad(set_to_none=self.train.optim.set_to_none)
