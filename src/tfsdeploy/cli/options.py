"""Every command's options typed before it runs, into the command's own options class
(``cli.verbs``): numbers and durations parsed from the text the task received (invoke's own
conversion ends in a traceback), ranges checked (each number's bound is declared beside it),
paths checked before anything is written, and every bad option named at once with its fix (a
ConfigError, exit 1)."""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import Field, fields
from pathlib import Path
from typing import Annotated, Any, TypeVar

from pydantic import BeforeValidator, TypeAdapter, ValidationError
from pydantic_core import PydanticCustomError

from tfsdeploy.cli.verbs import VERBS, Args, Bound, declared, exact, is_required, meta, verb
from tfsdeploy.core.errors import ConfigError, Problem
from tfsdeploy.core.inventory.canary_policy import parse_weights
from tfsdeploy.core.inventory.layout import RELEASE_ID
from tfsdeploy.core.inventory.schema import ONE_DAY_S, explain
from tfsdeploy.core.timetext import SINCE_FIX, duration_seconds, since_seconds


def parsed(parse: Callable[[str], Any], fix: str) -> BeforeValidator:
    """An option given as text and parsed by ``parse`` (which raises ValueError saying why it
    cannot); the error carries ``fix`` for the problem options() reports."""
    def validate(value: Any) -> Any:
        try:
            return parse(str(value))
        except ValueError as error:
            raise PydanticCustomError("tfsdeploy", "{reason}",
                                      {"reason": str(error), "fix": fix}) from None
    return BeforeValidator(validate)


def since_text(text: str) -> str:
    """`fab logs --since`, checked before any host (run.views.since_seconds) and passed on
    as given: logs() reads it against the clock when it starts."""
    since_seconds(text, time.time())
    return text


def release_id(text: str) -> str:
    """`fab rollback --to`: a release id as the toolkit makes them (it names paths on hosts)."""
    if not RELEASE_ID.fullmatch(text):  # not match(): its $ lets a trailing newline through
        raise ValueError("is not a release id (r<date>-<time>-v<version>)")
    return text


def duration_text(text: str) -> str:
    """`fab bench --duration`, `fab accept --duration`: 10s, 500ms, 2m, 1.5h (the load
    generator's form), checked here and kept as text for the command to read."""
    if not text.isascii():  # the parsers' \d and float() also read other scripts' digits
        raise ValueError("is not a duration (ASCII digits and a unit)")
    try:
        seconds = duration_seconds(text)
    except ValueError:
        raise ValueError("is not a duration") from None
    if not math.isfinite(seconds) or seconds > DURATION_MAX_S:
        raise ValueError(f"is longer than {DURATION_MAX_S:g} s, the longest duration taken")
    if seconds <= 0:
        raise ValueError("is not a positive duration")
    return text


def output_path(*, directory: bool) -> Callable[[str], str]:
    """A path a command writes (a file, or with ``directory`` a directory), checked before
    the command runs: not a NUL byte, not a directory where a file goes (nor the reverse),
    under a directory (missing ones are made) and a name the file system takes."""
    def check(text: str) -> str:
        if "\x00" in text:
            raise ValueError("holds a NUL byte")
        path = Path(text)
        try:
            if path.exists() and path.is_dir() != directory:
                raise ValueError("is a file, not a directory" if directory else
                                 "is a directory, not a file")
            above = next((p for p in path.parents if p.exists()), None)
            if above is not None and not above.is_dir():
                raise ValueError(f"is under {str(above)!r}, a file")
        except OSError as error:  # a name too long for the file system
            raise ValueError(f"cannot be used: {error.strerror}") from None
        return text
    return check


def input_file(text: str) -> str:
    """A file a command reads (--sweep-report)."""
    if "\x00" in text:
        raise ValueError("holds a NUL byte")
    try:
        found = Path(text).is_file()
    except OSError as error:
        raise ValueError(f"cannot be used: {error.strerror}") from None
    if not found:
        raise ValueError("is not a file")
    return text


OutputFile = Annotated[str, parsed(output_path(directory=False),
                                   "name a file in a directory this user can write")]
OutputDir = Annotated[str, parsed(output_path(directory=True),
                                  "name a directory (made when missing) this user can write")]


# durations given as text (`fab bench --duration`, `fab logs --since` a span back): at most
DURATION_MAX_S = ONE_DAY_S
# a text option's format, by the name its declaration gives (``Meta.check``)
CHECKS: dict[str, Any] = {
    "since": Annotated[str, parsed(since_text, SINCE_FIX)],
    "release_id": Annotated[str, parsed(release_id, "give a release id that `fab history` "
                                                    "lists, e.g. r20250131-080000000-v3")],
    "duration": Annotated[str, parsed(duration_text, "write it like 30s, 500ms, 2m or 1.5h")],
    "output_file": OutputFile, "output_dir": OutputDir,
    "input_file": Annotated[str, parsed(input_file, "name a file this user can read: the "
                                                    "report or tune.json it names")],
}


def _canary_weights(text: str) -> None:
    # int() takes other scripts' digits ('\u0665' is 5) and '1_0'; the command line takes ASCII
    if not re.fullmatch(r"[0-9, ]+", text):
        raise ConfigError(Problem(f"--canary-weights {text!r} is not a comma-separated list "
                                  "of integers", fix="write e.g. --canary-weights 5,25,50",
                                  field="--canary-weights"))
    parse_weights(text)


