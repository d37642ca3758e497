import pytest
import torch
from memgnn.predictor.capture.pipeline_step import PipelineStep
from memgnn.predictor.emulate.parallel import fake_world
from memgnn.predictor.spec.train import TrainSpec
from memgnn.predictor.zoo.resolve import resolve


def test_a_spec_without_pipeline_stages_is_refused():
    with pytest.raises(ValueError, match="--pp >= 2"):
        PipelineStep(resolve("llama", {"layers": 4, "vocab": 64}), TrainSpec.of(),
                     device=torch.device("cpu"), target="cpu", world=None)  # fmt: skip


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_each_rank_builds_its_own_stage_and_pytorchs_schedule(schedule):
    """Rank r of --pp 2 holds blocks 2r and 2r+1 of 4, wrapped in PyTorch's PipelineStage,
    run by PyTorch's schedule class for the name."""
    bundle = resolve("llama", {"layers": 4, "vocab": 64})
    train = TrainSpec.of(gpus=2, pp=2, pp_schedule=schedule, microbatches=4)
    expected = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B"}[schedule]
    for rank in (0, 1):
        with fake_world(train, rank) as world:
            step = PipelineStep(bundle, train, device=torch.device("cpu"), target="cpu",
                                fake=True, world=world)  # fmt: skip
            assert type(step.schedule).__name__ == expected
            assert [s.stage_index for s in step.stages] == [rank]
            assert len(step.model.layers) == 2
