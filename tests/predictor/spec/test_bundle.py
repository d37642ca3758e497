"""ModelBundle's checks, its sizes, and the blocks checkpointing wraps by default."""

from __future__ import annotations

import pytest
import torch
from memgnn.predictor.spec.bundle import ModelBundle, check_size, default_blocks
from torch import nn


def _bundle(**kw) -> ModelBundle:
    fields = dict(
        name="toy",
        family="toy",
        build=lambda: nn.Linear(4, 4),
        make_inputs=lambda sizes, device, dtype: {"x": torch.zeros(sizes["B"], 4)},
        loss=lambda model, batch: model(batch["x"]).sum(),
        dims={"B": 2},
    )
    return ModelBundle(**(fields | kw))


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"dims": {}}, "declares no input dims"),
        ({"dims": {"2B": 2}}, "bad dim name"),
        ({"dims": {"B": 0}}, "must be a positive int"),
        ({"static_dims": ("S",)}, r"static dims \['S'\] are not dims"),
        ({"origin": "url"}, "unknown origin"),
        ({"layers": 4}, "give both layers and with_layers"),
    ],
)
def test_a_malformed_bundle_is_refused_naming_what_is_wrong(kw, message):
    with pytest.raises(ValueError, match=message):
        _bundle(**kw)


def test_sizes_fill_the_example_dims_and_refuse_unknown_or_bad_ones():
    bundle = _bundle(dims={"B": 2, "S": 8})
    assert bundle.sizes({"S": 64}) == {"B": 2, "S": 64}
    with pytest.raises(ValueError, match="'T' is not an input dim"):
        bundle.sizes({"T": 3})
    with pytest.raises(ValueError, match="size B must be >= 1"):
        bundle.sizes({"B": 0})
    with pytest.raises(ValueError, match="must be an integer"):
        check_size("B", True)


def test_default_blocks_are_the_longest_list_of_same_type_children():
    model = nn.Sequential(
        nn.Linear(2, 2),
        nn.ModuleList([nn.ReLU(), nn.Linear(2, 2)]),  # mixed types: not blocks
        nn.ModuleList([nn.Linear(2, 2) for _ in range(3)]),
    )
    blocks = default_blocks(model)
    assert len(blocks) == 3 and all(isinstance(b, nn.Linear) for b in blocks)
