"""Playbooks and task lists are checked before any host is touched, every problem located;
a custom playbook's rescue list is what a failed host runs."""

from __future__ import annotations

import shutil
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from tfsdeploy.core.errors import ConfigError, ExitCode

from . import runs
from .fakes import FakeFleet, FakeSlot, read_json
from .runs import manifest

# two hosts are enough for what these tests show
run_deploy = partial(runs.run_deploy, count=2)

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = (ROOT / "playbooks" / "deploy.yml").read_text()


def _project(world: dict[str, Any], playbook: str, tasks: dict[str, str] | None = None) -> str:
    """A playbook beside a copy of the project's task lists (some replaced)."""
    root = world["tmp"] / "project"
    shutil.copytree(ROOT / "tasks", root / "tasks", dirs_exist_ok=True)
    for name, text in (tasks or {}).items():
        (root / "tasks" / name).write_text(text)
    (root / "playbooks").mkdir(exist_ok=True)
    path = root / "playbooks" / "custom.yml"
    path.write_text(playbook)
    return str(path)


BAD_PLAYBOOKS = {
    "serial": (DEPLOY.replace("serial: null", 'serial: ["abc"]'), "serial", "'abc'"),
    "max_fail_percentage": (DEPLOY.replace("max_fail_percentage: null",
                                           'max_fail_percentage: "ten"'),
                            "max_fail_percentage", "number"),
    "on_failure": (DEPLOY.replace("on_failure: null", "on_failure: revrt"), "on_failure",
                   "'revert' or 'stay'"),
    "unknown key": (DEPLOY.replace("forks: 10", "forks: 10\nretries: 3"), "retries",
                    "Extra inputs are not permitted"),
    "unknown phase key": (DEPLOY.replace("    tasks: stage.yml", "    tasks: stage.yml\n"
                                         "    when: always"), "phases.1.when",
                          "Extra inputs are not permitted"),
}


@pytest.mark.parametrize("case", list(BAD_PLAYBOOKS))
def test_a_bad_playbook_is_a_located_error_before_any_host_is_touched(
        world: dict[str, Any], case: str) -> None:
    text, field, words = BAD_PLAYBOOKS[case]
    run_deploy(world, 1)
    fleet: FakeFleet = world["fleet"]
    before = {n: (len(h.log), len(h.docker.calls)) for n, h in fleet.hosts.items()}
    path = _project(world, text)
    with pytest.raises(ConfigError) as error:
        run_deploy(world, 2, playbook=path)
    assert error.value.exit_code == ExitCode.INVALID
    (problem,) = error.value.problems
    assert (problem.file, problem.field) == (path, field), problem
    assert words in problem.message and field in problem.message
    assert {n: (len(h.log), len(h.docker.calls)) for n, h in fleet.hosts.items()} == before


def test_a_task_parameter_of_the_wrong_type_is_a_located_error(world: dict[str, Any]) -> None:
    preflight = (ROOT / "tasks" / "preflight.yml").read_text().replace(
        "with: {reserve_mib: 512}", 'with: {reserve_mib: "lots"}')
    path = _project(world, DEPLOY, {"preflight.yml": preflight})
    with pytest.raises(ConfigError) as error:
        run_deploy(world, 1, playbook=path)
    (problem,) = error.value.problems
    assert problem.file == str(Path(path).parent.parent / "tasks" / "preflight.yml")
    assert problem.field == "[5].with.reserve_mib"
    assert "'lots'" in problem.message and "check_disk" in problem.message
    assert not world["fleet"].hosts  # no host was even connected


def test_a_custom_rescue_list_is_what_a_failed_host_runs(world: dict[str, Any]) -> None:
    first = run_deploy(world, 1)
    rescue = ("- name: back to the old slot\n  action: switch_traffic\n  with: {to: old}\n"
              "- name: remove the new container\n  action: remove_new\n")
    path = _project(world, DEPLOY.replace("rescue: restore_host.yml", "rescue: mine.yml"),
                    {"mine.yml": rescue})
    FakeSlot.behaviour = {"10.9.0.1": "broken"}
    result = run_deploy(world, 2, playbook=path)
    assert result.exit_code == ExitCode.ROLLED_BACK, result.message
    h1 = result.hosts["h1"]
    assert h1.status == "restored"
    assert [s["step"] for s in h1.steps if s["phase"] == "restore"] == ["switch_traffic",
                                                                         "remove_new"]
    host = world["fleet"]["h1"]
    assert host.running("hp2") == [first.release_id]
    # the default rescue would have recorded the attempt as failed; this one does not
    assert read_json(manifest(host, result.release_id))["status"] == "starting"
