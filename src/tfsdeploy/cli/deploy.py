"""`fab deploy`: render, validate, lock, then run the deploy playbook over the fleet."""

from __future__ import annotations

import difflib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

from tfsdeploy import lock
from tfsdeploy.actions import HostJob, Release, discover_state
from tfsdeploy.cli.render import RenderRequest, render_inventory
from tfsdeploy.errors import ConfigError, ExitCode, Problem, TfsDeployError
from tfsdeploy.gates import Clock, SystemClock
from tfsdeploy.golden import load_golden
from tfsdeploy.inventory import Inventory, ResolvedHost, load_inventory
from tfsdeploy.layout import host_paths, new_release_id
from tfsdeploy.playbook import Playbook, load_playbook, project_dir
from tfsdeploy.remote import Runner, SshRunner
from tfsdeploy.render import HostRender
from tfsdeploy.rollout import CancellableClock, DeployResult, Interrupted, Reporter, make_roll
from tfsdeploy.rollout import deploy_phases as run_deploy_phases

RunnerFactory = Callable[[ResolvedHost], Runner]


@dataclass(frozen=True)
class DeployRequest:
    """What `fab deploy` was asked for."""

    model: str
    inventory: str | None = None
    hosts: str | None = None
    limit: str | None = None
    version: int | str | None = None
    playbook: str | None = None
    lock_wait: float = 0.0


class LineReporter:
    """Progress lines as steps finish: elapsed, host, phase, step, status, duration, detail."""

    def __init__(self, stream: TextIO, log_file: str | None = None) -> None:
        self._streams = [stream]
        if log_file:
            Path(log_file).parent.mkdir(parents=True, exist_ok=True)
            self._streams.append(open(log_file, "a", buffering=1))  # noqa: SIM115
        self._start = time.monotonic()
        self._lock = threading.Lock()

    def _print(self, text: str) -> None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
        for index, stream in enumerate(self._streams):
            print(f"{stamp} {text}" if index else text, file=stream, flush=True)

    def step(self, host: str, phase: str, task: str, status: str, seconds: float,
             detail: str) -> None:
        """Print one finished step."""
        first, *rest = (detail or "").splitlines() or [""]
        with self._lock:
            self._print(f"[{time.monotonic() - self._start:7.1f}s] {host:<10} {phase:<9} "
                        f"{task:<15} {status:<7} {seconds:6.2f}s  {first}")
            for line in rest:
                self._print(f"{'':>60}{line}")

    def note(self, text: str) -> None:
        """Print a fleet-level message."""
        with self._lock:
            self._print(f"[{time.monotonic() - self._start:7.1f}s] == {text}")


def build_release(inventory: Inventory, renders: list[HostRender], clock: Clock) -> Release:
    """The fleet-wide release facts; the version directory must exist locally."""
    model = renders[0].model
    version = renders[0].version
    source = Path(model.source) / str(version)
    if not (source / "saved_model.pb").is_file():
        raise ConfigError(Problem(
            f"version {version} of {model.name} is not in its source ({source} has no "
            "saved_model.pb)", fix="pick a version that exists (see --version) or fix the "
            "model's source", file=inventory.path, field=f"models.{model.name}.source"))
    golden = load_golden(model.golden, version) if model.golden else []
    return Release(model=model, version=version, release_id=new_release_id(version),
                   image=renders[0].host.vars.image, source_dir=str(source), golden=golden,
                   who=lock.current_user(), clock=clock)


@contextmanager
def interrupts_cancel(cancel: threading.Event, reporter: Reporter) -> Iterator[None]:
    """Ctrl-C and SIGTERM (cron, systemd) ask the run to stop: the current steps finish, the
    hosts are restored, the lock is released. The handler never raises, so pressing Ctrl-C
    again cannot cut a restore or the lock release short."""
    def handler(signum: int, frame: FrameType | None) -> None:
        if cancel.is_set():
            reporter.note("already stopping: restoring, then releasing the lock")
            return
        cancel.set()
        reporter.note(f"{signal.Signals(signum).name}: finishing the current steps, then "
                      "restoring; the lock is released at the end")

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for number, old in previous.items():
            signal.signal(number, old)


def deploy(request: DeployRequest, *, reporter: Reporter,
           runner_factory: RunnerFactory = SshRunner, clock: Clock | None = None,
           client_factory: Callable[[str, int, str], Any] | None = None) -> DeployResult:
    """Validate everything, take the lock, run the playbook; always release the lock."""
    inventory = load_inventory(request.inventory)
    renders = render_inventory(inventory, RenderRequest(
        model=request.model, inventory=request.inventory, hosts=request.hosts,
        limit=request.limit, version=request.version))
    playbook = load_playbook(request.playbook or project_dir() / "playbooks" / "deploy.yml")
    cancel = threading.Event()
    release = build_release(inventory, renders, CancellableClock(clock or SystemClock(), cancel))
    release.client_factory = client_factory
    runners = {r.host.name: runner_factory(r.host) for r in renders}
    return execute(inventory=inventory, playbook=playbook, release=release, renders=renders,
                   runners=runners, reporter=reporter, cancel=cancel,
                   lock_wait=request.lock_wait, clock=clock, runner_factory=runner_factory,
                   verb="deploy")


