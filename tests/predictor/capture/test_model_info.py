import pytest
import torch
from memgnn.predictor.capture.model_info import describe, describe_bundle, structure
from memgnn.predictor.spec.bundle import ModelBundle
from memgnn.predictor.spec.train import TrainSpec
from torch import nn


class Tied(nn.Module):
    def __init__(self, stride: int = 1):
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.emb.weight
        self.conv = nn.Conv1d(4, 4, 3, stride=stride)
        self.blocks = nn.ModuleList(nn.Linear(4, 4) for _ in range(3))


def _bundle(stride: int = 1) -> ModelBundle:
    return ModelBundle(
        name="py:tests:tied",
        family="tied",
        build=lambda: Tied(stride),
        make_inputs=lambda sizes, device, dtype: {},
        loss=lambda model, inputs: torch.zeros(()),
        dims={"B": 2},
    )


def test_describe_counts_tied_weights_once_and_reads_dtypes():
    info = describe(Tied(), _bundle(), TrainSpec.of(precision="amp-bf16"))
    assert info.parameters == 40 + (4 * 4 * 3 + 4) + 3 * 20
    assert info.param_dtype == "float32" and info.compute_dtype == "bfloat16"
    assert info.blocks == 3 and info.kind == "py" and info.module_class == "Tied"
    fake = describe_bundle(_bundle(), TrainSpec.of(precision="bf16"), "cpu")
    assert fake.parameters == info.parameters and fake.param_dtype == "bfloat16"
    assert fake.parameter_bytes == 2 * info.parameters


def test_structure_sees_settings_that_are_not_shapes():
    plain, strided = structure(Tied(1)), structure(Tied(2))
    assert plain["parameters"] == strided["parameters"] and plain != strided
    tied = {name: tie for name, *_, tie in plain["parameters"]}
    assert tied["head.weight"] == "emb.weight"


def test_kind_follows_how_the_user_named_the_model():
    from dataclasses import replace

    from memgnn.cli.render import model_line

    # a py: factory may name its bundle anything (here a zoo-like name)
    bundle = replace(_bundle(), name="classifier-16", origin="py")
    info = describe(Tied(), bundle, TrainSpec())
    assert info.kind == "py"
    assert "zoo config" not in model_line(info.to_dict())
    zoo_like = describe(Tied(), replace(bundle, origin=""), TrainSpec())
    assert zoo_like.kind == "zoo" and "zoo config" in model_line(zoo_like.to_dict())
    with pytest.raises(ValueError, match="origin"):
        replace(bundle, origin="pip")


def test_an_adapter_names_the_modules_it_adapted():
    """A LoRA answer said `+ LoRA r=8` but not where: the tuner layers by name and count."""
    from tiny_models import tiny_gpt_bundle

    spec = TrainSpec.of(peft="lora", lora_targets="qkv,fc1")
    lora = describe_bundle(tiny_gpt_bundle(), spec, "cpu")
    blocks = lora.blocks
    assert lora.adapted == {"fc1": blocks, "qkv": blocks}
    assert lora.trainable_parameters < lora.parameters
    assert describe_bundle(tiny_gpt_bundle(), TrainSpec(), "cpu").adapted == {}
