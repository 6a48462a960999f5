"""One exception tree for the toolkit, and the documented exit codes."""

from __future__ import annotations

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
