"""Playbooks (playbooks/*.yml) and task lists (tasks/*.yml): a run's sequence as data.

A playbook lists phases; each phase runs a task list over the hosts, either on every host at
once (``parallel``) or batch by batch (``batches``), and may name a ``rescue`` task list that
restores a host whose tasks failed (and, under ``on_failure: revert``, the hosts already
rolled when the roll stops). Everything is checked before any host is touched: unknown keys,
wrong types and values, unknown steps, parameters a step does not take.
"""

from __future__ import annotations

import reprlib
import typing
from collections.abc import Hashable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator

from tfsdeploy.core.errors import ConfigError, Problem
from tfsdeploy.core.inventory.schema import (
    INT32_MAX,
    ONE_DAY_S,
    NonNegativeInt32,
    Seconds,
    serial_step_problem,
)
from tfsdeploy.run.operations import registry
from tfsdeploy.run.operations.step import parameters

PHASE_MODES = ("parallel", "batches")


@dataclass(frozen=True)
class Task:
    """One step: an operation and its parameters."""

    name: str
    action: str
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Phase:
    """A named group of tasks run over the hosts in one mode, with its rescue tasks."""

    name: str
    mode: Literal["parallel", "batches"]
    tasks: tuple[Task, ...]
    rescue: tuple[Task, ...] = ()


@dataclass(frozen=True)
class Playbook:
    """A loaded playbook; None means "take the model's rollout setting"."""

    name: str
    phases: tuple[Phase, ...]
    serial: tuple[int | str, ...] | None = None
    max_fail_percentage: float | None = None
    on_failure: Literal["revert", "stay"] | None = None
    forks: int = 10


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class TaskSpec(_Strict):
    """One entry of a task list."""

    name: str | None = None
    action: str
    with_: dict[str, Any] = Field(default_factory=dict, alias="with")


class PhaseSpec(_Strict):
    """One phase of a playbook."""

    name: str = Field(min_length=1)
    mode: Literal["parallel", "batches"]
    tasks: str = Field(min_length=1)
    rescue: str | None = Field(default=None, min_length=1)


class PlaybookSpec(_Strict):
    """A playbook file."""

    name: str | None = None
    serial: list[int | str] | None = None
    max_fail_percentage: float | None = Field(default=None, ge=0, le=100, allow_inf_nan=False)
    on_failure: Literal["revert", "stay"] | None = None
    forks: int = Field(default=10, ge=1, le=100)
    phases: list[PhaseSpec] = Field(min_length=1)

    @field_validator("serial")
    @classmethod
    def _serial(cls, value: list[int | str] | None) -> list[int | str] | None:
        if value is None:
            return None
        if not value:
            raise ValueError("serial is empty: give batch sizes, e.g. [1, \"25%\", \"100%\"]")
        for step in value:  # the rule of the catalog's Rollout.serial, which this overrides
            reason = serial_step_problem(step)
            if reason is not None:
                raise ValueError(f"{reason}: write e.g. [1, \"25%\", \"100%\"]")
        return value


def validation_problems(error: ValidationError, *, file: str, where: str = "") -> list[Problem]:
    """A pydantic error as located problems (file and field path)."""
    problems = []
    for item in error.errors():
        # an empty key is a key too: quoted, or the problem would lose where it is
        path = ".".join([*([where] if where else []),
                         *(str(p) if p != "" else "''" for p in item["loc"])])
        problems.append(Problem(f"{path or 'the file'}: {item['msg']}",
                                fix="see the playbook format in docs/architecture.md",
                                file=file, field=path or None))
    return problems


def project_dir() -> Path:
    """The project checkout holding playbooks/ and tasks/."""
    return Path(__file__).resolve().parents[3]


def load_playbook(path: str | Path) -> Playbook:
    """Read and check a playbook and its task lists."""
    file = Path(path)
    try:
        spec = PlaybookSpec.model_validate(_yaml(file))
    except ValidationError as error:
        raise ConfigError(validation_problems(error, file=str(file))) from None
    tasks_dir = file.parent.parent / "tasks"
    phases, problems = [], []
    for index, p in enumerate(spec.phases):
        try:
            tasks = _task_list(tasks_dir, p.tasks, file, f"phases.{index}.tasks")
            rescue = _task_list(tasks_dir, p.rescue, file, f"phases.{index}.rescue") \
                if p.rescue else ()
        except ConfigError as error:
            problems += error.problems
            continue
        phases.append(Phase(p.name, p.mode, tasks, rescue))
    if problems:
        raise ConfigError(problems)
    return Playbook(name=spec.name or file.stem, phases=tuple(phases),
                    serial=tuple(spec.serial) if spec.serial else None,
                    max_fail_percentage=spec.max_fail_percentage, on_failure=spec.on_failure,
                    forks=spec.forks)


def _task_list(tasks_dir: Path, name: str, playbook: Path, field: str) -> tuple[Task, ...]:
    """The task list a phase names; one that is not there is the playbook's problem, located
    at the field that names it."""
    path = tasks_dir / name
    try:
        found = path.is_file()
    except OSError:  # a name the file system refuses (too long): not there either
        found = False
    if not found:
        raise ConfigError(Problem(f"task list {name!r} is not a file in {tasks_dir}",
                                  fix="name a task list of tasks/, e.g. roll_host.yml",
                                  file=str(playbook), field=field))
    return load_tasks(path)


