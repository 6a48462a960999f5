"""Every `fab` command line the README and docs/ show is one the CLI accepts: the task exists,
every option is one of that task's, each option that takes a value has one; and the command
reference, docs/commands.md, shows every task with every option it takes. The commands
themselves run in the fleet tiers (the main job in tests/mainjob, each verb in
tests/integration); this keeps what the documentation tells a user to type from drifting away
from what the CLI parses."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from invoke.exceptions import ParseError
from invoke.parser import Parser
from invoke.parser.context import ParserContext

import tasks

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
REFERENCE = ROOT / "docs" / "commands.md"
CORE_ONLY = {"--list", "-l", "--help", "-h", "--version", "-V", "--debug", "-d"}
# the end of the toolkit's part of a shell line
SHELL_BREAKS = {"|", "||", "&&", ";", ">", ">>", "2>&1", "&"}


def _spans(text: str) -> list[str]:
    """The `fab ...` command lines of a Markdown text: inline code spans and code-block lines."""
    found = re.findall(r"`(fab [^`]+)`", text)
    in_block = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            in_block = not in_block
            continue
        stripped = line.strip().removeprefix("$ ")
        if in_block and stripped.startswith("fab "):
            found.append(stripped)
    return found


def _argv(line: str) -> list[str] | None:
    """The tokens after ``fab`` that the task parser sees (None: a line of the core options
    only, or a synopsis too loose to check)."""
    # a synopsis: [optional] parts, (a \| b) alternatives, ``...`` for a value or for more
    line = re.sub(r"\s#.*$", "", line)
    for mark in ("[", "]", "(", ")", "\\|"):
        line = line.replace(mark, " ")
    try:
        tokens = shlex.split(line)[1:]
    except ValueError:
        return None
    argv: list[str] = []
    for token in tokens:
        if token in SHELL_BREAKS or token == "--":  # `fab exec -- CMD`: the rest is the command
            break
        if token == "...":
            if argv and argv[-1].startswith("-"):
                argv.append("VALUE")  # `--hosts ...`: some value
            continue
        argv.append(token)
    if not argv or argv[0] in CORE_ONLY:
        return None
    return argv


def _commands() -> list[tuple[str, str]]:
    commands: dict[str, str] = {}
    for doc in DOCS:
        for line in _spans(doc.read_text()):
            if _argv(line) is not None:
                commands.setdefault(line, doc.relative_to(ROOT).as_posix())
    return sorted((doc, line) for line, doc in commands.items())


COMMANDS = _commands()


def test_the_documentation_shows_commands_for_every_main_verb() -> None:
    """The scan finds the commands (a scan that found none would prove nothing)."""
    verbs = {(_argv(line) or [""])[0] for _, line in COMMANDS}
    assert {"deploy", "rollback", "status", "guard", "accept", "history", "prune"} <= verbs
    assert len(COMMANDS) > 40


@pytest.mark.parametrize(("doc", "line"), COMMANDS, ids=[f"{d}: {c}" for d, c in COMMANDS])
def test_each_documented_command_parses(doc: str, line: str) -> None:
    argv = _argv(line)
    assert argv is not None
    parser = Parser(contexts=tasks.ns.to_contexts())
    try:
        parsed = parser.parse_argv(argv)
    except ParseError as err:
        pytest.fail(f"{doc}: `{line}` is not a command fab accepts: {err}")
    assert [context.name for context in parsed] and all(
        context.name in tasks.ns.task_names for context in parsed), (doc, line)


def test_a_wrong_option_is_caught() -> None:
    """The check itself fails on what fab refuses: an option of another task, a typo."""
    parser = Parser(contexts=tasks.ns.to_contexts())
    for argv in (["deploy", "--model", "m", "--since", "1h"], ["deploy", "--modle", "m"],
                 ["deplyo", "--model", "m"]):
        with pytest.raises(ParseError):
            parser.parse_argv(argv)


def _documented_options(text: str) -> dict[str, set[str]]:
    """Task -> the options its `fab TASK ...` lines in ``text`` show."""
    shown: dict[str, set[str]] = {}
    for line in _spans(text):
        argv = _argv(line)
        if argv is not None:
            shown.setdefault(argv[0], set()).update(a for a in argv[1:] if a.startswith("--"))
    return shown


def _options(context: ParserContext) -> set[str]:
    """Every option the task's parser takes, as typed (``--lock-wait``, ``--break``)."""
    return set(context.flags)


@pytest.mark.parametrize("context", tasks.ns.to_contexts(), ids=lambda c: c.name)
def test_the_command_reference_shows_every_option_of_every_task(context: ParserContext
                                                                ) -> None:
    """docs/commands.md, the full list the README points to, shows each task with each of
    its options (with each documented option being a real one, checked above: exactly the
    task's options)."""
    shown = _documented_options(REFERENCE.read_text()).get(str(context.name))
    assert shown is not None, f"docs/commands.md shows no `fab {context.name} ...` line"
    missing = sorted(_options(context) - shown)
    assert not missing, f"docs/commands.md: `fab {context.name}` does not show {missing}"


def test_the_reference_check_catches_a_missing_option() -> None:
    """The check itself fails on a reference that leaves an option out."""
    deploy = next(c for c in tasks.ns.to_contexts() if c.name == "deploy")
    shown = _documented_options("`fab deploy --model M [--version V]`")["deploy"]
    assert shown == {"--model", "--version"}
    assert "--lock-wait" in _options(deploy) - shown

