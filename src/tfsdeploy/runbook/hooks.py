"""Hooks: the release engineer's own executables, run on the deploy machine at fixed moments.

A hooks directory (``hooks/`` beside the inventory file, or one named explicitly) holds
executables named exactly for the moment they run (``pre-deploy``, ``post-deploy``, ...). They
get the run's facts as ``TFSDEPLOY_*`` environment variables, never a terminal (stdin is
/dev/null), and a timeout after which their whole process group is killed. A pre-hook that fails
stops the run before any host is touched; a post-hook that fails is reported and recorded, and
changes nothing that happened on the hosts. The directory is checked before the first
connection: a file named like a hook that cannot be run is an error that names the fix.

Hooks are trusted as sshd's StrictModes trusts a user's files (``core.trust``): the hook,
symbolic links resolved, and every directory above its target owned by the invoking user or
root and writable by neither group nor others; otherwise another user could put their own
program in its place. An untrusted pre-hook stops the run before any host is touched
(exit 1); an untrusted post-hook is not run, and reported. The check is made again right
before a hook runs, and the resolved, checked path is what runs.
"""

from __future__ import annotations

import difflib
import json
import os
import selectors
import signal
import subprocess
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from tfsdeploy.core.errors import ConfigError, ExitCode, Problem, TfsDeployError
from tfsdeploy.core.file_trust import trust_fix, untrusted


class Moment(StrEnum):
    """When a hook runs; the value is the executable's file name."""

    PRE_DEPLOY = "pre-deploy"
    POST_DEPLOY = "post-deploy"
    PRE_ROLLBACK = "pre-rollback"
    POST_ROLLBACK = "post-rollback"
    ON_FAILURE = "on-failure"
    PRE_PROMOTE = "pre-promote"
    POST_PROMOTE = "post-promote"
    POST_ABORT = "post-abort"

    @property
    def is_pre(self) -> bool:
        """A pre-hook may stop the run; every other hook only reports."""
        return self.value.startswith("pre-")


# The moment before and after each verb. `fab guard` runs the hooks of what it does (a
# rollback, or the abort of a paused canary), as `fab rollback` and `fab abort` would. An abort
# has no pre-hook: it only returns hosts to the release they served before the canary.
_BEFORE: dict[str, Moment] = {"deploy": Moment.PRE_DEPLOY, "rollback": Moment.PRE_ROLLBACK,
                              "promote": Moment.PRE_PROMOTE}
_AFTER: dict[str, Moment] = {"deploy": Moment.POST_DEPLOY, "rollback": Moment.POST_ROLLBACK,
                             "promote": Moment.POST_PROMOTE, "abort": Moment.POST_ABORT}

DEFAULT_TIMEOUT_S = 300.0
KILL_GRACE_S = 2.0  # between SIGTERM and SIGKILL of a timed-out hook's process group
DRAIN_S = 0.5  # how long output is still read after the hook exited (its children may write)
TAIL_LINES = 40
MAX_LINE_CHARS = 2000
MAX_VALUE_CHARS = 4000  # TFSDEPLOY_MESSAGE is cut here: environments are not for whole logs

# Every variable a hook may receive. Inherited values of these names are removed first, so a
# hook started by a hook (a post-deploy that deploys another model) never sees stale facts.
PRE_VARIABLES = ("TFSDEPLOY_HOOK", "TFSDEPLOY_COMMAND", "TFSDEPLOY_MODEL", "TFSDEPLOY_VERSION",
                 "TFSDEPLOY_RELEASE", "TFSDEPLOY_HOSTS", "TFSDEPLOY_ADDRESSES",
                 "TFSDEPLOY_WHO", "TFSDEPLOY_INVENTORY", "TFSDEPLOY_RUN_ID")
POST_VARIABLES = ("TFSDEPLOY_RESULT", "TFSDEPLOY_EXIT_CODE", "TFSDEPLOY_DURATION_S",
                  "TFSDEPLOY_RESULT_FILE", "TFSDEPLOY_MESSAGE", "TFSDEPLOY_FAILED_HOSTS")
