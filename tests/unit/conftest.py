"""Fixtures of the rollout tier: a model source with three versions and golden outputs, and a
fleet of fake hosts (tests/unit/fakes.py) whose REST side answers from their containers."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from .fakes import FakeFleet, FakeSlot, rest_problems


@pytest.fixture(autouse=True)
def _private_state(tmp_path_factory: pytest.TempPathFactory,
                   monkeypatch: pytest.MonkeyPatch) -> Path:
    """This machine's state (the journal of boots the lock keeps) in a directory of the
    test's own, never the user's."""
    state = tmp_path_factory.mktemp("state")
    monkeypatch.setenv("XDG_STATE_HOME", str(state))
    return state


@pytest.fixture()
def fake_rest(monkeypatch: pytest.MonkeyPatch) -> FakeFleet:
    """The REST gate's probe answers from the fake hosts' containers."""
    fleet = FakeFleet()
    monkeypatch.setattr("tfsdeploy.hosts.probes.rest_problems", partial(rest_problems, fleet))
    return fleet


@pytest.fixture()
def world(tmp_path: Path, fake_rest: FakeFleet) -> dict[str, Any]:
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
    FakeSlot.load_error = "Could not load the SavedModel"
    FakeSlot.fleet = fake_rest
    return {"tmp": tmp_path, "source": source, "golden": tmp_path / "golden.json",
            "fleet": fake_rest}
