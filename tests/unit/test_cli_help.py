"""What a newcomer types first: `fab --list`, `fab TASK --help`, `fab --help TASK`, run as a
user runs them, from the repository root."""

from __future__ import annotations

import functools
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from invoke.parser import Parser

import tasks

ROOT = Path(__file__).resolve().parents[2]
FAB = str(Path(sys.executable).with_name("fab"))
TASKS = sorted(tasks.ns.task_names)
CONTEXTS = {context.name: context for context in tasks.ns.to_contexts()}


@functools.cache
def _fab(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, TFSDEPLOY_TESTBED_DIR="/nonexistent/no-testbed")
    return subprocess.run([FAB, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=60, check=False)


@pytest.mark.parametrize("name", TASKS)
def test_help_after_or_before_the_task_prints_its_help(name: str) -> None:
    after, before = _fab(name, "--help"), _fab("--help", name)
    assert after.returncode == 0, after.stdout + after.stderr
    assert after.stdout.startswith(f"Usage: fab [--core-opts] {name} "), after.stdout
    assert "Options:" in after.stdout and after.stderr == ""
    assert (before.returncode, before.stdout) == (0, after.stdout)


@pytest.mark.parametrize("name", TASKS)
def test_every_option_that_takes_a_value_names_it(name: str) -> None:
    shown = _fab(name, "--help").stdout
    flags = [flag for flag, argument in CONTEXTS[name].flags.items() if argument.takes_value]
    assert flags
    for flag in flags:
        found = re.search(rf"^  {flag}=([A-Z]+) ", shown, re.MULTILINE)
        assert found and found[1] not in ("STRING", "INT"), f"fab {name} --help: {flag}"


def _listed() -> dict[str, str]:
    """`fab --list`: task name -> its summary, the wrapped lines joined."""
    result = _fab("--list")
    assert result.returncode == 0, result.stderr
    listed: dict[str, str] = {}
    name = ""
    for line in result.stdout.splitlines()[1:]:
        if re.match(r"  \S", line):
            name, text = line.split(maxsplit=1)
            listed[name] = text
        elif line.strip():  # a continuation; textwrap may break after a word's hyphen
            joint = "" if listed[name].endswith("-") else " "
            listed[name] += joint + line.strip()
    return listed


def test_fab_list_shows_each_task_s_whole_first_sentence() -> None:
    listed = _listed()
    assert sorted(listed) == TASKS
    for name in TASKS:
        docstring = " ".join((inspect.getdoc(tasks.ns[name]) or "").split())
        first = re.match(r"(.+?\.)(?:\s|$)", docstring)
        assert first, name
        assert listed[name] == first[1], f"fab --list, {name}: {listed[name]!r}"


def test_a_required_option_left_out_is_named_with_its_fix() -> None:
    result = _fab("deploy")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "[field --model] --model is required" in result.stderr
    assert "fix: give --model MODEL (`fab deploy --help` lists every option)" in result.stderr
    result = _fab("plan-capacity", "--per-instance-qps", "10")
    assert result.returncode == 1 and "--target-qps is required" in result.stderr


def test_options_parse_as_they_did() -> None:
    parsed = Parser(contexts=tasks.ns.to_contexts()).parse_argv(
        ["deploy", "--model", "m", "--lock-wait=5", "--notify", "a", "--notify=b", "--check",
         "status", "--model=--help"])
    deploy, status = parsed[0].as_kwargs, parsed[1].as_kwargs
    assert (deploy["model"], deploy["lock_wait"], deploy["notify"], deploy["check"]) == (
        "m", "5", ["a", "b"], True)
    assert deploy["version"] is None and status["model"] == "--help"
