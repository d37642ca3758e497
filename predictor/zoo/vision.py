"""In-house dense and convolutional families: `mlp`, `resnet` (BasicBlocks) and `unet`.

Image sizes are hparams (`image`), not symbolic dims: convolution output sizes are floor
divisions, so only the batch B is symbolic for these models.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from memgnn.predictor.spec.bundle import ModelBundle
from torch import nn

from .layers import classifier_step, image_inputs
from .registry import Family, check_choice, check_int, check_ints

logger = logging.getLogger(__name__)

ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU, "silu": nn.SiLU}


# ---- mlp -----------------------------------------------------------------------------------


class MLPBlock(nn.Module):
    def __init__(self, fan_in: int, width: int, activation: str) -> None:
        super().__init__()
        self.linear = nn.Linear(fan_in, width)
        self.act = ACTIVATIONS[activation]()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.linear(x))


class MLP(nn.Module):
    def __init__(self, features: int, hidden: int, layers: int, classes: int, activation: str):
        super().__init__()
        widths = [features] + [hidden] * layers
        self.blocks = nn.ModuleList(
            MLPBlock(a, b, activation) for a, b in zip(widths, widths[1:], strict=False)
        )
        self.head = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def feature_inputs(
    sizes: Mapping[str, Any],
    device: torch.device,
    float_dtype: torch.dtype,
    *,
    features: int,
    classes: int,
) -> dict[str, torch.Tensor]:
    batch = sizes["B"]
    x = torch.randn(batch, features, device=device, dtype=float_dtype)
    return {"features": x, "labels": torch.randint(0, classes, (batch,), device=device)}


def make_mlp(hp: dict[str, Any]) -> ModelBundle:
    check_ints("mlp", hp, "features", "hidden", "layers", "classes")
    check_choice("mlp", hp, "activation", tuple(ACTIVATIONS))
    build = partial(
        MLP, hp["features"], hp["hidden"], hp["layers"], hp["classes"], hp["activation"]
    )
    inputs = partial(feature_inputs, features=hp["features"], classes=hp["classes"])
    return ModelBundle(
        name="mlp",
        family="mlp",
        build=build,
        make_inputs=inputs,
        loss=classifier_step,
        dims=dict(MLP_FAMILY.dims),
        hparams=dict(hp),
    )


# ---- resnet --------------------------------------------------------------------------------


class BasicBlock(nn.Module):
    """Two 3x3 convs with batch norm and an identity (or 1x1 projection) shortcut."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    def __init__(self, stages: int, blocks: int, width: int, classes: int, stem: str) -> None:
        super().__init__()
        if stem == "imagenet":
            self.stem = nn.Sequential(
                nn.Conv2d(3, width, 7, 2, 3, bias=False),
                nn.BatchNorm2d(width),
                nn.ReLU(),
                nn.MaxPool2d(3, 2, 1),
            )
        else:
            self.stem = nn.Sequential(
                nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU()
            )
        layers: list[nn.Module] = []
        cin = width
        for stage in range(stages):
            cout = width * 2**stage
            for i in range(blocks):
                layers.append(BasicBlock(cin, cout, 2 if stage > 0 and i == 0 else 1))
                cin = cout
        self.blocks = nn.ModuleList(layers)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def make_resnet(hp: dict[str, Any]) -> ModelBundle:
    check_ints("resnet", hp, "stages", "blocks", "width", "image", "classes")
    stem = check_choice("resnet", hp, "stem", ("cifar", "imagenet"))
    reduction = 2 ** (hp["stages"] - 1) * (4 if stem == "imagenet" else 1)
    if hp["image"] < reduction:
        raise ValueError(
            f"resnet: image {hp['image']} is smaller than the downsampling "
            f"{reduction} of {hp['stages']} stages with the {stem} stem"
        )
    build = partial(ResNet, hp["stages"], hp["blocks"], hp["width"], hp["classes"], stem)
    inputs = partial(image_inputs, channels=3, image=hp["image"], classes=hp["classes"])
    return ModelBundle(
        name="resnet",
        family="resnet",
        build=build,
        make_inputs=inputs,
        loss=classifier_step,
        dims=dict(RESNET.dims),
        hparams=dict(hp),
    )