HOOK_VARIABLES = PRE_VARIABLES + POST_VARIABLES
HOOK_NAMES = frozenset(moment.value for moment in Moment)


@dataclass(frozen=True)
class RunFacts:
    """What every hook and every notification says about the run."""

    command: str  # deploy, rollback, promote, abort, guard
    model: str
    # the release deployed, rolled back to, promoted or aborted, and its model version (None
    # and "" until known: a rollback's is chosen from the hosts' records)
    version: int | None = None
    release: str = ""
    hosts: tuple[str, ...] = ()  # the selected hosts, in roll order
    addresses: tuple[str, ...] = ()  # their addresses, same order
    who: str = ""  # user@machine
    inventory: str = ""
    run_id: str = ""  # one id per run: pairs a run's pre- and post-hooks and its events


@dataclass(frozen=True)
class RunEnd:
    """How the run ended, for the hooks after it."""

    exit_code: int
    seconds: float
    result_file: str
    message: str = ""
    failed_hosts: tuple[str, ...] = ()


def result_name(exit_code: int) -> str:
    """The exit code's name as in the JSON result (``ok``, ``invalid``, ``rolled_back``,
    ``inconsistent``, ``locked``, ``inconclusive``, ``paused``), or ``exit_<n>`` for a code
    outside the documented ones."""
    try:
        return ExitCode(exit_code).name.lower()
    except ValueError:
        return f"exit_{exit_code}"


def hook_env(facts: RunFacts, end: RunEnd | None = None) -> dict[str, str]:
    """The ``TFSDEPLOY_*`` variables for a hook (pure); the ``end`` ones only after a run."""
    env = {"TFSDEPLOY_COMMAND": facts.command, "TFSDEPLOY_MODEL": facts.model,
           "TFSDEPLOY_VERSION": "" if facts.version is None else str(facts.version),
           "TFSDEPLOY_RELEASE": facts.release, "TFSDEPLOY_HOSTS": ",".join(facts.hosts),
           "TFSDEPLOY_ADDRESSES": ",".join(facts.addresses), "TFSDEPLOY_WHO": facts.who,
           "TFSDEPLOY_INVENTORY": facts.inventory, "TFSDEPLOY_RUN_ID": facts.run_id}
    if end is not None:
        env |= {"TFSDEPLOY_RESULT": result_name(end.exit_code),
                "TFSDEPLOY_EXIT_CODE": str(end.exit_code),
                "TFSDEPLOY_DURATION_S": f"{end.seconds:.3f}",
                "TFSDEPLOY_RESULT_FILE": end.result_file,
                "TFSDEPLOY_MESSAGE": end.message[:MAX_VALUE_CHARS],
                "TFSDEPLOY_FAILED_HOSTS": ",".join(end.failed_hosts)}
    return {name: env_value(value) for name, value in env.items()}


def env_value(text: str) -> str:
    """``text`` as an environment variable can hold it: NUL written as ``\\x00`` (execve's
    strings end at NUL: Python refuses the whole environment with "embedded null byte"), and
    what the file-system encoding cannot encode (a lone surrogate) as its escape. A message
    quoting a host's error may hold either."""
    text = text.replace("\x00", "\\x00")
    try:
        os.fsencode(text)
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def moment_before(verb: str) -> Moment | None:
    """The hook that may stop a run of ``verb`` (deploy, rollback, promote, abort) before
    any host is changed (None: no such hook)."""
    return _BEFORE.get(verb)


def moments_after(verb: str, exit_code: int) -> tuple[Moment, ...]:
    """The hooks after a run of ``verb`` that passed its pre-hook, in order: the verb's
    post-hook whatever the result, then ``on-failure`` when the run did not exit 0."""
    after = (_AFTER[verb],) if verb in _AFTER else ()
    return after + ((Moment.ON_FAILURE,) if exit_code != 0 else ())