def execute(*, inventory: Inventory, playbook: Playbook, release: Release,
            renders: list[HostRender], runners: dict[str, Runner], reporter: Reporter,
            cancel: threading.Event, lock_wait: float, clock: Clock | None,
            runner_factory: RunnerFactory, verb: str) -> DeployResult:
    """Take the fleet lock, run the playbook's phases, always release the lock."""
    model = release.model
    sites = lock_sites(inventory, model, runners, runner_factory)
    info = lock.new_lock_info(f"{verb} {model.name} v{release.version}")
    jobs = [HostJob(release=release, host=r.host, runner=runners[r.host.name], render=r)
            for r in renders]
    started = time.monotonic()
    try:
        with interrupts_cancel(cancel, reporter):
            try:
                taken = lock.acquire_majority(sites, info, wait_s=lock_wait,
                                              clock=release.clock, model=model.name,
                                              on_stale=reporter.note)
            except Interrupted:
                raise TfsDeployError("interrupted while waiting for the lock; nothing was "
                                     "changed") from None
            reporter.note(f"{verb} {model.name} version {release.version} as "
                          f"{release.release_id} on {len(jobs)} host(s); lock on "
                          f"{', '.join(s.host for s in taken)}")
            try:
                roll = make_roll(playbook=playbook, release=release, jobs=jobs,
                                 reporter=reporter, cancel=cancel)
                result = run_deploy_phases(roll)
            finally:
                unreleased = lock.release_sites(taken, info)
            if unreleased:
                result.exit_code = max(result.exit_code, ExitCode.INCONSISTENT)
                result.message += (f"; the lock could not be released on "
                                   f"{', '.join(unreleased)}: check with "
                                   f"`fab lock --model {model.name}`")
    finally:
        for runner in {id(r): r for r in [*runners.values(), *(s.runner for s in sites)]
                       }.values():
            runner.close()
        if release.archive:
            os.unlink(release.archive)
    result.seconds = time.monotonic() - started
    return result


def lock_sites(inventory: Inventory, model: Any, runners: dict[str, Runner],
               runner_factory: RunnerFactory) -> list[lock.LockSite]:
    """Every host of the model (whatever --hosts selects) keeps a part of its lock."""
    return [lock.LockSite(h.name, runners.get(h.name) or runner_factory(h),
                          host_paths(h, model).lock_dir)
            for h in inventory.select(None, model=model)]


def summary_rows(result: DeployResult) -> list[tuple[str, ...]]:
    """Per host: result, and time in each phase and gate."""
    rows: list[tuple[str, ...]] = []
    for name, outcome in result.hosts.items():
        by_phase: dict[str, float] = {}
        for step in outcome.steps:
            by_phase[step["phase"]] = by_phase.get(step["phase"], 0.0) + step["seconds"]
        gates = {s["step"]: s["seconds"] for s in outcome.steps if s["step"].startswith("gate_")}
        rows.append((name, outcome.status,
                     " ".join(f"{p} {s:.1f}s" for p, s in by_phase.items()),
                     " ".join(f"{g[5:]} {s:.1f}s" for g, s in gates.items()),
                     (outcome.error.splitlines() or [""])[0][:80]))
    return rows


def plan(request: DeployRequest, *, diff: bool, runner_factory: RunnerFactory = SshRunner
         ) -> list[dict[str, Any]]:
    """`--check`: what a deploy would do on each host, and file diffs; touches nothing."""
    inventory = load_inventory(request.inventory)
    renders = render_inventory(inventory, RenderRequest(
        model=request.model, inventory=request.inventory, hosts=request.hosts,
        limit=request.limit, version=request.version))
    release = build_release(inventory, renders, SystemClock())
    rows = []
    for render in renders:
        runner = runner_factory(render.host)
        try:
            job = HostJob(release=release, host=render.host, runner=runner, render=render)
            try:
                seen = discover_state(job)
            except Exception as error:
                rows.append({"host": render.host.name, "action": "unreachable",
                             "detail": str(error), "diff": ""})
                continue
            action = ("nothing (unchanged)" if job.unchanged else
                      f"roll {job.old.release} -> v{release.version} in {job.new_slot}"
                      if job.old else f"first release v{release.version} in blue")
            rows.append({"host": render.host.name, "action": action, "detail": seen,
                         "diff": _diff(job) if diff else ""})
        finally:
            runner.close()
    return rows


def _diff(job: HostJob) -> str:
    current = job.paths.current
    chunks: list[str] = []
    for rendered in job.render.files:
        live = job.runner.run(["cat", f"{current}/{rendered.name}"])
        before = live.stdout if live.ok else ""
        chunks += difflib.unified_diff(before.splitlines(keepends=True),
                                       rendered.text.splitlines(keepends=True),
                                       fromfile=f"{job.host.name}:live/{rendered.name}",
                                       tofile=f"{job.host.name}:new/{rendered.name}")
    return "".join(chunks)


def print_json(data: Any) -> None:
    """Machine-readable output on stdout."""
    json.dump(data, sys.stdout, indent=2, default=str)
    print()


__all__ = ["DeployRequest", "ExitCode", "LineReporter", "deploy", "plan", "print_json",
           "summary_rows"]
