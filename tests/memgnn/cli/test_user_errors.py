"""User errors exit 2 with one line; a user's own model from the current directory;
plan's flags say what they do; progress on stderr."""

from __future__ import annotations

import json
import logging
import sys
import textwrap

import pytest

from memgnn.cli import build_parser
from tests.memgnn.cli.clirun import run_cli

USER_MODEL = textwrap.dedent(
    """
    import torch
    import torch.nn.functional as F
    from torch import nn

    from memgnn.predictor.spec.bundle import ModelBundle


    def make(width="32"):
        width = int(width)

        def inputs(sizes, device, dtype):
            return {"x": torch.randn(sizes["B"], 16, device=device, dtype=dtype),
                    "y": torch.randint(0, 4, (sizes["B"],), device=device)}

        return ModelBundle(
            name=f"user-mlp-{width}", family="mlp",
            build=lambda: nn.Sequential(nn.Linear(16, width), nn.ReLU(), nn.Linear(width, 4)),
            make_inputs=inputs, loss=lambda m, i: F.cross_entropy(m(i["x"]), i["y"]),
            dims={"B": 8},
        )


    def fixed(width="32"):  # ignores `sizes`: B never reaches the graph
        bundle = make(width)
        bundle.name = f"user-mlp-fixed-{width}"
        real = bundle.make_inputs
        bundle.make_inputs = lambda sizes, device, dtype: real({"B": 8}, device, dtype)
        return bundle
    """
)


@pytest.fixture
def user_dir(tmp_path, monkeypatch):
    (tmp_path / "my_user_model.py").write_text(USER_MODEL)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.setenv("MEMGNN_CACHE", str(tmp_path / "cache"))
    yield tmp_path
    sys.modules.pop("my_user_model", None)


def _one_error_line(err: str) -> str:
    lines = [ln for ln in err.strip().splitlines() if ln.startswith("memgnn")]
    assert len(lines) == 1, err
    assert "Traceback" not in err, err
    return lines[0]


def test_py_factory_found_in_the_current_directory(user_dir, capsys):
    code, out, err = run_cli(
        capsys, "predict", "--model", "py:my_user_model:make", "--model-arg", "width=64",
        "--batch", "16", "--device", "cpu", "--json",
    )  # fmt: skip
    assert code == 0, err
    answer = json.loads(out)
    assert answer["predicted_peak_bytes"] > 0
    assert answer["model"]["kind"] == "py"  # the bundle's name looks like a zoo config's
    code, out, err = run_cli(
        capsys, "predict", "--model", "py:my_user_model:make", "--model-arg", "width=64",
        "--batch", "16", "--device", "cpu",
    )  # fmt: skip
    assert code == 0 and "zoo config" not in out, out


def test_unknown_model_arg_of_a_py_factory_is_a_user_error(user_dir, capsys):
    code, _, err = run_cli(
        capsys, "predict", "--model", "py:my_user_model:make", "--model-arg", "foo=1",
        "--device", "cpu",
    )  # fmt: skip
    assert code == 2
    assert "foo" in _one_error_line(err) and "width" in err


def test_size_that_never_reaches_the_graph_is_warned(user_dir, capsys):
    code, out, err = run_cli(
        capsys, "predict", "--model", "py:my_user_model:fixed", "--batch", "100000",
        "--device", "cpu", "--json",
    )  # fmt: skip
    assert code == 0, err
    warnings = json.loads(out)["warnings"]
    assert any("B" in w for w in warnings) and "B" in err and "warning" in err.lower()
    code, out, _ = run_cli(
        capsys, "predict", "--model", "py:my_user_model:make", "--batch", "64",
        "--device", "cpu", "--json",
    )  # fmt: skip
    assert json.loads(out)["warnings"] == []


@pytest.mark.parametrize(
    "budget, message",
    [
        ("1e400", "finite"),
        ("1", "ambiguous"),
        ("1.5", "fraction"),
        ("0GiB", "positive"),
    ],
)
def test_bad_budgets_are_user_errors(user_dir, capsys, budget, message):
    code, _, err = run_cli(capsys, "plan", "--model", "py:my_user_model:make", "--budget", budget)
    assert code == 2
    assert message in _one_error_line(err)


def test_plan_batch_flag_is_rejected_not_ignored(user_dir, capsys):
    code, _, err = run_cli(
        capsys, "plan", "--model", "py:my_user_model:make", "--budget", "8GiB", "--batch", "4"
    )
    assert code == 2 and "--max-batch" in _one_error_line(err)


def test_plan_mode_binsearch_finds_any_batch_and_power_contradicts_any_batch(user_dir, capsys):
    base = ("plan", "--model", "py:my_user_model:make", "--budget", "1MiB", "--device", "cpu",
            "--checkpointing-choices", "none", "--json")  # fmt: skip
    code, out, err = run_cli(capsys, *base, "--mode", "binsearch")
    assert code == 0, err
    bisected = json.loads(out)["batch_size"]
    code, out, _ = run_cli(capsys, *base)
    powered = json.loads(out)["batch_size"]
    assert powered & (powered - 1) == 0 and bisected >= powered
    assert bisected & (bisected - 1) != 0  # bisection lands between powers of two
    code, _, err = run_cli(capsys, *base, "--mode", "power", "--any-batch")
    assert code == 2 and "--any-batch" in _one_error_line(err)


