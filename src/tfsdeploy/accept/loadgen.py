"""Generator hosts: set up, run one share of the load, collect the results, clean up.

A remote generator is reached with the toolkit's own SSH runner (strict host keys); this
machine, when no generator group is given, through a local runner with the same calls. Both
run the same argument lists (``commands``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from tfsdeploy.accept import commands
from tfsdeploy.accept.bundle import (
    Bundle,
    BundleError,
    compatibility_problem,
    import_check,
    platform_facts,
    verify_bundle,
)
from tfsdeploy.accept.merge import FAILED, LOST, OK, GeneratorOutcome
from tfsdeploy.accept.plan import GeneratorSpec
from tfsdeploy.core.errors import HostUnreachable, TfsDeployError
from tfsdeploy.core.inventory.fleet import ResolvedHost
from tfsdeploy.hosts.ssh import Result, SshConnection
from tfsdeploy.loadtest import stats
from tfsdeploy.loadtest.cli import RAW_KIND

SETUP_TIMEOUT_S = 300.0
RAN_CODES = (0, 2, 130)  # the generator's own exit codes that come with results


class LoadgenError(TfsDeployError):
    """A generator host could not be set up (exit 1: nothing was measured)."""


class HostRunner(Protocol):
    """What a generator needs of its host (ssh.SshConnection has it)."""

    def run(self, argv: list[str], *, timeout: float | None = None) -> Result:
        """Run ``argv`` on the host."""

    def put_bytes(self, data: bytes, path: str) -> None:
        """Write ``data`` to ``path`` on the host."""

    def put_file(self, local: str, path: str) -> None:
        """Upload a local file to ``path`` on the host."""

    def close(self) -> None:
        """Release the connection."""


class LocalRunner:
    """This machine as a generator host: the runner's calls, as local processes and files."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        self._env = env

    def run(self, argv: list[str], *, timeout: float | None = None) -> Result:
        """Run ``argv`` here; a command past its deadline is killed and reported lost.

        Each command leads a session of its own, as a command over SSH does: a Ctrl-C at the
        terminal reaches ``fab accept``, which then stops each generator exactly once.
        """
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                                  env=self._env, stdin=subprocess.DEVNULL,
                                  start_new_session=True)
        except subprocess.TimeoutExpired as err:
            raise HostUnreachable(f"this machine: `{argv[0]} ...` gave no answer in "
                                  f"{timeout:g} s") from err
        return Result(tuple(argv), done.returncode, done.stdout, done.stderr)

    def put_bytes(self, data: bytes, path: str) -> None:
        """Write ``data`` to ``path``."""
        Path(path).write_bytes(data)

    def put_file(self, local: str, path: str) -> None:
        """Copy a file."""
        Path(path).write_bytes(Path(local).read_bytes())

    def close(self) -> None:
        """Nothing to release."""


@dataclass
class GeneratorHost:
    """A generator host ready to run: its runner, interpreter, run directory and size."""

    spec: GeneratorSpec
    runner: HostRunner
    python: str
    files: commands.RunFiles
    cores: int
    clock_offset_ms: float | None
    note: str  # how its environment was made, for the progress lines

    @property
    def name(self) -> str:
        """The generator's name (its inventory host, or ``local``)."""
        return self.spec.name


def prepare_local(spec: GeneratorSpec, requests: bytes) -> GeneratorHost:
    """This machine: its own interpreter and this checkout's package, a temp run directory."""
    package_parent = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": package_parent}
    run_dir = tempfile.mkdtemp(prefix="tfsdeploy-accept-")
    files = commands.RunFiles(run_dir)
    runner = LocalRunner(env)
    runner.put_bytes(requests, files.requests)
    return GeneratorHost(spec, runner, sys.executable, files, os.cpu_count() or 1, 0.0,
                         "this machine's environment")