# ---- unet ----------------------------------------------------------------------------------


class DoubleConv(nn.Module):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(cin, cout, 3, padding=1, bias=False),
            nn.BatchNorm2d(cout),
            nn.ReLU(),
            nn.Conv2d(cout, cout, 3, padding=1, bias=False),
            nn.BatchNorm2d(cout),
            nn.ReLU(),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


class UpBlock(nn.Module):
    """Transposed-conv upsampling, concat with the skip, then a DoubleConv."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.up = nn.ConvTranspose2d(cin, cout, 2, stride=2)
        self.conv = DoubleConv(2 * cout, cout)

    def forward(self, x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        return self.conv(torch.cat([skip, self.up(x)], dim=1))


class UNet(nn.Module):
    def __init__(self, depth: int, width: int, classes: int) -> None:
        super().__init__()
        chans = [width * 2**i for i in range(depth + 1)]
        self.down = nn.ModuleList(
            DoubleConv(3 if i == 0 else chans[i - 1], chans[i]) for i in range(depth)
        )
        self.bottleneck = DoubleConv(chans[depth - 1], chans[depth])
        self.up = nn.ModuleList(UpBlock(chans[i + 1], chans[i]) for i in reversed(range(depth)))
        self.head = nn.Conv2d(width, classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skips = []
        for block in self.down:
            x = block(x)
            skips.append(x)
            x = F.max_pool2d(x, 2)
        x = self.bottleneck(x)
        for block, skip in zip(self.up, reversed(skips), strict=True):
            x = block(x, skip)
        return self.head(x)


def unet_blocks(model: nn.Module) -> list[nn.Module]:
    return [*model.down, model.bottleneck, *model.up]


def make_unet(hp: dict[str, Any]) -> ModelBundle:
    check_ints("unet", hp, "depth", "width", "image")
    check_int("unet", hp, "classes", low=2)
    if hp["image"] % 2 ** hp["depth"]:
        raise ValueError(
            f"unet: image {hp['image']} must be divisible by 2**depth = {2 ** hp['depth']}"
        )
    build = partial(UNet, hp["depth"], hp["width"], hp["classes"])
    inputs = partial(image_inputs, channels=3, image=hp["image"], classes=hp["classes"], dense=True)
    return ModelBundle(
        name="unet",
        family="unet",
        build=build,
        make_inputs=inputs,
        loss=classifier_step,
        dims=dict(UNET.dims),
        hparams=dict(hp),
        blocks=unet_blocks,
    )


MLP_FAMILY = Family(
    name="mlp",
    family="mlp",
    source="in-house",
    task="cls",
    defaults=dict(features=256, hidden=128, layers=3, classes=10, activation="relu"),
    ranges=dict(
        features=[128, 784, 3072],
        hidden=[256, 1024, 4096],
        layers=[2, 4, 8],
        classes=[10, 100, 1000],
        activation=["relu", "gelu"],
    ),
    dims={"B": 64},
    factory=make_mlp,
    description="ReLU/GELU MLP classifier on feature vectors",
)
RESNET = Family(
    name="resnet",
    family="resnet",
    source="in-house",
    task="image-cls",
    defaults=dict(stages=2, blocks=1, width=16, image=32, classes=10, stem="cifar"),
    ranges=dict(
        stages=[2, 3, 4],
        blocks=[1, 2, 3],
        width=[16, 32, 64],
        image=[32, 64, 128, 224],
        classes=[10, 100, 1000],
        stem=["cifar", "imagenet"],
    ),
    dims={"B": 4},
    factory=make_resnet,
    description="ResNet with BasicBlocks; width doubles per stage",
)
UNET = Family(
    name="unet",
    family="unet",
    source="in-house",
    task="segmentation",
    defaults=dict(depth=2, width=8, image=32, classes=4),
    ranges=dict(depth=[2, 3, 4], width=[16, 32, 64], image=[64, 128, 256], classes=[2, 4, 21]),
    dims={"B": 2},
    factory=make_unet,
    description="U-Net, per-pixel cross entropy",
)
FAMILIES = (MLP_FAMILY, RESNET, UNET)
