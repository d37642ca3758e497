"""`memgnn validate-gpu` without a GPU: a clean refusal, nothing written."""

from __future__ import annotations

import pytest
import torch
from memgnn.dataset.validate_gpu import RECORDS_FILE

from memgnn.cli import main


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU exit")
def test_main_without_gpu_exits_2(tmp_path, capsys):
    assert main(["validate-gpu", "--out", str(tmp_path), "--limit", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no CUDA device" in err
    assert not (tmp_path / RECORDS_FILE).exists()
