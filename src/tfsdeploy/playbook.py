"""Playbooks (playbooks/*.yml) and task lists (tasks/*.yml): the deploy sequence as data.

Everything is checked before any host is touched: unknown keys, unknown actions, parameters an
action does not take.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from tfsdeploy.errors import ConfigError, Problem

PHASE_MODES = ("parallel", "batches")


@dataclass(frozen=True)
class Task:
    """One step: an action and its parameters."""

    name: str
    action: str
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Phase:
    """A named group of tasks run over the hosts in one mode."""

    name: str
    mode: Literal["parallel", "batches"]
    tasks: tuple[Task, ...]


@dataclass(frozen=True)
class Playbook:
    """A loaded playbook; None means "take the model's rollout setting"."""

    name: str
    phases: tuple[Phase, ...]
    serial: tuple[int | str, ...] | None = None
    max_fail_percentage: float | None = None
    on_failure: str | None = None
    forks: int = 10


def project_dir() -> Path:
    """The project checkout holding playbooks/ and tasks/."""
    return Path(__file__).resolve().parents[2]


def load_playbook(path: str | Path) -> Playbook:
    """Read and check a playbook and its task lists."""
    from tfsdeploy.actions import ACTIONS

    file = Path(path)
    data = _yaml(file)
    _only(data, {"name", "serial", "max_fail_percentage", "on_failure", "forks", "phases"},
          str(file), "")
    phases = []
    for index, raw in enumerate(data.get("phases") or []):
        where = f"phases[{index}]"
        _only(raw, {"name", "mode", "tasks"}, str(file), where)
        if raw.get("mode") not in PHASE_MODES:
            raise ConfigError(Problem(f"{where}.mode is {raw.get('mode')!r}",
                                      fix=f"use one of {', '.join(PHASE_MODES)}",
                                      file=str(file), field=f"{where}.mode"))
        task_file = file.parent.parent / "tasks" / str(raw.get("tasks"))
        phases.append(Phase(str(raw.get("name", where)), raw["mode"],
                            load_tasks(task_file, ACTIONS)))
    if not phases:
        raise ConfigError(Problem("the playbook has no phases", fix="list phases: [...]",
                                  file=str(file), field="phases"))
    serial = data.get("serial")
    return Playbook(name=str(data.get("name", file.stem)), phases=tuple(phases),
                    serial=tuple(serial) if serial else None,
                    max_fail_percentage=data.get("max_fail_percentage"),
                    on_failure=data.get("on_failure"), forks=int(data.get("forks", 10)))


def load_tasks(path: Path, actions: dict[str, Any]) -> tuple[Task, ...]:
    """Read a task list; every action must exist and accept the given parameters."""
    data = _yaml(path)
    if not isinstance(data, list):
        raise ConfigError(Problem("a task list is a YAML list of {name, action, with}",
                                  fix="start each task with '- name: ...'", file=str(path)))
    tasks = []
    for index, raw in enumerate(data):
        where = f"[{index}]"
        _only(raw, {"name", "action", "with"}, str(path), where)
        name = raw.get("action")
        if name not in actions:
            raise ConfigError(Problem(f"unknown action {name!r}",
                                      fix=f"use one of: {', '.join(sorted(actions))}",
                                      file=str(path), field=f"{where}.action"))
        params = dict(raw.get("with") or {})
        accepted = set(inspect.signature(actions[name]).parameters) - {"job"}
        unknown = set(params) - accepted
        if unknown:
            raise ConfigError(Problem(f"action {name!r} takes no parameter {sorted(unknown)}",
                                      fix=f"it takes: {sorted(accepted) or 'nothing'}",
                                      file=str(path), field=f"{where}.with"))
        tasks.append(Task(str(raw.get("name", name)), name, params))
    return tuple(tasks)


def _yaml(path: Path) -> Any:
    if not path.is_file():
        raise ConfigError(Problem(f"{path} does not exist", fix="check the file name",
                                  file=str(path)))
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(Problem(f"YAML error: {exc}", fix="fix the YAML syntax",
                                  file=str(path))) from exc


def _only(data: Any, allowed: set[str], file: str, where: str) -> None:
    if not isinstance(data, dict):
        raise ConfigError(Problem(f"{where or 'the file'} must be a mapping",
                                  fix="write key: value pairs", file=file, field=where))
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise ConfigError(Problem(f"unknown key(s) {unknown}", fix=f"allowed: {sorted(allowed)}",
                                  file=file, field=where))
