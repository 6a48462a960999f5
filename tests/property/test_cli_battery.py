"""Hostile-input battery for the command line: every fab task (tasks.py) given generated option
values (numbers as text, nan/inf/1e308/-0, huge and empty values, control characters, host
patterns that are junk or match nothing, model names with path separators, junk versions,
release ids, canary weights, times, durations and paths), parsed by invoke as `fab` parses
them and run through the task and the real dispatcher (tfsdeploy.cli.main), in this process,
with the testbed inventory and no reachable host: every SSH connection, socket connection,
gRPC channel, load run and metrics watch is recorded and refused.

Whatever the arguments: the exit code is a documented one (errors.ExitCode), nothing prints a
traceback or reports a defect ("unexpected ..."), invalid input is found before any
connection, and a value that is certainly invalid for its option (text where a number goes, a
model not in the catalog, a pattern matching no host, a release id the toolkit never makes,
an empty value...) exits 1 naming the option or quoting the value, with no connection
attempted. TensorFlow is never imported.
"""

from __future__ import annotations

import contextlib
import fnmatch
import importlib.abc
import importlib.machinery
import io
import math
import socket
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from invoke.exceptions import Exit, ParseError
from invoke.parser import Parser

import tasks as fab
from tfsdeploy.core.errors import ExitCode, HostUnreachable
from tfsdeploy.core.inventory.layout import RELEASE_ID
from tfsdeploy.core.inventory.load import load_inventory
from tfsdeploy.core.visible import visible

from .budget import examples
from .strategies import FLAGS, TMP, CliCase, cli_cases

# how cli.output.print_error reports an exception nobody planned for
DEFECT = "a defect of tfsdeploy"
ROOT = Path(__file__).resolve().parents[2]
# the testbed inventory as shipped (tb1..tb3), never the live fleet's hosts.json: the alone
# phase of scripts/test reshapes that fleet beside the fleet-free tiers
NO_TESTBED = "/nonexistent/no-testbed"
with pytest.MonkeyPatch.context() as shipped:
    shipped.setenv("TFSDEPLOY_TESTBED_DIR", NO_TESTBED)
    TESTBED = load_inventory(str(ROOT / "inventory" / "testbed.py"))
HOSTS = tuple(h.name for h in TESTBED.hosts)
GROUPS = tuple(TESTBED.groups)
CATALOG = tuple(TESTBED.models)
CONTEXTS = fab.ns.to_contexts()
FLAG_NAMES = {(c.name, (a.attr_name or a.name).replace("-", "_")): f"--{a.names[0]}"
              for c in CONTEXTS for a in c.flags.values()}
COMMANDS = {c.name: tuple(sorted({(a.attr_name or a.name).replace("-", "_")
                                  for a in c.flags.values()})) for c in CONTEXTS}