def clock_offset_ms(sent_ns: int, remote_ns: int, received_ns: int) -> float:
    """How far the host's clock is at least from ours: 0 when its reading falls inside our
    round trip (the clocks agree to within it), else the distance to the nearer end.

    Not the midpoint: the host reads its clock after starting python3, late in the round
    trip, so a midpoint would report that start-up time as an offset.
    """
    if remote_ns < sent_ns:
        return (remote_ns - sent_ns) / 1e6
    if remote_ns > received_ns:
        return (remote_ns - received_ns) / 1e6
    return 0.0


def _probe(runner: HostRunner, dirs: commands.HostDirs, name: str
           ) -> tuple[dict[str, Any], float]:
    """The host's facts, and how far its clock is at least from ours (ms)."""
    sent = time.time_ns()
    result = runner.run(commands.probe(dirs.env), timeout=60)
    received = time.time_ns()
    if not result.ok:
        raise LoadgenError(f"{name}: python3 did not run ({result.tail()}): a generator host "
                           "needs python3 of the toolkit's version")
    facts: dict[str, Any] = json.loads(result.stdout)
    facts["roundTripMs"] = (received - sent) / 1e6
    return facts, clock_offset_ms(sent, int(facts["timeNs"]), received)


def _install(runner: HostRunner, bundle: Bundle, dirs: commands.HostDirs, name: str) -> None:
    made = runner.run(commands.make_dirs(dirs.env_root), timeout=60)
    if not made.ok:
        raise LoadgenError(f"{name}: cannot create {dirs.env_root}: {made.tail(1)}")
    try:
        verify_bundle(bundle)
    except BundleError as err:
        raise LoadgenError(f"{name}: {err}") from err
    runner.put_file(str(bundle.path), dirs.upload)
    result = runner.run(commands.install_env(dirs, import_check(), bundle.sha256),
                        timeout=SETUP_TIMEOUT_S)
    if result.code == 5:
        raise LoadgenError(f"{name}: the generator environment arrived with another sha256 "
                           f"than {bundle.sha256[:12]}... (changed in transit or on the host's "
                           "disk): not installed; fix: run again, and check the host's disk")
    if not result.ok:
        runner.run(commands.remove_tree(dirs.upload), timeout=60)
        raise LoadgenError(f"{name}: the generator environment did not install: "
                           f"{result.tail()}")


def prepare_remote(spec: GeneratorSpec, bundle: Bundle, run_id: str, requests: bytes, *,
                   runner_factory: Callable[[ResolvedHost], HostRunner] = SshConnection
                   ) -> GeneratorHost:
    """Probe the host, install the environment unless cached, upload the requests."""
    assert spec.host is not None
    dirs = commands.HostDirs(spec.host.vars.data_root.rstrip("/"), bundle.key, run_id)
    runner = runner_factory(spec.host)
    try:
        facts, offset_ms = _probe(runner, dirs, spec.name)
        problem = compatibility_problem(platform_facts(), facts)
        if problem:
            raise LoadgenError(f"{spec.name}: its {problem}: install the toolkit's Python "
                               "version there, or pick another --loadgens group")
        started = time.monotonic()
        note = f"environment {bundle.key} cached"
        if not facts["envReady"]:
            _install(runner, bundle, dirs, spec.name)
            note = f"environment {bundle.key} installed in {time.monotonic() - started:.1f} s"
        runner.run(commands.prune_envs(dirs), timeout=60)
        files = commands.RunFiles(dirs.run)
        made = runner.run(commands.make_dirs(dirs.run), timeout=60)
        if not made.ok:
            raise LoadgenError(f"{spec.name}: cannot create {dirs.run}: {made.tail(1)}")
        runner.put_bytes(requests, files.requests)
    except HostUnreachable as err:
        runner.close()
        raise LoadgenError(f"{spec.name}: unreachable during set-up: {err}") from err
    except OSError as err:  # an upload refused (no space, no permission under data_root)
        runner.close()
        raise LoadgenError(f"{spec.name}: set-up under {dirs.root}/loadgen failed: {err}: "
                           "free space there or set the host's data_root") from err
    except BaseException:
        runner.close()
        raise
    note += (f"; clock agrees with ours to within the {facts['roundTripMs']:.0f} ms probe"
             if offset_ms == 0 else f"; clock at least {offset_ms:+.0f} ms off ours")
    return GeneratorHost(spec, runner, dirs.python, files, int(facts["cores"]), offset_ms,
                         note)


