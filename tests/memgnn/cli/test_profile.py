"""`memgnn profile`: the record contract."""

import json

from tests.memgnn.cli.clirun import run_cli


def test_profile_json_has_contract_fields(capsys):
    code, text, _ = run_cli(
        capsys, "profile", "--model", "mlp", "--batch", "8", "--device", "a100-80gb", "--json"
    )
    rec = json.loads(text)
    assert code == 0
    for key in (
        "peak_allocated_bytes",
        "peak_reserved_bytes",
        "device_total_bytes",
        "breakdown",
        "backend",
        "device",
    ):
        assert key in rec
    assert rec["peak_reserved_bytes"] >= rec["peak_allocated_bytes"] > 0
    assert rec["device_total_bytes"] > rec["peak_reserved_bytes"]
    code, text, _ = run_cli(capsys, "profile", "--model", "mlp", "--backend", "cpu", "--json")
    rec = json.loads(text)
    assert rec["peak_reserved_bytes"] is None and rec["device"] == "cpu"
