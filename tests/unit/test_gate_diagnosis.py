"""A failed gate's known failure on fake hosts: its cause and fix under the gate's progress
line, in the summary table, in the JSON result and in the failed release's record."""

from __future__ import annotations

import json
from functools import partial
from typing import Any

import pytest

from tfsdeploy.cli.main import main
from tfsdeploy.cli.output import summary_rows
from tfsdeploy.core.errors import ExitCode
from tfsdeploy.run import deploy as cli_deploy

from .fakes import FakeFleet, FakeSlot, FrozenClock
from .runs import MODEL, Recorder, inventory_file, manifest, run_deploy, serving

# what the testbed's server reports for half_plus_two_bad/18 (TensorFlow's ReadVariableOp)
NOT_RESTORED = ("FAILED_PRECONDITION: Could not find variable dense/kernel. This could mean "
                "that the variable has been deleted. In TF1, it can also mean the variable is "
                "uninitialized. Debug info: container=localhost, status error message=Resource "
                "localhost/dense/kernel/N10tensorflow3VarE does not exist.")


def _failed_detail(recorder: Recorder, step: str) -> str:
    index = recorder.steps.index(("h1", "roll", step, "failed"))
    return recorder.details[index]


def test_a_known_load_failure_is_diagnosed_everywhere_it_is_reported(
        world: dict[str, Any]) -> None:
    first = run_deploy(world, 1)
    FakeSlot.behaviour = {"10.9.0.1": "broken"}
    FakeSlot.load_error = NOT_RESTORED
    recorder = Recorder()
    result = run_deploy(world, 2, recorder)
    assert result.exit_code == ExitCode.ROLLED_BACK
    assert serving(world["fleet"]["h1"]) == [first.release_id]
    detail = _failed_detail(recorder, "gate_available")
    lines = detail.splitlines()
    assert lines[0].startswith("gate_available: expected version 2 AVAILABLE; saw END: "
                               "FAILED_PRECONDITION: Could not find variable dense/kernel")
    assert lines[1].startswith("    cause: variable 'dense/kernel' is not restored")
    assert lines[2].startswith("    fix: re-export the model with Keras's model.export(path)")
    assert lines[3].startswith("    evidence: END: FAILED_PRECONDITION: Could not find")
    outcome = result.as_dict()["hosts"]["h1"]
    assert outcome["diagnosis"]["kind"] == "variables_not_restored"
    assert "model.export" in outcome["diagnosis"]["fix"]
    record = json.loads(manifest(world["fleet"]["h1"], result.release_id).read_text())
    assert record["status"] == "failed" and record["diagnosis"] == outcome["diagnosis"]
    row = next(r for r in summary_rows(result) if r[0] == "h1")
    assert row[-1].splitlines()[1:] == [f"cause: {outcome['diagnosis']['cause']}",
                                        f"fix: {outcome['diagnosis']['fix']}"]


def test_a_signature_mismatch_names_the_signatures_the_model_serves(
        world: dict[str, Any]) -> None:
    run_deploy(world, 1)
    FakeSlot.behaviour = {"10.9.0.1": "renamed"}
    recorder = Recorder()
    result = run_deploy(world, 2, recorder)
    assert result.exit_code == ExitCode.ROLLED_BACK
    found = result.hosts["h1"].diagnosis
    assert found is not None and found["kind"] == "signature_mismatch"
    assert "takes z DT_FLOAT [-1, 1] and returns w DT_FLOAT [-1, 1]" in found["cause"]
    assert "the model's signatures: serving_default (z -> w)" in found["fix"]
    assert "    fix: re-export the model so that 'serving_default'" in _failed_detail(
        recorder, "gate_signature")
    record = json.loads(manifest(world["fleet"]["h1"], result.release_id).read_text())
    assert record["diagnosis"] == found


def test_an_unknown_failure_keeps_the_report_it_had(world: dict[str, Any]) -> None:
    run_deploy(world, 1)
    FakeSlot.behaviour = {"10.9.0.1": "broken"}
    recorder = Recorder()
    result = run_deploy(world, 2, recorder)
    assert result.exit_code == ExitCode.ROLLED_BACK
    assert result.hosts["h1"].diagnosis is None
    assert "cause:" not in _failed_detail(recorder, "gate_available")
    record = json.loads(manifest(world["fleet"]["h1"], result.release_id).read_text())
    assert record["diagnosis"] is None
    row = next(r for r in summary_rows(result) if r[0] == "h1")
    assert "\n" not in row[-1] and "saw END: Could not load" in row[-1]


@pytest.mark.parametrize("as_json", [False, True])
def test_fab_deploy_prints_the_cause_and_fix(world: dict[str, Any],
                                             monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str],
                                             as_json: bool) -> None:
    fleet: FakeFleet = world["fleet"]
    monkeypatch.setattr(cli_deploy, "deploy", partial(
        cli_deploy.deploy, connect=fleet.connect, clock=FrozenClock(), client_factory=FakeSlot))
    json_file = world["tmp"] / "deploy.json"
    args = {"c": None, "model": MODEL, "inventory": inventory_file(world), "hosts": None,
            "limit": None, "playbook": None, "lock_wait": 0.0, "json": as_json,
            "log_file": None, "json_file": str(json_file), "metrics_file": None,
            "version": None, "check": False, "diff": False}
    assert main("deploy", args | {"version": "1"}) == 0
    capsys.readouterr()
    FakeSlot.behaviour = {"10.9.0.1": "broken"}
    FakeSlot.load_error = NOT_RESTORED
    assert main("deploy", args | {"version": "2"}) == ExitCode.ROLLED_BACK
    out, err = capsys.readouterr()
    written = json.loads(json_file.read_text())["hosts"]["h1"]["diagnosis"]
    assert written["kind"] == "variables_not_restored"
    progress = err if as_json else out
    assert "    cause: variable 'dense/kernel' is not restored" in progress
    assert "    fix: re-export the model with Keras's model.export(path)" in progress
    if as_json:
        assert json.loads(out)["hosts"]["h1"]["diagnosis"] == written
    else:
        table = out[out.index("deploy hp2 v2"):]
        assert "cause: variable 'dense/kernel'" in table and "fix: re-export" in table


def test_the_summary_s_gate_column_takes_the_steps_the_run_marked_as_gates() -> None:
    """The gates column follows the run's own marking of each step (the operations'
    registry), never a step's name: the canary's judged steps are a gate, the GPU holding
    check is not."""
    from tfsdeploy.run.engine import HostOutcome, RunResult

    def step(name: str, seconds: float, gate: bool) -> dict[str, Any]:
        return {"phase": "roll", "step": name, "ok": True, "seconds": seconds, "detail": "",
                "gate": gate}

    result = RunResult(MODEL, 2, "r2", hosts={"h1": HostOutcome("h1", "rolled", steps=[
        step("start_slot", 1.0, False), step("gate_available", 2.0, True),
        step("gate_gpu_memory", 0.1, False), step("canary_steps", 6.0, True)])})
    (row,) = summary_rows(result)
    assert row[2:4] == ("roll 9.1s", "available 2.0s canary_steps 6.0s")
