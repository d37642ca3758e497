"""`memgnn devices`: every profile, with its memory total and terms."""

from __future__ import annotations

import json

from memgnn.predictor.spec.devices import PROFILES

from memgnn.cli import main


def test_devices_json_lists_every_profile(capsys):
    assert main(["devices", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert set(listed) == set(PROFILES)
    assert listed["a100-80gb"]["total_bytes"] == 81920 * 2**20
    assert main(["devices"]) == 0
    assert "h100-80gb" in capsys.readouterr().out