def load_tasks(path: Path) -> tuple[Task, ...]:
    """Read a task list; every step must exist and accept the given parameters."""
    operations = registry()
    data = _yaml(path)
    if not isinstance(data, list):
        raise ConfigError(Problem("a task list is a YAML list of {name, action, with}",
                                  fix="start each task with '- name: ...'", file=str(path)))
    tasks, problems = [], []
    for index, raw in enumerate(data):
        try:
            spec = TaskSpec.model_validate(raw)
        except ValidationError as error:
            problems += validation_problems(error, file=str(path), where=f"[{index}]")
            continue
        if spec.action not in operations:
            problems.append(Problem(f"unknown action {spec.action!r}",
                                    fix=f"use one of: {', '.join(sorted(operations))}",
                                    file=str(path), field=f"[{index}].action"))
            continue
        accepted = parameters(operations[spec.action])
        unknown = set(spec.with_) - accepted
        if unknown:
            problems.append(Problem(f"action {spec.action!r} takes no parameter "
                                    f"{sorted(unknown)}",
                                    fix=f"it takes: {sorted(accepted) or 'nothing'}",
                                    file=str(path), field=f"[{index}].with"))
            continue
        wrong = _parameter_problems(operations[spec.action], spec.with_, str(path), index)
        rule = getattr(operations[spec.action], "check_params", None)
        if not wrong and rule is not None:
            wrong = [Problem(f"action {spec.action!r}: {text}", fix=text, file=str(path),
                             field=f"[{index}].with") for text in rule(spec.with_)]
        if wrong:
            problems += wrong
            continue
        tasks.append(Task(spec.name or spec.action, spec.action, dict(spec.with_)))
    if problems:
        raise ConfigError(problems)
    return tuple(tasks)


def _parameter_problems(operation: Any, params: dict[str, Any], file: str, index: int
                        ) -> list[Problem]:
    """Each parameter checked against the type the step declares for it, then a number
    against the range a run can use."""
    hints = typing.get_type_hints(operation)
    problems = []
    for key, value in params.items():
        for kind, fix in ((hints[key], f"give a {hints[key]}"), *_number_range(key, value)):
            try:
                TypeAdapter(kind).validate_python(value, strict=True)
            except ValidationError as error:
                problems.append(Problem(
                    f"parameter {key!r} of {operation.__name__!r} is {_SHORT.repr(value)}: "
                    f"{error.errors()[0]['msg']}", fix=fix, file=file,
                    field=f"[{index}].with.{key}"))
                break
        else:
            if any("\x00" in text for text in _strings(value)):
                problems.append(Problem(
                    f"parameter {key!r} of {operation.__name__!r} holds a NUL byte: no command "
                    "argument can carry one", fix="remove the \\0 from the value", file=file,
                    field=f"[{index}].with.{key}"))
    return problems


def _strings(value: Any) -> list[str]:
    """The strings in a parameter (an argument list, or one string)."""
    if isinstance(value, str):
        return [value]
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


# a value quoted in a message is cut short: a few hundred bytes of YAML aliases can make one
# whose full repr takes minutes and gigabytes
_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxstring, _SHORT.maxother = 2, 80, 80


def _number_range(key: str, value: Any) -> list[tuple[Any, str]]:
    """The range of a number given to a step. The types steps declare (float, int) take nan,
    inf and negatives: a nan deadline never comes (the gate polls forever), and a timeout
    too large for the OS's timers fails mid-roll."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return []
    if key.endswith("_s"):
        return [(Seconds, f"give seconds from 0 to {ONE_DAY_S:g} (a day)")]
    if isinstance(value, int):
        return [(NonNegativeInt32, f"give a whole number from 0 to {INT32_MAX}")]
    return [(Annotated[float, Field(ge=0, allow_inf_nan=False)], "give a number >= 0")]


class _UniqueKeysLoader(yaml.SafeLoader):
    """PyYAML's safe loader, except that a key written twice in one mapping is an error: YAML
    forbids it, and PyYAML would keep the last value without a word."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False
                          ) -> dict[Hashable, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<:` merges are overridden keys
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                repeated = key in seen
            except TypeError:  # an unhashable key: PyYAML's own check refuses it
                continue
            if repeated:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping", node.start_mark,
                    f"found the key {key!r} twice", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _yaml(path: Path) -> Any:
    try:
        found = path.is_file()
    except OSError:  # a name the file system refuses (too long): not there either
        found = False
    if not found:
        raise ConfigError(Problem(f"{path} does not exist", fix="check the file name",
                                  file=str(path)))
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise ConfigError(Problem(f"{path} cannot be read: {exc.strerror or exc}",
                                  fix="check the file's permissions", file=str(path))) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(Problem(f"the file is not UTF-8 text (byte {exc.start} is "
                                  f"{exc.object[exc.start:exc.start + 1]!r})",
                                  fix="save it as UTF-8", file=str(path))) from None
    try:
        return yaml.load(text, Loader=_UniqueKeysLoader)  # a SafeLoader
    except RecursionError:  # PyYAML composes nested collections recursively
        raise ConfigError(Problem("the YAML is nested too deeply to read",
                                  fix="flatten it: playbooks and task lists need a few levels",
                                  file=str(path))) from None
    except yaml.reader.ReaderError as exc:  # it counts characters, not lines
        line = text.count("\n", 0, exc.position) + 1
        raise ConfigError(Problem(f"YAML error: the control character {chr(exc.character)!r} "
                                  f"at line {line} is not allowed in YAML",
                                  fix="remove it, or write it as an escape in double quotes",
                                  file=str(path))) from None
    except yaml.YAMLError as exc:
        raise ConfigError(Problem(f"YAML error: {exc}", fix="fix the YAML syntax",
                                  file=str(path))) from exc