def _notify_urls(urls: list[str]) -> None:
    # the notifier (httpx, tenacity) is imported only when --notify is given: every command's
    # options pass here, `fab render` and `fab hosts` too
    from tfsdeploy.runbook import notify

    try:
        notify.check_urls(urls)
    except ValueError as error:  # urlsplit's own refusals, e.g. "Invalid IPv6 URL"
        # the URL is not quoted: webhook URLs carry their secret token
        raise ConfigError(Problem(f"a --notify URL cannot be parsed: {error}",
                                  fix="give the receiver's full URL, e.g. "
                                      "https://hooks.example.com/T/B/X",
                                  field="--notify")) from None


# options checked by the module that reads them (a located ConfigError), whatever the
# command does with them: `deploy --check` reads neither the canary options nor --notify,
# yet must refuse what the deploy would
LOCATED_CHECKS: dict[str, Callable[[Any], None]] = {
    "canary_weights": lambda value: _canary_weights(str(value)),
    "notify": lambda value: _notify_urls(list(value)),
}

Typed = TypeVar("Typed", bound=Args)


def options(raw: Mapping[str, Any], command: str | type[Typed]) -> Typed:
    """The command's options (``command``: its name or its options class) as given to its
    task, typed into its options class and range-checked; every bad one named at once, with
    its bound and the fix."""
    kind: type[Typed] = verb(command) if isinstance(command, str) else command  # type: ignore[assignment]
    values: dict[str, Any] = {}
    problems: list[Problem] = []
    for one in fields(kind):
        given = raw.get(one.name)
        if given is None:
            if is_required(one):  # tasks.py names it first; a caller of its own may not
                flag = f"--{one.name.replace('_', '-')}"
                problems.append(Problem(f"{flag} is required", field=flag,
                                        fix=f"give {flag} {meta(one).value or 'VALUE'}"))
            continue
        try:
            values[one.name] = typed(one, given)
        except ConfigError as error:
            problems += error.problems
    if problems:
        raise ConfigError(problems)
    return kind(**values)


def typed(one: Field[Any], given: Any) -> Any:
    """One option's value as its declaration types it (a ConfigError naming it when it
    cannot be)."""
    declaration = meta(one)
    flag = f"--{one.name.replace('_', '-')}".rstrip("-")
    if isinstance(given, str) and not given.strip():
        # an empty value is never a choice: `--inventory "$INV"` with $INV unset must not
        # mean the default inventory, nor `--hosts ""` every host of the model
        raise ConfigError(Problem(f"{flag} is empty", fix=f"give a value, or leave {flag} out",
                                  field=flag))
    if declaration.check in LOCATED_CHECKS:
        LOCATED_CHECKS[declaration.check](given)
        return tuple(given) if declaration.repeat else given
    kind = declaration.bound.kind() if declaration.bound is not None else \
        CHECKS.get(declaration.check)
    if kind is None:
        return tuple(given) if declaration.repeat else given
    try:
        return TypeAdapter(kind).validate_python(given)
    except ValidationError as error:
        raise ConfigError(_option_problem(flag, given, error, declaration.bound)) from None


def option_value(command: str, name: str, given: Any) -> Any:
    """One option of ``command`` typed as its declaration says (a ConfigError naming it when
    it cannot be)."""
    return typed(next(f for f in fields(verb(command)) if f.name == name), given)


def bounded() -> list[tuple[str, str, Bound]]:
    """(command, option, bound) of every numeric option (the bounds table of the docs)."""
    return [(v.command, f.name, meta(f).bound) for v in VERBS for f in declared(v)  # type: ignore[misc]
            if meta(f).bound is not None]


def _option_problem(flag: str, value: Any, error: ValidationError, bound: Bound | None
                    ) -> Problem:
    """The located problem of an option's refused value: its bound and the fix."""
    first = error.errors()[0]
    # a value is quoted whole (a person sees what the shell passed), up to a length
    shown_value = value if not isinstance(value, str) or len(value) <= SHOWN_CHARS else \
        value[:SHOWN_CHARS - 3] + "..."
    fix = (first.get("ctx") or {}).get("fix")
    # pydantic gives a float field's bounds as floats: 86400.0 reads as written here, 86400
    limits = {k: exact(v) if isinstance(v, float) else v
              for k, v in (first.get("ctx") or {}).items()}
    reason, bound_fix = explain({**first, "ctx": limits}, flag)
    if fix is None and bound is not None:
        words = "a whole number" if bound.whole else "a number"
        lowest = "above" if bound.above else "from"
        fix = bound_fix if first["type"] in BOUND_ERRORS else \
            f"give {words} {lowest} {exact(bound.low)} to {exact(bound.high)}"
    return Problem(f"{flag} {shown_value!r}: {reason if fix else first['msg']}",
                   fix=fix or "see `fab <command> --help`", field=flag)


SHOWN_CHARS = 1000
BOUND_ERRORS = ("greater_than_equal", "greater_than", "less_than_equal", "less_than")


def safe_model(name: str) -> str:
    """A model name fit for files and metric labels (checked before it is recorded)."""
    if not re.fullmatch(r"[A-Za-z0-9_.-]{1,128}", name or "") or name in (".", ".."):
        raise ConfigError(Problem(f"--model {name!r} is not a model name",
                                  fix="give a name from the inventory's catalog "
                                      "(letters, digits, '.', '_', '-')", field="--model"))
    return name


def writable(path: Any) -> str | None:
    """``path`` when it passes the output file check (a refused one is reported by
    options() and never written)."""
    try:
        return output_path(directory=False)(path) if isinstance(path, str) and path else None
    except ValueError:
        return None


def is_safe(name: str) -> bool:
    try:
        safe_model(name)
    except ConfigError:
        return False
    return True
