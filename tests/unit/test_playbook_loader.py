"""The playbook loader on the inputs the hostile-input battery (tests/property) found it
mishandling: each is refused with a located problem, or never loads a value a run cannot use."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tfsdeploy.core.errors import ConfigError, Problem
from tfsdeploy.run.playbook import load_playbook

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = (ROOT / "playbooks" / "deploy.yml").read_text()


def project(tmp_path: Path, playbook: str | bytes, tasks: dict[str, str | bytes] | None = None
            ) -> Path:
    """playbooks/custom.yml beside a copy of the project's task lists (some added)."""
    shutil.copytree(ROOT / "tasks", tmp_path / "tasks")
    for name, text in (tasks or {}).items():
        data = text.encode() if isinstance(text, str) else text
        (tmp_path / "tasks" / name).write_bytes(data)
    (tmp_path / "playbooks").mkdir()
    path = tmp_path / "playbooks" / "custom.yml"
    path.write_bytes(playbook.encode() if isinstance(playbook, str) else playbook)
    return path


def refused(path: Path) -> list[Problem]:
    with pytest.raises(ConfigError) as caught:
        load_playbook(path)
    return caught.value.problems


def test_missing_task_lists_are_located_at_the_fields_naming_them(tmp_path: Path) -> None:
    text = DEPLOY.replace("tasks: stage.yml", "tasks: stages.yml")
    text = text.replace("rescue: restore_host.yml", f"rescue: {'x' * 300}.yml")
    path = project(tmp_path, text)
    problems = refused(path)
    assert [(p.file, p.field) for p in problems] == [(str(path), "phases.1.tasks"),
                                                     (str(path), "phases.2.rescue")]
    assert "'stages.yml' is not a file" in problems[0].message


@pytest.mark.parametrize("data", [b"name: \xff\n", DEPLOY.encode("utf-16"),
                                  ("# é\n" + DEPLOY).encode("latin-1")],
                         ids=["invalid byte", "UTF-16", "Latin-1"])
def test_a_file_that_is_not_utf8_is_refused_at_its_file(tmp_path: Path, data: bytes) -> None:
    problems = refused(project(tmp_path, DEPLOY, {"stage.yml": data}))
    assert [(p.file, p.field) for p in problems] == [(str(tmp_path / "tasks" / "stage.yml"),
                                                      None)]
    assert "is not UTF-8 text" in problems[0].message


def test_a_playbook_path_the_file_system_refuses_is_refused(tmp_path: Path) -> None:
    problems = refused(tmp_path / ("x" * 300))
    assert "does not exist" in problems[0].message


@pytest.mark.parametrize("data", [b"[" * 3000 + b"]" * 3000, b"{a: " * 3000 + b"1" + b"}" * 3000,
                                  b"- " * 3000 + b"x\n"], ids=["lists", "mappings", "block"])
def test_deep_nesting_in_a_few_kilobytes_is_refused_at_its_file(tmp_path: Path,
                                                                data: bytes) -> None:
    path = project(tmp_path, data)
    problems = refused(path)
    assert [(p.file, p.message) for p in problems] == [
        (str(path), "the YAML is nested too deeply to read")]


def test_a_key_written_twice_is_refused_with_its_line(tmp_path: Path) -> None:
    path = project(tmp_path, DEPLOY + "on_failure: revert\n")
    problems = refused(path)
    assert len(problems) == 1 and problems[0].file == str(path)
    assert "found the key 'on_failure' twice" in problems[0].message
    assert f"line {len(DEPLOY.splitlines()) + 1}," in problems[0].message


def test_a_task_with_two_actions_is_refused(tmp_path: Path) -> None:
    path = project(tmp_path, DEPLOY, {"stage.yml": "- action: stage_model\n  action: local\n"})
    problems = refused(path)
    assert problems[0].file == str(tmp_path / "tasks" / "stage.yml")
    assert "found the key 'action' twice" in problems[0].message


def test_a_key_a_merge_brings_may_be_overridden(tmp_path: Path) -> None:
    path = project(tmp_path, "phases:\n  - <<: {name: a, mode: parallel, tasks: x.yml}\n"
                             "    tasks: stage.yml\n")
    assert load_playbook(path).phases[0].tasks[0].action == "stage_model"


STEPS_WITH_NUMBERS = {
    "nan timeout": ("- action: gate_rest\n  with: {timeout_s: .nan}\n", "timeout_s"),
    "inf timeout": ("- action: local\n  with: {argv: [echo], timeout_s: .inf}\n", "timeout_s"),
    "negative timeout": ("- action: gate_available\n  with: {timeout_s: -1}\n", "timeout_s"),
    "timeout beyond a day": ("- action: remote\n  with: {shell: 'true', timeout_s: 1.0e+308}\n",
                             "timeout_s"),
    "negative count": ("- action: gate_warmup\n  with: {rounds: -5}\n", "rounds"),
    "huge count": ("- action: check_disk\n  with: {reserve_mib: 100000000000000000000}\n",
                   "reserve_mib"),
}