@dataclass(frozen=True)
class Hooks:
    """The hooks found in a directory (``executables`` is empty when there are none)."""

    directory: Path
    executables: Mapping[Moment, Path] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()  # files that look like hooks but will not run
    # post-hooks that are not trusted (the reason and fix): reported at their moment, not run
    untrusted: Mapping[Moment, str] = field(default_factory=dict)

    def path_for(self, moment: Moment) -> Path | None:
        """The executable for ``moment``, if there is one (and it is trusted)."""
        return self.executables.get(moment)

    def has(self, moment: Moment) -> bool:
        """Whether the directory holds a hook for ``moment``, trusted or not (an untrusted
        one is reported at its moment)."""
        return moment in self.executables or moment in self.untrusted


def default_hooks_dir(inventory_path: str) -> Path:
    """``hooks/`` beside the inventory file."""
    return Path(inventory_path).resolve().parent / "hooks"


def find_hooks(directory: str | Path | None = None, *, inventory: str | None = None) -> Hooks:
    """The hooks in ``directory`` (named explicitly: it must exist), else in ``hooks/`` beside
    ``inventory`` (may be absent: no hooks). Raises ConfigError listing every hook that could
    not run; files whose names are close to a hook's are returned as warnings, other files
    (``*.sample``, dot files, README, shared scripts) are ignored."""
    if directory is None and inventory is None:
        raise ValueError("find_hooks needs a directory or an inventory path")
    base = Path(directory) if directory is not None else default_hooks_dir(inventory or "")
    if not base.is_dir():
        if directory is None and not base.exists():
            return Hooks(base)
        raise ConfigError(Problem(
            f"hooks directory {base} {'is not a directory' if base.exists() else 'does not exist'}",
            fix="create it, or name the right one with --hooks DIR", file=str(base)))
    executables: dict[Moment, Path] = {}
    refused: dict[Moment, str] = {}
    problems: list[Problem] = []
    warnings: list[str] = []
    for entry in sorted(base.iterdir()):
        if entry.name in HOOK_NAMES:
            moment = Moment(entry.name)
            problem = _check_executable(entry)
            distrust = untrusted(entry) if problem is None else None
            if problem:
                problems.append(problem)
            elif distrust and moment.is_pre:
                problems.append(Problem(f"hook {entry.name} is not trusted: {distrust}",
                                        fix=trust_fix(distrust), file=str(entry)))
            elif distrust:
                refused[moment] = f"not trusted: {distrust}; fix: {trust_fix(distrust)}"
            else:
                executables[moment] = entry
        elif (warning := _near_miss(entry.name)) is not None:
            warnings.append(f"{entry}: {warning}")
    if problems:
        raise ConfigError(problems)
    return Hooks(base, executables, tuple(warnings), refused)


def _check_executable(path: Path) -> Problem | None:
    """Why the hook at ``path`` could not be started, or None."""
    name = path.name
    if not path.exists():
        return Problem(f"hook {name} is a symlink to {os.readlink(path)}, which does not exist",
                       fix="point the link at the script, or remove it", file=str(path))
    if not path.is_file():
        return Problem(f"hook {name} is not a file", fix="replace it with an executable file, "
                       "or rename it", file=str(path))
    if not path.stat().st_mode & 0o111 or not os.access(path, os.X_OK):
        return Problem(f"hook {name} is not executable, so it would never run",
                       fix=f"chmod +x {path} (or rename it to {name}.sample to keep it "
                       "disabled)", file=str(path))
    with path.open("rb") as handle:
        head = handle.read(4)
    if not (head.startswith(b"#!") or head == b"\x7fELF"):
        return Problem(f"hook {name} has no #! line, so the system cannot start it",
                       fix="make its first line an interpreter line such as #!/bin/sh",
                       file=str(path))
    return None


def _near_miss(name: str) -> str | None:
    """A warning for a file its author probably meant as a hook, or None to ignore it."""
    if name.startswith(".") or name.endswith(".sample"):
        return None
    stem = name.split(".", 1)[0].lower().replace("_", "-")
    if stem in HOOK_NAMES:
        return (f"not run: hooks are found by exact name; rename it to {stem} "
                f"(or to {name}.sample to keep it disabled)")
    close = difflib.get_close_matches(stem, sorted(HOOK_NAMES), n=1, cutoff=0.8)
    if close:
        return f"not run: no hook is called {name}; did you mean {close[0]}?"
    return None


