"""The values options take, and bitsandbytes version strings."""

from __future__ import annotations

import pytest
from memgnn.predictor.spec.choices import BNB_VERSION, OPTIMIZERS, bnb_version_tuple


def test_bnb_versions_read_as_tuples_and_bad_ones_name_the_flag():
    assert bnb_version_tuple("0.42.0") == (0, 42, 0)
    assert bnb_version_tuple("0.43") == (0, 43, 0)
    assert bnb_version_tuple(BNB_VERSION) >= (0, 45, 0)
    for bad in ("latest", "0.4x.1", 42):
        with pytest.raises(ValueError, match="--bnb-version must look like 0.42.0"):
            bnb_version_tuple(bad)


def test_optimizers_are_torchs_plus_bitsandbytes():
    assert OPTIMIZERS[-1] == "adamw8bit" and {"sgd", "adam", "adamw", "adafactor"} < set(OPTIMIZERS)
