"""Fixtures of the rollout tier: a model source with three versions and golden outputs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from .fakes import FakeSlot


@pytest.fixture()
def world(tmp_path: Path) -> dict[str, Any]:
    source = tmp_path / "models"
    golden: dict[str, Any] = {"version_details": {}}
    for version in (1, 2, 3):
        (source / str(version)).mkdir(parents=True)
        (source / str(version) / "saved_model.pb").write_bytes(b"pb")
        golden["version_details"][str(version)] = {"golden": [{
            "signature": "serving_default",
            "inputs": {"x": {"dtype": "DT_FLOAT", "shape": [2, 1], "values": [[1.0], [3.0]]}},
            "outputs": {"y": {"dtype": "DT_FLOAT", "shape": [2, 1],
                              "values": [[2.5 + version - 1], [3.5 + version - 1]]}}}]}
    (tmp_path / "golden.json").write_text(json.dumps(golden))
    FakeSlot.behaviour = {}
    fleet: dict[str, Any] = {}
    FakeSlot.fleet = fleet
    return {"tmp": tmp_path, "source": source, "golden": tmp_path / "golden.json",
            "fleet": fleet}
