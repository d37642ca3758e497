"""--budget / --threshold in predict, profile --backend sim and plan: the verdict, the limit
a plan searches under, and the errors (exit 2) naming both options."""

from __future__ import annotations

import json

import pytest

from tests.memgnn.cli.clirun import run_cli

A100 = 81920 << 20  # the a100-80gb profile's total
MLP = ("--model", "mlp", "--device", "a100-80gb")


pytestmark = pytest.mark.usefixtures("fresh_cache")


def test_predict_verdict_under_a_threshold(capsys):
    code, out, err = run_cli(
        capsys, "predict", *MLP, "--batch", "64", "--threshold", "0.85", "--json"
    )
    assert code == 0, err
    got = json.loads(out)
    v = got["verdict"]
    assert v["limit_bytes"] == int(A100 * 0.85) and v["source"] == "threshold"
    assert v["fits"] and v["headroom_bytes"] == v["limit_bytes"] - got["upper_bound_bytes"]
    # a limit below the bound: does not fit, by the same bytes
    tiny = got["upper_bound_bytes"] - 1
    code, out, _ = run_cli(
        capsys, "predict", *MLP, "--batch", "64", "--budget", str(tiny), "--json"
    )
    assert code == 0 and json.loads(out)["verdict"]["fits"] is False
    code, out, _ = run_cli(capsys, "predict", *MLP, "--batch", "64", "--budget", str(tiny))
    assert "does NOT fit" in out and "1 B over" in out


def test_profile_sim_verdict_on_the_reserved_peak(capsys):
    base = ("profile", "--backend", "sim", *MLP, "--batch", "64", "--json")
    code, out, err = run_cli(capsys, *base, "--threshold", "0.5")
    assert code == 0, err
    rec = json.loads(out)
    assert rec["verdict"]["metric"] == "reserved" and rec["verdict"]["fits"]
    assert rec["verdict"]["headroom_bytes"] == int(A100 * 0.5) - rec["peak_reserved_bytes"]


def test_plan_under_a_threshold_searches_below_that_fraction_of_the_device(capsys):
    argv = ("plan", *MLP, "--threshold", "0.001", "--checkpointing-choices", "none",
            "--max-batch", "1048576", "--json")  # fmt: skip
    code, out, err = run_cli(capsys, *argv)
    assert code == 0, err
    got = json.loads(out)
    assert got["budget_bytes"] == A100 and got["threshold"] == 0.001
    assert got["limit_bytes"] == int(A100 * 0.001)
    assert got["prediction"]["upper_bound_bytes"] <= got["limit_bytes"]
    # the same limit given as bytes plans the same batch
    code, out2, _ = run_cli(capsys, *argv[:5], "--budget", f"{got['limit_bytes']}B", *argv[7:])
    assert code == 0 and json.loads(out2)["batch_size"] == got["batch_size"]


@pytest.mark.parametrize("command", ["plan", "predict", "profile"])
def test_budget_and_threshold_together_exit_2_naming_both(capsys, command):
    code, _, err = run_cli(capsys, command, *MLP, "--budget", "8GiB", "--threshold", "0.5")
    assert code == 2
    assert "--budget and --threshold are mutually exclusive" in err.strip().splitlines()[-1]


@pytest.mark.parametrize(
    "extra, message",
    [
        ((), "give --budget (bytes, e.g. 68GB) or --threshold"),
        (("--threshold", "1.5"), "--threshold must be a fraction in (0, 1]"),
        (("--threshold", "0"), "--threshold must be a fraction in (0, 1]"),
    ],
)
def test_plan_limit_errors_exit_2(capsys, extra, message):
    code, _, err = run_cli(capsys, "plan", *MLP, *extra)
    assert code == 2 and message in err


def test_threshold_on_a_device_without_a_total_is_refused(capsys):
    code, _, err = run_cli(
        capsys, "plan", "--model", "mlp", "--device", "cpu", "--threshold", "0.5"
    )
    assert code == 2 and "'cpu' has no memory total" in err