def test_plan_that_finds_nothing_names_the_bound_and_the_closest(user_dir, capsys):
    code, _, err = run_cli(
        capsys, "plan", "--model", "py:my_user_model:make", "--budget", "1KiB", "--device", "cpu",
        "--checkpointing-choices", "none",
    )  # fmt: skip
    line = _one_error_line(err)
    assert code == 2 and "upper bound" in line and "closest" in line and "B=1" in line


def test_fractional_budget_is_explicit(user_dir, capsys):
    base = ("plan", "--model", "py:my_user_model:make", "--device", "a100-80gb",
            "--checkpointing-choices", "none", "--max-batch", "8", "--json")  # fmt: skip
    code, out, err = run_cli(capsys, *base, "--budget", "50%")
    assert code == 0, err
    assert json.loads(out)["budget_bytes"] == 40 * 10**9 or json.loads(out)["budget_bytes"] > 0
    code, out2, _ = run_cli(capsys, *base, "--budget", "0.5")
    assert json.loads(out2)["budget_bytes"] == json.loads(out)["budget_bytes"]


def test_help_describes_the_tool_and_shows_defaults(capsys):
    parser = build_parser()
    assert "argument parsing" not in parser.description
    assert "memory" in parser.description
    sub = parser._subparsers._group_actions[0].choices  # noqa: SLF001
    text = " ".join(sub["predict"].format_help().split())  # help wraps lines at hyphens
    assert "(default: h100-" in text and "reserved on a GPU" in text


def test_capture_progress_goes_to_stderr(user_dir, capsys, caplog, monkeypatch):
    from memgnn.predictor.capture.progress import Progress

    monkeypatch.setattr(Progress, "first", 0.0)  # this capture is quicker than 2 s
    caplog.set_level(logging.INFO, logger="predictor.progress")
    code, _, err = run_cli(
        capsys, "predict", "--model", "py:my_user_model:make", "--model-arg", "width=48",
        "--device", "cpu",
    )  # fmt: skip
    assert code == 0, err
    assert any("capturing" in r.getMessage() for r in caplog.records)


POSITIONS_MODEL = textwrap.dedent(
    """
    import torch
    import torch.nn.functional as F
    from torch import nn

    from memgnn.predictor.spec.bundle import ModelBundle


    class Positions(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok, self.pos = nn.Embedding(40, 16), nn.Embedding(32, 16)
            self.head = nn.Linear(16, 40)

        def forward(self, ids):
            pos = torch.arange(ids.shape[1], device=ids.device)
            return self.head(self.tok(ids) + self.pos(pos))


    def make():
        def inputs(sizes, device, dtype):
            return {"ids": torch.randint(0, 40, (sizes["B"], sizes["S"]), device=device)}

        def loss(m, i):
            return F.cross_entropy(m(i["ids"]).flatten(0, 1), i["ids"].flatten())

        return ModelBundle(name="positions-32", family="gpt", build=Positions,
                           make_inputs=inputs, loss=loss, dims={"B": 2, "S": 8})
    """
)


@pytest.mark.parametrize("command", ["predict", "profile"])
def test_sequence_past_the_position_table_is_refused(user_dir, capsys, command):
    (user_dir / "my_positions.py").write_text(POSITIONS_MODEL)
    extra = ["--backend", "cpu"] if command == "profile" else ["--device", "cpu"]
    code, _, err = run_cli(
        capsys, command, "--model", "py:my_positions:make", "--seq", "64", *extra
    )
    sys.modules.pop("my_positions", None)
    assert code == 2
    assert "32 rows" in _one_error_line(err)


def test_a_hostile_new_users_inputs_are_one_line_each(capsys, user_dir):
    """A hostile probe's CLI cases: a huge batch was an OverflowError traceback, a negative
    --budget printed the whole usage, layers=1000000 captured for minutes, and a `py:`
    factory that raised gave its traceback. Each is now exit 2 and one line naming it."""
    (user_dir / "raising_model.py").write_text("def make():\n    raise RuntimeError('no GPU')\n")
    cases = {
        ("predict", "--model", "mlp", "--batch", "99999999999999999999"): "is over 2147483647",
        ("plan", "--model", "mlp", "--budget", "-5GiB"): "cannot read a budget from '-5GiB'",
        ("predict", "--model", "mlp", "--model-arg", "layers=1000000"): "over the limit of 512",
        ("predict", "--model", "py:raising_model:make"): "make() raised RuntimeError: no GPU",
    }
    for argv, expected in cases.items():
        code, _, err = run_cli(capsys, *argv)
        assert code == 2, (argv, err)
        assert expected in _one_error_line(err), (argv, err)
