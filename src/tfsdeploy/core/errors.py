"""One exception tree for the toolkit, and the documented exit codes."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import IntEnum


class ExitCode(IntEnum):
    """Exit codes shared by every command (README "Exit codes")."""

    OK = 0
    INVALID = 1  # invalid input or failed preflight; nothing changed
    ROLLED_BACK = 2  # failed; every host back on its previous release
    INCONSISTENT = 3  # failed and the fleet is NOT consistent: a person must look
    LOCKED = 4  # another deploy holds the lock
    INCONCLUSIVE = 5  # fab accept: a load generator was lost or lagged too much to judge
    PAUSED = 6  # a canary holds part of the traffic, waiting for fab promote or fab abort


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the input, located precisely enough to fix it."""

    message: str
    fix: str
    host: str | None = None
    file: str | None = None
    field: str | None = None

    def render(self) -> str:
        """One line for people: where, what, and how to fix it."""
        where = ", ".join(
            f"{label} {value}"
            for label, value in (("host", self.host), ("file", self.file), ("field", self.field))
            if value
        )
        prefix = f"[{where}] " if where else ""
        return f"{prefix}{self.message}\n    fix: {self.fix}"


class TfsDeployError(Exception):
    """Base of every error the toolkit raises on purpose."""

    exit_code: ExitCode = ExitCode.INVALID


class ConfigError(TfsDeployError):
    """The inventory, catalog, templates or rendered files are invalid; no host was touched."""

    exit_code = ExitCode.INVALID

    def __init__(self, problems: list[Problem] | Problem) -> None:
        self.problems = problems if isinstance(problems, list) else [problems]
        count = len(self.problems)
        head = f"{count} problem{'s' if count != 1 else ''} found; nothing was changed on any host"
        super().__init__(head + "\n" + "\n".join(f"  - {p.render()}" for p in self.problems))


class HostUnreachable(TfsDeployError):
    """SSH could not connect, authenticate or verify the host key, or the connection died."""


def shown(value: object) -> str:
    """A value as the error shows it: short, and with its type when that is the problem."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**15:
        return f"a {digits(value)}-digit number"
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, Mapping) and not isinstance(value, dict):
        value = dict(value)
    try:
        text = repr(value)
    except ValueError:  # it holds an int beyond Python's int-str limit
        return f"a {type(value).__name__} holding a number too long to write out"
    if len(text) > 60:
        text = text[:57] + "..."
    return text if isinstance(value, (int, float, str, bool, type(None), dict, list, tuple)) \
        else f"{text} ({type(value).__name__})"


def digits(value: int) -> int:
    """How many decimal digits ``value`` has, without writing it out: str() of an int above
    Python's int-str limit (4300 digits, sys.get_int_max_str_digits) raises ValueError."""
    magnitude = abs(value)
    if magnitude < 10:
        return 1
    # 2**(b-1) <= n < 2**b, so the digit count is this estimate or one more
    count = int((magnitude.bit_length() - 1) * math.log10(2)) + 1
    return count + 1 if magnitude >= 10**count else count
