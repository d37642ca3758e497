"""`memgnn plan`: the search space flags, the decision printed as users reason, and the
count of captured graphs the search used."""

from __future__ import annotations

import json

import pytest

from memgnn.cli.plan import _layout, _stage_line
from tests.memgnn.cli.clirun import run_cli

BASE = ("plan", "--model", "mlp", "--device", "cpu", "--budget", "2MiB",
        "--checkpointing-choices", "none", "--max-batch", "4096")  # fmt: skip


pytestmark = pytest.mark.usefixtures("fresh_cache")


def test_plan_json_carries_the_decision_and_the_graph_count(capsys):
    argv = (*BASE, "--optimizer-impl-choices", "foreach,fused,for-loop",
            "--accum-choices", "1,2,4", "--json")  # fmt: skip
    code, out, err = run_cli(capsys, *argv)
    assert code == 0, err
    got = json.loads(out)
    assert got["variants"] == 9 and got["graphs"] == 6 and len(got["graph_seconds"]) == 6
    assert got["optimizer_impl"] in ("foreach", "fused", "for-loop")
    d = got["decision"]
    assert set(d["state_by_category"]) == {"parameter", "gradient", "optimizer_state"}
    assert d["state_bytes"] >= d["state_by_category"]["parameter"] > 0
    # the line through B=1 and the answer meets the bound there
    lo, hi = d["slope_batches"]
    assert hi == got["batch_size"]
    on_line = d["fixed_bytes"] + d["per_sample_bytes"] * hi
    assert abs(on_line - got["prediction"]["upper_bound_bytes"]) <= hi  # rounding of slope
    assert (
        d["theoretical_max_batch"]
        == (got["limit_bytes"] - d["fixed_bytes"]) // d["per_sample_bytes"]
    )
    assert got["global_batch"] == got["batch_size"] * got["grad_accum"] * got["gpus"]
    t = got["train"]  # the chosen step as the answer assumed it
    assert (t["loop"]["grad_accum"], t["optim"]["impl"]) == (
        got["grad_accum"],
        got["optimizer_impl"],
    )
    assert t["loop"]["hold_outputs"] is False


def test_plan_prints_state_per_sample_and_the_choice(capsys):
    code, out, err = run_cli(capsys, *BASE)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("limit 2.00 MiB (100% of 2.00 MiB)")
    assert lines[1].startswith("state ") and "parameters" in lines[1]
    assert " per sample (slope of the bound between B=1 and B=" in lines[2]
    assert lines[3].startswith("theoretical largest batch (limit - fixed) / per-sample = ")
    assert lines[4].startswith("chosen B=") and "no checkpointing" in lines[4]
    assert "on 1 captured graphs" in lines[-1]
    assert any(line.startswith("loop: outputs freed with the forward") for line in lines)


@pytest.mark.parametrize(
    "extra, message",
    [
        (("--optimizer-impl-choices", "turbo"), "optimizer implementation 'turbo'"),
        (("--gpus-choices", "two"), "--gpus-choices: bad list"),
        (("--sharding-choices", ","), "--sharding-choices: empty list"),
        (("--gpus-choices", "2", "--sharding-choices", "hsdp"), "no valid configuration"),
    ],
)
def test_bad_search_choices_exit_2(capsys, extra, message):
    code, _, err = run_cli(capsys, *BASE, *extra)
    assert code == 2 and message in err


def test_the_layout_names_sharding_tp_and_the_pipeline():
    assert _layout({"sharding": "fsdp", "gpus": 4}) == "fsdp x4 over 4 GPUs"
    assert _layout({"sharding": "none", "gpus": 2, "tp": 2}) == "--tp 2 over 2 GPUs"
    assert _layout({"sharding": "fsdp", "gpus": 16, "tp": 8}) == "fsdp x2, --tp 8 over 16 GPUs"
    pipe = {"sharding": "none", "gpus": 4, "pp": 4, "pp_schedule": "gpipe", "microbatches": 8}
    assert _layout(pipe) == "--pp 4 gpipe (8 micro-batches of B) over 4 GPUs"
    assert _stage_line({"best": {"stage_peaks": [3 << 30, 1 << 30]}}) == (
        "stages 0: 3.00 GiB, 1: 1.00 GiB (worst: stage 0)"
    )
    assert _stage_line({"best": {"stage_peaks": []}}) is None


def test_layouts_search_tp_and_pp_and_name_what_the_capture_refused(capsys):
    """--layouts on 2 GPUs: ddp x2 and --pp 2 (the zoo llama's 2 blocks, one a stage), each
    answered per rank, the pipeline's stages listed; --tp 2 alone left out, as the capture
    refuses it (its foreach optimizer over DTensor and plain weights), and said why."""
    argv = ("plan", "--model", "llama", "--seq", "16", "--gpus", "2", "--sharding", "ddp",
            "--layouts", "--device", "h100-80gb", "--budget", "1GiB", "--max-batch", "8",
            "--checkpointing-choices", "none", "--json")  # fmt: skip
    code, out, err = run_cli(capsys, *argv)
    assert code == 0, err
    got = json.loads(out)
    every = [got["best"], *got["runners_up"]]
    layouts = {(c["tp"], c["pp"], c["sharding"]) for c in every}
    assert layouts == {(1, 1, "ddp"), (1, 2, "none")}
    assert got["variants"] == 3 and got["graphs"] == 2
    (why,) = got["left_out"]
    assert why.startswith("gpus=2 tp=2: --tp 2 --optimizer-impl auto: ")
    (pipe,) = [c for c in every if c["pp"] == 2]
    assert len(pipe["stage_peaks"]) == 2 and max(pipe["stage_peaks"]) == pipe["bound_bytes"]
    assert pipe["microbatches"] == 2 and pipe["pp_schedule"] == "1f1b"
    # each layout's objective: B x its work share / its cost (ddp has none of the others')
    ddp = next(c for c in every if c["sharding"] == "ddp")
    assert pipe["objective"] < ddp["objective"]  # a 2-stage bubble with 2 micro-batches