class Attempts:
    """Every attempt to reach something outside this process, refused."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def refuse(self, what: str) -> None:
        self.seen.append(what)


@pytest.fixture(scope="module")
def no_network(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Attempts, Path]]:
    """No host, socket, gRPC channel, load run or metrics watch is reachable: each attempt is
    recorded and refused. Commands run in a scratch directory (where `fab accept` and a
    relative --out would write), with the testbed inventory named absolutely."""
    from tfsdeploy.accept import run as accept_run
    from tfsdeploy.hosts.ssh import SshConnection
    from tfsdeploy.loadtest import cli as loadtest_cli
    from tfsdeploy.loadtest.transport import ConnectError
    from tfsdeploy.run import guard as cli_guard

    attempts = Attempts()
    tmp = tmp_path_factory.mktemp("cli")
    (tmp / "file.txt").write_text("a file, not a directory\n")
    (tmp / "sweep.json").write_text('{"kind": "junk"}\n')
    (tmp / "hooks").mkdir()

    def transport(self: SshConnection) -> Any:
        attempts.refuse(f"ssh {self.host.name}")
        raise HostUnreachable(f"{self.host.name}: no host is reachable in this test")

    def connect(sock: socket.socket, address: Any, *args: Any) -> Any:
        attempts.refuse(f"socket {address}")
        raise ConnectionRefusedError(f"no connection to {address} in this test")

    def channel(target: str, *args: Any, **kwargs: Any) -> Any:
        attempts.refuse(f"grpc {target}")
        raise HostUnreachable(f"{target}: no gRPC channel in this test")

    def watch(target: Any, policy: Any, **kwargs: Any) -> tuple[ExitCode, str]:
        attempts.refuse("guard")
        return ExitCode.INCONSISTENT, "no host is reachable in this test"

    def load(*args: Any, **kwargs: Any) -> Any:
        attempts.refuse("load")
        raise ConnectError("no host is reachable in this test")

    def generators(*args: Any, **kwargs: Any) -> Any:
        attempts.refuse("accept")
        raise HostUnreachable("no load generator is reachable in this test")

    import grpc

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(SshConnection, "_transport", transport)
        patch.setattr(socket.socket, "connect", connect)
        patch.setattr(socket.socket, "connect_ex", connect)
        patch.setattr(grpc, "insecure_channel", channel)
        patch.setattr(grpc.aio, "insecure_channel", channel)
        patch.setattr(cli_guard, "guard", watch)
        patch.setattr(loadtest_cli, "execute", load)
        patch.setattr(accept_run, "prepare_all", generators)
        patch.setenv("TFSDEPLOY_INVENTORY", str(ROOT / "inventory" / "testbed.py"))
        patch.setenv("TFSDEPLOY_TESTBED_DIR", NO_TESTBED)
        patch.delenv("TFSDEPLOY_DEBUG", raising=False)
        patch.chdir(tmp)
        yield attempts, tmp


def argv(case: CliCase, tmp: Path) -> list[str]:
    """The words after `fab`."""
    words = [case.command]
    for name, value in case.options.items():
        flag = FLAG_NAMES[(case.command, name)]
        for item in value if isinstance(value, list) else [value]:
            words.append(flag if item is None else f"{flag}={place(item, tmp)}")
    return [*words, "--", *case.after] if case.command == "exec" else words


def place(value: str, tmp: Path) -> str:
    return value.replace(TMP, str(tmp)).replace("{project}", str(ROOT))


class TensorFlowRefused(importlib.abc.MetaPathFinder):
    """An import system in which every import of TensorFlow fails and is written down (the
    deploy machine has no TensorFlow: no command may need it)."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def find_spec(self, fullname: str, path: Any, target: Any = None
                  ) -> importlib.machinery.ModuleSpec | None:
        if fullname.partition(".")[0] == "tensorflow":
            self.asked.append(fullname)
            raise ImportError(f"{fullname}: the commands must run without TensorFlow")
        return None


@contextlib.contextmanager
def tensorflow_refused() -> Iterator[TensorFlowRefused]:
    """While inside, importing TensorFlow fails and is recorded, whether or not another test
    of this process loaded it before (it is taken out of ``sys.modules`` and put back)."""
    loaded = sys.modules.pop("tensorflow", None)
    finder = TensorFlowRefused()
    sys.meta_path.insert(0, finder)
    try:
        yield finder
    finally:
        sys.meta_path.remove(finder)
        if loaded is not None:
            sys.modules["tensorflow"] = loaded


def run(case: CliCase, tmp: Path) -> tuple[int, str]:
    """Parse as fab does, call the task's body as fab does; the exit code and the output."""
    out, err = io.StringIO(), io.StringIO()
    words = argv(case, tmp)
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            parsed = Parser(contexts=CONTEXTS).parse_argv(words)
        except ParseError as error:  # fab prints it and exits 1
            return 1, str(error)
        task = fab.ns[case.command]
        saved = sys.argv
        sys.argv = ["fab", *words]  # `fab exec` reads the words after `--` from here
        try:
            task.body(None, **parsed[0].as_kwargs)
            code = 0
        except Exit as stop:
            code = stop.code
        finally:
            sys.argv = saved
    return code, out.getvalue() + err.getvalue()


# -- what is certainly invalid, option by option ---------------------------------------------

