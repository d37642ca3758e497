"""`memgnn explain`: the peak named and the what-ifs, as text and JSON, local and through
the service."""

import json

import pytest

from memgnn.cli.explain import whatif_command
from tests.memgnn.cli.clirun import run_cli

ARGV = ["explain", "--model", "mlp", "--batch", "8", "--device", "a100-80gb"]


@pytest.mark.slow
def test_explain_json_names_the_peak_and_replays_the_whatif(capsys, fresh_cache):
    code, text, err = run_cli(capsys, *ARGV, "--whatif", "accumulation", "--json")
    assert code == 0, err
    out = json.loads(text)
    assert out["prediction"]["method"] == "replay"
    assert out["peak"]["reserved_bytes"] == out["prediction"]["predicted_peak_bytes"]
    assert {r["name"] for r in out["by_category"]} >= {"parameter", "cublas_workspace"}
    (w,) = out["whatifs"]
    assert w["name"] == "accumulation" and w["sizes"]["B"] == 4
    # the same run asked of `memgnn predict` with the what-if's flags: the same bytes
    flags = whatif_command(w, out["prediction"]).split()
    code, text, err = run_cli(capsys, "predict", "--model", "mlp", "--device", "a100-80gb",
                              "--method", "replay", "--json", *flags)  # fmt: skip
    assert code == 0, err
    assert json.loads(text)["predicted_peak_bytes"] == w["predicted_peak_bytes"]


def test_explain_text_shows_every_table(capsys):
    code, text, err = run_cli(capsys, *ARGV, "--no-whatifs", "--top", "3")
    assert code == 0, err
    for head in ("peak: ", "by category:", "by module:", "by source line:", "by op:",
                 "largest tensors:"):  # fmt: skip
        assert head in text
    assert "what-ifs" not in text


def test_explain_html_writes_one_offline_page(capsys, tmp_path):
    out = tmp_path / "sub" / "r.html"
    code, text, err = run_cli(capsys, *ARGV, "--whatif", "accumulation", "--html", str(out))
    assert code == 0, err
    assert f"wrote {out}" in err and "by category:" in text  # the text answer still prints
    page = out.read_text()
    assert page.startswith("<!DOCTYPE html>") and "<svg" in page
    assert "http://" not in page and "https://" not in page
    # the what-if's command is the flags `memgnn explain` prints
    assert "<code>--grad-accum 2 --batch 4</code>" in page


def test_whatif_command_gives_the_flags_of_the_change():
    base = {"train": None, "sizes": {"B": 8, "S": 512}}
    w = {"options": {"grad_accum": 2}, "sizes": {"B": 4, "S": 512}, "alloc_conf": None}
    assert whatif_command(w, base) == "--grad-accum 2 --batch 4"
    w = {"options": {"checkpointing": "full"}, "sizes": None, "alloc_conf": None}
    assert whatif_command(w, base) == "--checkpointing full"
    w = {"options": {}, "sizes": None, "alloc_conf": "expandable_segments:True"}
    assert whatif_command(w, base) == "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"


@pytest.mark.slow
def test_explain_over_http_is_the_local_document(tmp_path, capsys):
    from memgnn.serving.client import local_server
    from memgnn.serving.config import ServeConfig

    argv = [*ARGV, "--whatif", "expandable_segments", "--json"]
    with local_server(ServeConfig(model="analytic", state_dir=tmp_path)) as url:
        code, text, err = run_cli(capsys, *argv, "--url", url)
    assert code == 0, err
    remote = json.loads(text)
    code, text, err = run_cli(capsys, *argv)
    local = json.loads(text)
    for doc in (remote, local):
        del doc["prediction"]["predict_seconds"], doc["prediction"]["breakdown"]["route"]
        del doc["prediction"]["breakdown"]["replay_seconds"]
    assert remote == local