@dataclass(frozen=True)
class HookResult:
    """How one hook ran. ``ran`` is False when there is no hook for the moment."""

    moment: Moment
    ran: bool
    path: str = ""
    exit_code: int | None = None  # killed by signal N: 128 + N, as a shell reports it
    output_tail: str = ""  # the last lines of stdout and stderr, interleaved as written
    seconds: float = 0.0
    timed_out: bool = False
    timeout_s: float = 0.0
    error: str = ""  # the system could not start it

    @property
    def ok(self) -> bool:
        """No hook, or it exited 0 within its timeout."""
        return not self.ran or (self.exit_code == 0 and not self.timed_out and not self.error)

    @property
    def stops_run(self) -> bool:
        """A pre-hook failed: the caller stops before any host is touched (exit 1)."""
        return self.moment.is_pre and not self.ok

    def describe(self) -> str:
        """One line for people: which hook, how it ended, and what that means for the run."""
        if not self.ran:
            return f"no {self.moment} hook"
        how = (f"timed out after {self.timeout_s:g}s and was killed" if self.timed_out
               else f"was not run: {self.error}" if self.error.startswith("not trusted")
               else f"could not start: {self.error}" if self.error
               else f"exited {self.exit_code}")
        head = f"{self.moment} hook {self.path} {how} ({self.seconds:.1f}s)"
        if self.ok:
            return head
        if self.moment.is_pre:
            return f"{head}: the run stops before any host is touched"
        return f"{head}: reported only; what happened on the hosts is unchanged"

    def refusal(self) -> HookRefused | None:
        """The error (exit 1) a stopped run ends with, showing the hook's output; None when the
        run may go on."""
        return HookRefused(self) if self.stops_run else None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form for the run's result."""
        return {"hook": str(self.moment), "ran": self.ran, "path": self.path,
                "exit_code": self.exit_code, "timed_out": self.timed_out,
                "seconds": round(self.seconds, 3), "ok": self.ok, "error": self.error,
                "output_tail": self.output_tail}


class HookRefused(TfsDeployError):
    """A pre-hook failed: the run stopped before any host was touched."""

    exit_code = ExitCode.INVALID

    def __init__(self, result: HookResult) -> None:
        self.result = result
        output = "\n".join(f"    | {line}" for line in result.output_tail.splitlines())
        super().__init__(
            f"{result.describe()}; nothing was changed on any host\n"
            + (f"  hook output (last lines):\n{output}\n" if output else "  (no output)\n")
            + f"    fix: deal with what the hook reports and run again (the hook is "
            f"{result.path})")


class _Tail:
    """Splits output into lines, passes each to ``on_line``, keeps the last ones."""

    def __init__(self, on_line: Callable[[str], None] | None) -> None:
        self._lines: deque[str] = deque(maxlen=TAIL_LINES)
        self._partial = b""
        self._on_line = on_line

    def feed(self, chunk: bytes) -> None:
        *complete, self._partial = (self._partial + chunk).split(b"\n")
        if len(self._partial) > MAX_LINE_CHARS * 4:  # a line without end: flush it in pieces
            complete.append(self._partial)
            self._partial = b""
        for raw in complete:
            self._add(raw)

    def _add(self, raw: bytes) -> None:
        line = raw.decode("utf-8", "replace").rstrip("\r")[:MAX_LINE_CHARS]
        self._lines.append(line)
        if self._on_line:
            self._on_line(line)

    def text(self) -> str:
        if self._partial:
            self._add(self._partial)
            self._partial = b""
        return "\n".join(self._lines)


def process_env(env: Mapping[str, str], moment: Moment,
                inherited: Mapping[str, str] | None = None) -> dict[str, str]:
    """The hook's whole environment: ours (PATH, HOME, the operator's own variables) without
    any inherited ``TFSDEPLOY_*`` hook variable, then ``env``, then TFSDEPLOY_HOOK."""
    base = {k: v for k, v in (os.environ if inherited is None else inherited).items()
            if k not in HOOK_VARIABLES}
    return base | dict(env) | {"TFSDEPLOY_HOOK": str(moment)}