def _number(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


def _matches_nothing(patterns: str) -> bool:
    tokens = [t.strip() for t in patterns.split(",") if t.strip()]
    return not tokens or any(
        t != "all" and t not in GROUPS and not fnmatch.filter(HOSTS, t) for t in tokens)


def _is_file(path: str) -> bool:
    try:
        return Path(path).is_file()
    except (OSError, ValueError):  # too long, NUL
        return False


def _unusable_output(path: str, *, directory: bool) -> bool:
    if not path.strip() or "\x00" in path or any(len(p) > 255 for p in path.split("/")):
        return True
    target = Path(path)
    if target.exists() and target.is_dir() != directory:
        return True
    return any(parent.exists() and not parent.is_dir() for parent in target.parents)


def certainly_invalid(name: str, value: Any) -> bool:
    """Whether ``value`` cannot be right for option ``name`` (whatever the fleet holds)."""
    if value is None:
        return False
    if isinstance(value, list):  # --notify
        return any(not item.startswith(("http://", "https://")) for item in value)
    if not value.strip():
        return True  # an empty value is never a choice: leaving the option out is
    rules = {
        "model": lambda v: v not in CATALOG,
        "hosts": _matches_nothing, "limit": _matches_nothing, "loadgens": _matches_nothing,
        "version": lambda v: not (v.isascii() and v.isdigit()) or int(v) == 0,
        "to": lambda v: not RELEASE_ID.fullmatch(v),
        "canary_weights": lambda v: not any(c.isascii() and c.isdigit() for c in v),
        "since": lambda v: not any(c.isascii() and c.isdigit() for c in v),
        "duration": lambda v: not any(c.isascii() and c.isdigit() for c in v),
        "json_file": lambda v: _unusable_output(v, directory=False),
        "log_file": lambda v: _unusable_output(v, directory=False),
        "metrics_file": lambda v: _unusable_output(v, directory=False),
        "report": lambda v: _unusable_output(v, directory=False),
        "sweep_plot": lambda v: _unusable_output(v, directory=False),
        "out": lambda v: _unusable_output(v, directory=True),
        "inventory": lambda v: not _is_file(v), "playbook": lambda v: not _is_file(v),
        "lines": lambda v: not _number(v) or float(v) < 1,
        "write": lambda v: _unusable_output(v, directory=False),
        "budget": lambda v: not any(c.isascii() and c.isdigit() for c in v),
        "step": lambda v: not any(c.isascii() and c.isdigit() for c in v),
        "for_": lambda v: not any(c.isascii() and c.isdigit() for c in v),
        # `fab tune --host`: one of the model's hosts (both testbed models are on all three)
        "host": lambda v: v not in ("tb1", "tb2", "tb3"),
    }
    if name in rules:
        return bool(rules[name](value))
    return name not in ("hooks", "sweep_report", "tune_report", "release", "data_version",
                        "interval", "release_at", "start_margin", "timeout") \
        and not _number(value)


def names_it(output: str, flag: str, value: Any) -> bool:
    """Whether the output names the option (as fab does, or as invoke's parser does), or
    quotes its value (as shown: its control characters escaped, core.visible)."""
    values = value if isinstance(value, list) else [value]
    return flag in output or f"<Argument: {flag[2:]} " in output or any(
        repr(v) in output or (len(v) >= 3 and visible(v) in output) for v in values)


def test_plan_capacity_with_tiny_factors_exits_1_naming_them(
        no_network: tuple[Attempts, Path]) -> None:
    case = CliCase("plan-capacity", {"target_qps": "100", "per_instance_qps": "10",
                                     "availability_factor": "1e-308"})
    code, output = run(case, no_network[1])
    assert code == 1 and DEFECT not in output, output


@examples(400)
@given(case=cli_cases(COMMANDS))
def generated_commands(no_network: tuple[Attempts, Path], outcomes: Counter[str],
                       case: CliCase) -> None:
    """One generated command line (the battery: hypothesis runs it over its cases); what it
    ended in is counted in ``outcomes``."""
    attempts, tmp = no_network
    attempts.seen.clear()
    placed = {name: (None if value is None else [place(v, tmp) for v in value]
                     if isinstance(value, list) else place(value, tmp))
              for name, value in case.options.items()}
    bad = {name: value for name, value in placed.items()
           if name not in FLAGS and certainly_invalid(name, value)}
    with tensorflow_refused() as tensorflow:
        code, output = run(case, tmp)
    outcomes[f"exit {code}"] += 1
    assert tensorflow.asked == [], (tensorflow.asked, output)
    assert code in {int(c) for c in ExitCode}, (code, output)
    assert "Traceback" not in output and DEFECT not in output, output
    if "invalid input" in output:
        assert attempts.seen == [], ("input found invalid after connecting", attempts.seen)
    if bad:
        outcomes["certainly invalid"] += 1
        assert code == 1 and attempts.seen == [], (bad, code, attempts.seen, output)
        # the refusal may be another option's: every bad one is named only when it is
        # typed by options(); the others are found one check after another
        assert any(names_it(output, FLAG_NAMES[(case.command, name)], value)
                   for name, value in placed.items() if name not in FLAGS), (bad, output)


def test_every_command_with_generated_options_exits_with_a_documented_code(
        no_network: tuple[Attempts, Path]) -> None:
    outcomes: Counter[str] = Counter()
    generated_commands(no_network, outcomes)
    # generated arguments that were all refused would test the first check and nothing after
    # it: the battery reaches the hosts (exit 3: none answers) and certain refusals
    assert outcomes["certainly invalid"] and outcomes["exit 3"], outcomes