@pytest.mark.parametrize("case", list(STEPS_WITH_NUMBERS))
def test_a_step_number_a_run_cannot_use_is_refused(tmp_path: Path, case: str) -> None:
    tasks, key = STEPS_WITH_NUMBERS[case]
    problems = refused(project(tmp_path, DEPLOY, {"stage.yml": tasks}))
    assert [(p.file, p.field) for p in problems] == [(str(tmp_path / "tasks" / "stage.yml"),
                                                      f"[0].with.{key}")]


def test_step_numbers_in_range_load(tmp_path: Path) -> None:
    tasks = ("- action: gate_rest\n  with: {timeout_s: 86400}\n"
             "- action: gate_available\n  with: {timeout_s: 0.5}\n"
             "- action: check_disk\n  with: {reserve_mib: 0}\n")
    stage = load_playbook(project(tmp_path, DEPLOY, {"stage.yml": tasks})).phases[1].tasks
    assert [t.params for t in stage] == [{"timeout_s": 86400}, {"timeout_s": 0.5},
                                         {"reserve_mib": 0}]


@pytest.mark.parametrize("tasks", [
    '- action: local\n  with: {argv: ["echo", "a\\0b"]}\n',
    '- action: remote\n  with: {argv: ["\\0"]}\n',
    '- action: remote\n  with: {shell: "echo \\0"}\n',
], ids=["local argv", "remote argv", "remote shell"])
def test_a_nul_byte_in_a_command_is_refused(tmp_path: Path, tasks: str) -> None:
    problems = refused(project(tmp_path, DEPLOY, {"stage.yml": tasks}))
    assert len(problems) == 1 and problems[0].field in ("[0].with.argv", "[0].with.shell")
    assert "NUL byte" in problems[0].message


def test_a_yaml_bomb_of_a_few_hundred_bytes_is_refused_with_a_short_message(
        tmp_path: Path) -> None:
    lines = ["- action: check_ssh", "  name: &l0 [a, a, a, a, a, a, a, a, a, a]"]
    lines += [f"  k{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 10) + "]" for i in range(1, 7)]
    tasks = "\n".join([*lines, "- action: local\n  with: {argv: *l6}\n"])  # 10**7 strings
    assert len(tasks) < 500
    problems = refused(project(tmp_path, DEPLOY, {"stage.yml": tasks}))
    assert [p.field for p in problems] == ["[0].name", "[0].k1", "[0].k2", "[0].k3", "[0].k4",
                                           "[0].k5", "[0].k6", "[1].with.argv"]
    assert max(len(p.render()) for p in problems) < 1000


@pytest.mark.parametrize("serial", ['["100.5%"]', "[1, 100000000000000000000]", '["150%"]',
                                    "[0]", '["ten"]'])
def test_batch_sizes_follow_the_catalogs_rule(tmp_path: Path, serial: str) -> None:
    problems = refused(project(tmp_path, DEPLOY.replace("serial: null", f"serial: {serial}")))
    assert [p.field for p in problems] == ["serial"]
    assert "neither a positive count nor a percentage in (0, 100]" in problems[0].message


def test_a_fraction_of_a_percent_is_a_batch_size(tmp_path: Path) -> None:
    path = project(tmp_path, DEPLOY.replace("serial: null", 'serial: [1, "0.5%", "100%"]'))
    assert load_playbook(path).serial == (1, "0.5%", "100%")


def test_an_empty_rescue_name_is_refused_not_taken_for_no_rescue(tmp_path: Path) -> None:
    problems = refused(project(tmp_path, DEPLOY.replace("rescue: restore_host.yml",
                                                        'rescue: ""')))
    assert [p.field for p in problems] == ["phases.2.rescue"]


def test_an_empty_key_is_located(tmp_path: Path) -> None:
    path = project(tmp_path, DEPLOY + "'': x\n", {"stage.yml": "- action: stage_model\n  '': 1\n"})
    assert [p.field for p in refused(path)] == ["''"]
    fixed = project(tmp_path / "tasks-only", DEPLOY, {"stage.yml": "- {action: x, '': 1}\n"})
    assert [p.field for p in refused(fixed)] == ["[0].''"]


def test_a_control_character_is_refused_with_its_line(tmp_path: Path) -> None:
    path = project(tmp_path, DEPLOY.replace("forks: 10", "forks: 1\x000"))
    problems = refused(path)
    line = DEPLOY.splitlines().index("forks: 10") + 1
    assert [(p.file, p.message) for p in problems] == [
        (str(path), f"YAML error: the control character '\\x00' at line {line} is not allowed "
                    "in YAML")]
