"""Every command's options typed before it runs: numbers and durations parsed from the text
the task received (tasks.py declares them as text: invoke's own conversion ends in a
traceback), ranges checked, paths checked before anything is written, and every bad option
named at once with its fix (a ConfigError, exit 1)."""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, TypeAdapter, ValidationError
from pydantic_core import PydanticCustomError

from tfsdeploy.core.errors import ConfigError, Problem
from tfsdeploy.core.inventory.canary_policy import parse_weights
from tfsdeploy.core.inventory.layout import RELEASE_ID
from tfsdeploy.core.inventory.schema import ONE_DAY_S, ONE_WEEK_S, explain
from tfsdeploy.core.timetext import SINCE_FIX, duration_seconds, since_seconds

Options = dict[str, Any]
"""A command's options by name, as the task passed them (``options`` types them)."""


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


@dataclass(frozen=True)
class Bound:
    """The range of a numeric option: ``low`` (excluded when ``above``) to ``high``, both
    finite; ``whole`` for a count."""

    low: float
    high: float
    above: bool = False  # low itself is refused (a rate or an interval of 0 means nothing)
    whole: bool = False

    def kind(self) -> Any:
        """The pydantic type that checks it (its errors name the bounds as written here)."""
        low, high = exact(self.low), exact(self.high)
        at_least = Field(gt=low) if self.above else Field(ge=low)
        if self.whole:
            return Annotated[int, at_least, Field(le=high)]
        return Annotated[float, at_least, Field(le=high, allow_inf_nan=False)]


def exact(number: float) -> float | int:
    """``number`` as an int when it is whole (a bound reads 86400, not 86400.0)."""
    return int(number) if float(number).is_integer() else number


MILLION = 1_000_000
# Every numeric option's bounds, in one place (docs/commands.md names them). A value beyond
# its bound is refused with the option, the bound and the fix before any host is contacted:
# beyond them a value is a typo, not a choice (`--lock-wait 1e300` waits forever,
# `--interval-s 1e-300` reads every serving process's metrics in a busy loop).
BOUNDS: dict[str, Bound] = {
    "lock_wait": Bound(0, ONE_DAY_S),            # s
    "step_s": Bound(0, ONE_DAY_S, above=True),   # s, a canary step
    "for_s": Bound(0, ONE_DAY_S),                # s, how long a breach lasts
    "interval_s": Bound(0.1, 3600),              # s between the guard's metric reads
    "duration_s": Bound(0, ONE_WEEK_S, above=True),  # s the guard watches
    "slo_p99_ms": Bound(0, 3_600_000, above=True),   # ms
    "slo_p99": Bound(0, 3_600_000, above=True),      # ms
    "max_error_rate": Bound(0, 100),             # percent (bench, accept); guard: below
    "min_requests": Bound(1, 1_000_000_000, whole=True),
    "concurrency": Bound(1, 100_000, whole=True),
    "procs": Bound(1, 1024, whole=True),
    "instances_per_host": Bound(1, 1024, whole=True),
    "lines": Bound(1, MILLION, whole=True),
    "max_pulls": Bound(1, 10_000, whole=True),   # hosts pulling a model version at once
    "rps": Bound(0, 10 * MILLION, above=True),
    "min_qps": Bound(0, 10 * MILLION, above=True),
    "target_qps": Bound(0, 10 * MILLION, above=True),
    "per_instance_qps": Bound(0, 10 * MILLION, above=True),
    "load_factor": Bound(0, 1, above=True),      # 0 divides by zero
    "availability_factor": Bound(0, 1, above=True),
}
# (command, option) -> its bound where that command's differs
COMMAND_BOUNDS: dict[tuple[str, str], Bound] = {
    ("guard", "max_error_rate"): Bound(0, 1),    # a fraction: 0.01 is 1 %
}
# durations given as text (`fab bench --duration`, `fab logs --since` a span back): at most
DURATION_MAX_S = ONE_DAY_S
OPTION_TYPES: dict[str, Any] = {
    "since": Annotated[str, parsed(since_text, SINCE_FIX)],
    "to": Annotated[str, parsed(release_id, "give a release id that `fab history` lists, "
                                            "e.g. r20250131-080000000-v3")],
    "duration": Annotated[str, parsed(duration_text, "write it like 30s, 500ms, 2m or 1.5h")],
    "json_file": OutputFile, "metrics_file": OutputFile, "log_file": OutputFile,
    "report": OutputFile, "sweep_plot": OutputFile, "out": OutputDir, "write": OutputFile,
    "budget": Annotated[str, parsed(duration_text, "write it like 10m, 90s or 1h")],
    "step": Annotated[str, parsed(duration_text, "write it like 5s or 500ms")],
    "for_": Annotated[str, parsed(duration_text, "write it like 60s or 2m")],
    "sweep_report": Annotated[str, parsed(input_file, "name the JSON report of `fab bench "
                                                      "--sweep`")],
    "tune_report": Annotated[str, parsed(input_file, "name the tune.json of `fab tune`")],
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
OPTION_CHECKS: dict[str, Callable[[Any], None]] = {
    "canary_weights": lambda value: _canary_weights(str(value)),
    "notify": lambda value: _notify_urls(list(value)),
}


def options(raw: Options, command: str | None = None) -> Options:
    """The command's options, typed and range-checked (``BOUNDS``); every bad one named at
    once, with its bound and the fix."""
    checked, problems = dict(raw), []
    for name, value in raw.items():
        flag = f"--{name.replace('_', '-')}"
        if isinstance(value, str) and not value.strip():
            # an empty value is never a choice: `--inventory "$INV"` with $INV unset must not
            # mean the default inventory, nor `--hosts ""` every host of the model
            problems.append(Problem(f"{flag} is empty", fix=f"give a value, or leave {flag} out",
                                    field=flag))
        elif name in OPTION_CHECKS and value is not None:
            try:
                OPTION_CHECKS[name](value)
            except ConfigError as error:
                problems += error.problems
        elif value is not None and (kind := option_type(name, command)) is not None:
            try:
                checked[name] = TypeAdapter(kind).validate_python(value)
            except ValidationError as error:
                problems.append(_option_problem(flag, value, error,
                                                option_bound(name, command)))
    if problems:
        raise ConfigError(problems)
    return checked


def option_bound(name: str, command: str | None) -> Bound | None:
    """The bound of a numeric option for ``command`` (None: not a number)."""
    return COMMAND_BOUNDS.get((command or "", name)) or BOUNDS.get(name)


def option_type(name: str, command: str | None) -> Any:
    """The type an option's text is checked against (None: taken as given)."""
    bound = option_bound(name, command)
    return bound.kind() if bound is not None else OPTION_TYPES.get(name)


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
