"""tfsdeploy's Fabric tasks, made from each command's options as ``tfsdeploy.cli.verbs``
declares them (their signatures and help); each hands its arguments to ``tfsdeploy.cli.main``
and exits with its code (README "Exit codes").

Run from the repository root: `fab --list`, `fab render --model resnet50`.

Numeric options reach invoke as text: invoke converts an option whose default is a number
itself, and `--lines abc` then ends in its ValueError's traceback; as text, every value
reaches ``tfsdeploy.cli.options``, which types it and names the option it is wrong for.
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

# This checkout's own package, whatever another checkout installed into the shared venv
# (an editable install points at whichever checkout ran scripts/setup last).
_SRC = str(Path(__file__).resolve().parent / "src")
if sys.path[:1] != [_SRC]:
    sys.path.insert(0, _SRC)

from tfsdeploy.cli.terminal import guard_process_streams  # noqa: E402

# a reader that stops early (`fab deploy --help | head -1`) or a terminal that closed never
# turns into a traceback or another exit code (cli/terminal.py)
guard_process_streams()

from typing import Any, NoReturn  # noqa: E402

import invoke.collection  # noqa: E402
from fabric import Task  # noqa: E402
from fabric import task as fabric_task  # noqa: E402
from invoke.collection import Collection  # noqa: E402
from invoke.exceptions import Exit  # noqa: E402
from invoke.parser.context import ParserContext  # noqa: E402

from tfsdeploy.cli.verbs import (  # noqa: E402
    VERBS,
    Args,
    ExecArgs,
    declared,
    exact,
    is_required,
    meta,
)


def _main(command: str, arguments: dict[str, Any]) -> None:
    from tfsdeploy.cli.main import main

    code = main(command, arguments)
    if code:
        raise Exit(code=code)


def task_for(args: type[Args]) -> Task:
    """The Fabric task of a command, made from its options' declaration (``cli.verbs``):
    every option a long option (a parameter without a default would be a positional
    argument, filled with the next word, whatever it is: `fab deploy --help` took "--help"
    for the model's name), numbers as text (``cli.options`` types them and names the option
    a bad value is wrong for), flags as flags, a repeatable option as a list; a required
    option's absence named, exit 1."""
    options = declared(args)
    required = [f.name for f in options if is_required(f)]
    parameters = [inspect.Parameter("c", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    for one in options:
        default = one.default if not is_required(one) else None
        parameters.append(inspect.Parameter(
            one.name, inspect.Parameter.KEYWORD_ONLY,
            default=default if isinstance(default, bool) or default is None
            else None if meta(one).repeat else str(exact(default)) if isinstance(
                default, int | float) else default))

    def body(c: Any, **arguments: Any) -> None:
        missing = [name for name in required if arguments.get(name) is None]
        if missing:
            _refuse_missing(args.command, missing)
        if args is ExecArgs:
            arguments["argv"] = _after_dashes()
        _main(args.command, arguments)

    body.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    body.__doc__ = args.summary
    body.__name__ = args.command.replace("-", "_")
    made: Task = fabric_task(
        name=args.command, auto_shortflags=False, positional=[],
        iterable=[f.name for f in options if meta(f).repeat],
        help={f.name: meta(f).help for f in options})(body)
    return made


def _after_dashes() -> list[str]:
    return sys.argv[sys.argv.index("--") + 1:] if "--" in sys.argv else []


def _refuse_missing(task: str, missing: list[str]) -> NoReturn:
    """Exit 1 naming each required option left out, as cli.main names a bad one."""
    from tfsdeploy.cli.output import print_error
    from tfsdeploy.core.errors import ConfigError, Problem

    problems = []
    for option in missing:
        flag, value = f"--{option.replace('_', '-')}", VALUES.get(option, option.upper())
        problems.append(Problem(f"{flag} is required", field=flag, fix=f"give {flag} {value} "
                                f"(`fab {task} --help` lists every option)"))
    print_error(ConfigError(problems))
    raise Exit(code=1)


# What each option's value is, shown in `fab TASK --help` as --name=VALUE
VALUES = {f.name: meta(f).value for verb in VERBS for f in declared(verb) if meta(f).value}


class _ValueNamed(ParserContext):
    """A task's parser context whose help names each option's value (``--lock-wait=SECONDS``,
    ``--notify=URL``) where invoke gives only its type (``=STRING``) or, for a repeatable
    option, nothing."""

    def help_for(self, flag: str) -> tuple[str, str]:
        names, text = super().help_for(flag)
        argument = self.flags[flag]
        if argument.takes_value and argument.name in VALUES:
            names = f"{names.split('=')[0]}={VALUES[argument.name]}"
        return names, text


# invoke (2.2) makes every task's parser context in Collection.to_contexts, from this name,
# and has no other way to name a value; `fab` loads the tasks into a Collection of its own,
# so a subclass of Collection would not be the one asked.
invoke.collection.ParserContext = _ValueNamed  # type: ignore[attr-defined]


ns = Collection(*(task_for(verb) for verb in VERBS))
