"""A playbook's own `remote` step runs its argv as given, with the run's variables in its
environment: an argv whose first word holds '=' (which `env` took for one more assignment)
or starts with '-' names the program that runs. On fake hosts, whose commands run for real
through sh, quoted once as SSH quotes them."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from tfsdeploy.hosts.commands.steps import RUN_AS_GIVEN, remote_step

from .fakes import FakeFleet
from .runs import run_deploy

ROOT = Path(__file__).resolve().parents[2]
STEPS = '''
- name: a step whose argv starts with an assignment
  action: remote
  with: {argv: ["MARK=d/prog", "first", "--second"]}
- name: a step whose argv starts with a dash
  action: remote
  with: {argv: ["-d/prog", "-x", "NAME=y"]}
'''


def _playbook(world: dict[str, Any]) -> str:
    """The project's deploy playbook with the two steps after its preflight."""
    root = world["tmp"] / "project"
    shutil.copytree(ROOT / "tasks", root / "tasks")
    with (root / "tasks" / "preflight.yml").open("a") as tasks:
        tasks.write(STEPS)
    (root / "playbooks").mkdir()
    shutil.copy(ROOT / "playbooks" / "deploy.yml", root / "playbooks" / "custom.yml")
    return str(root / "playbooks" / "custom.yml")


def _program(host_dir: Path, place: str) -> Path:
    """An executable at ``place``/prog in the host's working directory, recording its argv
    and TFSDEPLOY_HOST in ``place``/ran.txt."""
    (host_dir / place).mkdir()
    program = host_dir / place / "prog"
    # `--`: the kernel hands the script's path to its interpreter, and sh would take a path
    # starting with '-' for its options
    program.write_text('#!/bin/sh --\nprintf "%s|" "$0" "$@" "$TFSDEPLOY_HOST" >> '
                       f'"{host_dir / place / "ran.txt"}"\n')
    program.chmod(0o755)
    return host_dir / place / "ran.txt"


def test_a_remote_step_runs_an_argv_starting_with_name_or_dash_as_given(
        world: dict[str, Any]) -> None:
    assert run_deploy(world, 1, count=1).exit_code == 0
    fleet: FakeFleet = world["fleet"]
    marked, dashed = (_program(fleet["h1"].dir, place) for place in ("MARK=d", "-d"))
    result = run_deploy(world, 2, playbook=_playbook(world), count=1)
    assert result.exit_code == 0, result.message
    assert marked.read_text() == "MARK=d/prog|first|--second|h1|"
    assert dashed.read_text() == "-d/prog|-x|NAME=y|h1|"


def test_the_step_s_command_is_env_then_sh_running_its_parameters() -> None:
    assert remote_step({"B": "2", "A": "1"}, ["X=1", "-y"]) == [
        "env", "A=1", "B=2", "sh", "-c", RUN_AS_GIVEN, "X=1", "-y"]
