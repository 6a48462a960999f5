"""Hostile-input battery for playbooks and task lists: the project's playbooks changed field by
field (wrong types, unknown keys and actions, junk batch sizes and percentages, on_failure
typos, non-finite and negative timeouts, custom ``local``/``remote`` steps with hostile argv,
task lists that are missing, outside tasks/ or the playbook itself), and files damaged as a
disk or an editor damages them (not UTF-8, cut short, tabs, duplicate keys, YAML bombs and
deep nesting within a few kilobytes, empty, a list where a mapping is wanted).

Whatever the input, ``load_playbook`` returns a playbook whose every value is one a run can
use, or raises ConfigError whose every problem says where it is (file, and the field or the
line) and how to fix it: never another exception. A deploy ``--check`` through the real
dispatcher with a generated ``--playbook`` against the unit tier's fake hosts either plans or
refuses the playbook before any host is contacted, and changes nothing either way.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
import tempfile
from collections import Counter
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given

from tfsdeploy.core.errors import ConfigError, Problem
from tfsdeploy.core.inventory.schema import ONE_DAY_S, serial_step_problem
from tfsdeploy.run.operations import registry
from tfsdeploy.run.playbook import PHASE_MODES, Playbook, Task, load_playbook, load_tasks

from .budget import examples
from .strategies import PlaybookCase, mutated_task_lists, playbook_cases

# how cli.output.print_error reports an exception nobody planned for
DEFECT = "a defect of tfsdeploy"
# a problem about a file as a whole (no field to name) says what the file must be, or the
# line where its YAML breaks
WHOLE_FILE = re.compile(r"line \d+|a YAML list|valid dictionary|UTF-8|nested|cannot be read")


def write_case(root: Path, case: PlaybookCase) -> Path:
    """The case as a project directory: playbooks/custom.yml beside tasks/*.yml."""
    (root / "playbooks").mkdir()
    (root / "tasks").mkdir()
    for name, data in case.task_lists.items():
        (root / "tasks" / name).write_bytes(data)
    path = root / "playbooks" / "custom.yml"
    path.write_bytes(case.playbook)
    return path


def assert_located(problems: list[Problem], root: Path) -> None:
    """Every problem names a file of the case (with its line when the YAML is broken), the
    field when there is one, what is wrong and how to fix it."""
    assert problems, "a ConfigError without a problem"
    for problem in problems:
        assert problem.message and problem.fix, problem
        assert problem.file, problem
        file = Path(re.sub(r":\d+$", "", problem.file))
        assert file.resolve().is_relative_to(root.resolve()), problem
        assert problem.field or WHOLE_FILE.search(problem.message), problem
        problem.render()


def step_values(value: Any) -> Iterator[Any]:
    """Every scalar inside a step's parameter."""
    if isinstance(value, dict):
        for item in value.values():
            yield from step_values(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from step_values(item)
    else:
        yield value


def assert_usable(playbook: Playbook) -> None:
    """What a run reads from a loaded playbook is in range: batch sizes as the catalog takes
    them, a percentage, known actions, and step parameters a command can carry (finite,
    not negative, seconds at most a day, no NUL byte)."""
    assert playbook.serial is None or all(serial_step_problem(s) is None
                                          for s in playbook.serial), playbook.serial
    assert playbook.max_fail_percentage is None or 0 <= playbook.max_fail_percentage <= 100
    assert playbook.on_failure in (None, "revert", "stay")
    assert 1 <= playbook.forks <= 100
    assert playbook.phases
    for phase in playbook.phases:
        assert phase.name and phase.mode in PHASE_MODES
        assert_usable_tasks((*phase.tasks, *phase.rescue))


def assert_usable_tasks(tasks: tuple[Task, ...]) -> None:
    """Known actions, and parameters a command can carry: finite, not negative, seconds at
    most a day, no NUL byte."""
    operations = registry()
    for task in tasks:
        assert task.action in operations
        for key, value in task.params.items():
            for item in step_values(value):
                if isinstance(item, int | float) and not isinstance(item, bool):
                    assert math.isfinite(item) and item >= 0, (task, key)
                    assert not key.endswith("_s") or item <= ONE_DAY_S, (task, key)
                if isinstance(item, str):
                    assert "\x00" not in item, (task, key)


def referenced(case: PlaybookCase) -> bool:
    """Whether the file given a duplicate key is one the loader reads (the generator damages
    the playbook or a task list the playbook names)."""
    return case.duplicated is not None


@examples(250)
@given(case=playbook_cases())
def generated_playbooks(outcomes: Counter[str], case: PlaybookCase) -> None:
    """One generated playbook (the battery: hypothesis runs it over its cases), counted in
    ``outcomes``."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        path = write_case(root, case)
        try:
            playbook = load_playbook(path)
        except ConfigError as error:
            outcomes["refused"] += 1
            assert_located(error.problems, root)
        else:
            outcomes["loaded"] += 1
            assert not referenced(case), f"the duplicate key in {case.duplicated} was taken"
            assert_usable(playbook)


def test_generated_playbooks_load_usable_or_are_refused_with_located_problems() -> None:
    outcomes: Counter[str] = Counter()
    generated_playbooks(outcomes)
    # a generator whose playbooks were all refused would test the first check of the loader
    # and nothing after it
    assert outcomes["loaded"] and outcomes["refused"], outcomes


@examples(200)
@given(entries=mutated_task_lists())
def mutated_task_list(outcomes: Counter[str], entries: Any) -> None:
    """One task list valid but for one parameter of one step (custom local/remote steps'
    argv, shell, timeouts; the gates' and checks' numbers), alone: no playbook around it is
    refused first. Counted in ``outcomes``."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "tasks.yml"
        path.write_text(yaml.safe_dump(entries, allow_unicode=True))
        try:
            tasks = load_tasks(path)
        except ConfigError as error:
            outcomes["refused"] += 1
            assert_located(error.problems, Path(tmp))
        else:
            outcomes["loaded"] += 1
            assert_usable_tasks(tasks)


def test_task_lists_changed_in_one_parameter_load_usable_or_are_refused() -> None:
    outcomes: Counter[str] = Counter()
    mutated_task_list(outcomes)
    assert outcomes["loaded"] and outcomes["refused"], outcomes


# -- deploy --check --playbook FILE, through the dispatcher, on the unit tier's fake hosts ---

@pytest.fixture(scope="module")
def fake_world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The unit tier's model source, golden outputs and two fake hosts (tests/unit/fakes.py)
    running version 1, behind `fab deploy --check`; every connection the check opens is
    counted."""
    from tests.unit import runs
    from tests.unit.fakes import FakeFleet, FakeSlot, rest_problems
    from tfsdeploy.run import deploy as cli_deploy

    tmp = tmp_path_factory.mktemp("fake-world")
    source = tmp / "models"
    golden: dict[str, Any] = {"version_details": {}}
    for version in (1, 2):  # as tests/unit/conftest.py: the fakes answer y = 0.5 x + v + 1
        (source / str(version)).mkdir(parents=True)
        (source / str(version) / "saved_model.pb").write_bytes(b"pb")
        golden["version_details"][str(version)] = {"golden": [{
            "signature": "serving_default",
            "inputs": {"x": {"dtype": "DT_FLOAT", "shape": [1, 1], "values": [[1.0]]}},
            "outputs": {"y": {"dtype": "DT_FLOAT", "shape": [1, 1],
                              "values": [[1.5 + version]]}}}]}
    (tmp / "golden.json").write_text(json.dumps(golden))
    fleet = FakeFleet()
    connections: list[str] = []

    def connect(host: Any) -> Any:
        connections.append(host.name)
        return fleet.connect(host)

    world = {"tmp": tmp, "source": source, "golden": tmp / "golden.json", "fleet": fleet,
             "connections": connections}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("tfsdeploy.hosts.probes.rest_problems", partial(rest_problems, fleet))
        patch.setattr(FakeSlot, "behaviour", {})
        patch.setattr(FakeSlot, "fleet", fleet, raising=False)
        patch.setattr(cli_deploy, "check", partial(cli_deploy.check, connect=connect))
        world["inventory"] = runs.inventory_file(world, count=2)
        # a release on every host: the check plans a roll, with files and containers to keep
        assert runs.run_deploy(world, 1, count=2).exit_code == 0
        yield world


def host_files(world: dict[str, Any]) -> dict[str, bytes]:
    """Every file in the fake hosts' data roots (h1/r, h2/r), by path."""
    return {str(p): p.read_bytes() for p in world["tmp"].glob("h*/r/**/*") if p.is_file()}