def run_hook(hooks: Hooks, moment: Moment, env: Mapping[str, str], *,
             timeout_s: float = DEFAULT_TIMEOUT_S,
             on_line: Callable[[str], None] | None = None) -> HookResult:
    """Run the hook for ``moment`` (if any) with ``env`` (from ``hook_env``) added to this
    process's environment; stdin is /dev/null; after ``timeout_s`` its whole process group gets
    SIGTERM, then SIGKILL. ``on_line`` sees each output line as it comes. Never raises for
    anything the hook does."""
    path = hooks.path_for(moment)
    if path is None:
        refused = hooks.untrusted.get(moment)
        return HookResult(moment, ran=refused is not None, error=refused or "",
                          path=str(hooks.directory / moment.value) if refused else "")
    started = time.monotonic()
    distrust = untrusted(path)  # again: it may have changed since the run started
    if distrust is not None:
        return HookResult(moment, ran=True, path=str(path), timeout_s=timeout_s,
                          error=f"not trusted: {distrust}; fix: {trust_fix(distrust)}")
    try:
        process = subprocess.Popen(
            [str(path.resolve())], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, env=process_env(env, moment), start_new_session=True)
    except (OSError, ValueError) as error:  # ValueError: a value execve cannot take
        return HookResult(moment, ran=True, path=str(path), seconds=time.monotonic() - started,
                          timeout_s=timeout_s, error=f"{getattr(error, 'strerror', '') or error}")
    tail = _Tail(on_line)
    timed_out = False
    try:
        timed_out = _collect(process, tail, deadline=started + timeout_s)
        if timed_out:
            _kill_group(process)
    finally:
        if process.poll() is None:  # an exception (Ctrl-C) left it running: never orphan it
            _kill_group(process, grace_s=0.0)
        if process.stdout:
            process.stdout.close()
    code = process.returncode
    return HookResult(moment, ran=True, path=str(path),
                      exit_code=128 - code if code < 0 else code, output_tail=tail.text(),
                      seconds=time.monotonic() - started, timed_out=timed_out,
                      timeout_s=timeout_s)


def _collect(process: subprocess.Popen[bytes], tail: _Tail, *, deadline: float) -> bool:
    """Read the hook's output until it ends; True when the deadline passed first.

    Output ends at end-of-file, or ``DRAIN_S`` after the hook exited (a background process
    it left behind may hold the pipe open forever; its later output is not read)."""
    assert process.stdout is not None
    fd = process.stdout.fileno()
    exited_at: float | None = None
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while True:
            now = time.monotonic()
            if exited_at is None and process.poll() is not None:
                exited_at = now
            if exited_at is not None and now - exited_at >= DRAIN_S:
                break
            if now >= deadline:
                return True
            if selector.select(timeout=min(0.1, deadline - now)):
                chunk = os.read(fd, 65536)
                if not chunk:
                    break
                tail.feed(chunk)
    try:
        process.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        return True
    return False


def _kill_group(process: subprocess.Popen[bytes], grace_s: float = KILL_GRACE_S) -> None:
    """SIGTERM to the hook's whole process group, SIGKILL after ``grace_s``; reaps the hook."""
    if grace_s > 0:
        _signal_group(process.pid, signal.SIGTERM)
        with suppress(subprocess.TimeoutExpired):
            process.wait(timeout=grace_s)
    # the group's other members may outlive the hook or ignore SIGTERM
    _signal_group(process.pid, signal.SIGKILL)
    process.wait()


def _signal_group(group: int, sig: signal.Signals) -> None:
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(group, sig)


@contextmanager
def result_file(data: Mapping[str, Any], json_file: str | None) -> Iterator[str]:
    """The path post-hooks get as TFSDEPLOY_RESULT_FILE: ``json_file`` when the run writes one
    (written by then), else a private temporary file holding ``data``, removed afterwards."""
    if json_file:
        yield json_file
        return
    fd, temp = tempfile.mkstemp(prefix="tfsdeploy-result-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(data, handle, indent=2, default=str)
            handle.write("\n")
        yield temp
    finally:
        with suppress(FileNotFoundError):
            os.unlink(temp)