# -- running ------------------------------------------------------------------------------------

def _results(gen: GeneratorHost) -> tuple[list[stats.ProcResult], Any]:
    """The generator's raw output, parsed (ValueError when absent or not ours)."""
    result = gen.runner.run(commands.read_file(gen.files.raw), timeout=120)
    if not result.ok:
        raise ValueError(f"no results file ({result.tail(2)})")
    data = json.loads(result.stdout)
    if data.get("kind") != RAW_KIND:
        raise ValueError("the results file is not a load generator's")
    return [stats.result_from_json(p) for p in data["procs"]], data.get("hostCpu")


def _lost_reason(gen: GeneratorHost, err: Exception) -> str:
    """After the run's connection died: is the host still there (the process died), or not?"""
    try:
        alive = gen.runner.run(commands.alive(gen.files.pid), timeout=20)
    except Exception as again:
        return f"host unreachable ({again})"
    if alive.ok:  # we no longer wait for it: end its window, it must not run on unwatched
        stop_generator(gen)
    state = "still running (stopped now)" if alive.ok else "gone"
    return f"connection to the generator lost ({err}); host reachable, generator process {state}"


def run_generator(gen: GeneratorHost, argv: list[str], *, timeout_s: float,
                  start_at_s: float) -> GeneratorOutcome:
    """Run one generator to its end and collect its results, or say why there are none."""
    outcome = GeneratorOutcome(gen.name, gen.spec.share_qps, OK,
                               clock_offset_ms=gen.clock_offset_ms)
    try:
        result = gen.runner.run(commands.with_pid_file(gen.files.pid, argv), timeout=timeout_s)
    except HostUnreachable as err:
        outcome.ended_s = time.time() - start_at_s
        reason = _lost_reason(gen, err)
        try:  # the link may have died after the generator wrote its results
            outcome.results, outcome.host_cpu = _results(gen)
            outcome.error = f"results recovered after: {reason}"
        except Exception:
            outcome.status, outcome.error = LOST, reason
        return outcome
    outcome.ended_s = time.time() - start_at_s
    if result.code not in RAN_CODES:
        # 1 is the generator's own "could not start" (bad input, unreachable target, late)
        outcome.status = FAILED if result.code == 1 or outcome.ended_s <= 0 else LOST
        died = f"killed by signal {-result.code}" if result.code < 0 else f"exit {result.code}"
        outcome.error = f"generator {died}: {result.tail(3) or 'no output'}"
        return outcome
    try:
        outcome.results, outcome.host_cpu = _results(gen)
    except (ValueError, HostUnreachable) as err:
        outcome.status, outcome.error = FAILED, f"exit {result.code} without results: {err}"
    return outcome


def stop_generator(gen: GeneratorHost) -> bool:
    """Ask a running generator to end its window now (it still writes its results); whether
    it was asked (False: it had not started yet, or its host did not answer)."""
    try:
        return gen.runner.run(commands.stop(gen.files.pid), timeout=20).ok
    except Exception as err:  # interrupting: report and go on to the other hosts
        print(f"accept: {gen.name}: could not stop the generator: {err}", file=sys.stderr)
        return False


def cleanup(gen: GeneratorHost) -> str | None:
    """Remove the run directory and close the connection; the problem, if any."""
    try:
        result = gen.runner.run(commands.remove_tree(gen.files.run_dir), timeout=60)
        return None if result.ok else f"{gen.name}: {gen.files.run_dir} left: {result.tail(1)}"
    except Exception as err:
        return f"{gen.name}: {gen.files.run_dir} left: {err}"
    finally:
        gen.runner.close()