@examples(40)
@given(case=playbook_cases())
def checked_playbook(fake_world: dict[str, Any], outcomes: Counter[str],
                     case: PlaybookCase) -> None:
    """`fab deploy --check` with one generated playbook (the battery: hypothesis runs it over
    its cases), counted in ``outcomes``."""
    from tfsdeploy.cli.main import main

    fleet = fake_world["fleet"]
    before = host_files(fake_world)
    calls = {name: len(host.docker.calls) for name, host in fleet.hosts.items()}
    fake_world["connections"].clear()
    with tempfile.TemporaryDirectory() as tmp:
        path = write_case(Path(tmp), case)
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main("deploy", {
                "c": None, "model": "hp2", "inventory": fake_world["inventory"], "hosts": None,
                "limit": None, "version": "2", "playbook": str(path), "check": True,
                "diff": False, "json": False, "lock_wait": "0", "log_file": None,
                "json_file": None, "metrics_file": None})
        try:
            load_playbook(path)
            valid = True
        except ConfigError:
            valid = False
    printed = out.getvalue() + err.getvalue()
    assert "Traceback" not in printed and DEFECT not in printed, printed
    if valid:
        outcomes["planned"] += 1
        assert code == 0, printed
        assert "nothing was changed" in printed
    else:
        outcomes["refused"] += 1
        assert code == 1 and "invalid input" in printed, printed
        assert fake_world["connections"] == []  # refused before any host was contacted
    assert host_files(fake_world) == before
    changed = [(name, call) for name, host in fleet.hosts.items()
               for call in host.docker.calls[calls.get(name, 0):]
               if call[0] in ("run", "start", "stop", "remove", "pull", "remove_image")]
    assert changed == []


def test_deploy_check_with_a_generated_playbook_plans_or_refuses_before_any_host(
        fake_world: dict[str, Any]) -> None:
    outcomes: Counter[str] = Counter()
    checked_playbook(fake_world, outcomes)
    assert outcomes["planned"] and outcomes["refused"], outcomes
