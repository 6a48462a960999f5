"""The rolling deploy: phases of a playbook over the hosts, batches, gates, restore, revert.

The loop is explicit: preflight and staging on every host (nothing serving changes), then
batches of hosts rolled in their dual-version window; the first failure beyond the threshold
stops the roll, the failed host is restored, and the hosts already rolled are reverted or kept
per policy. Effects go through ``Runner``s made by ``runner_factory`` (tests pass fakes).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, Protocol

from tfsdeploy import commands
from tfsdeploy.actions import ACTIONS, HostJob, Release, manifest
from tfsdeploy.batches import plan_batches, threshold_exceeded
from tfsdeploy.errors import ExitCode
from tfsdeploy.gates import Clock, GateFailed, SystemClock
from tfsdeploy.playbook import Phase, Playbook
from tfsdeploy.proxy import ProxyAdmin, maint_commands, parse_sessions, render_proxy_config
from tfsdeploy.proxy import switch_commands as proxy_switch_commands
from tfsdeploy.remote import HostUnreachable


class Interrupted(Exception):
    """Ctrl-C or SIGTERM arrived: stop at the next step boundary and restore."""


class Reporter(Protocol):
    """Where progress goes (the CLI prints it; tests record it)."""

    def step(self, host: str, phase: str, task: str, status: str, seconds: float,
             detail: str) -> None:
        """One step finished (status: ok, failed, skipped, restored ...)."""

    def note(self, text: str) -> None:
        """A fleet-level message."""


class CancellableClock:
    """A clock whose sleep raises Interrupted once the deploy is cancelled."""

    def __init__(self, inner: Clock, cancel: threading.Event) -> None:
        self._inner, self._cancel = inner, cancel

    def now(self) -> float:
        """The inner clock's time."""
        return self._inner.now()

    def sleep(self, seconds: float) -> None:
        """Sleep, unless cancelled."""
        if self._cancel.is_set():
            raise Interrupted()
        self._inner.sleep(seconds)
        if self._cancel.is_set():
            raise Interrupted()


@dataclass
class HostOutcome:
    """How one host ended."""

    host: str
    status: str  # rolled, unchanged, failed, restored, reverted, unreachable, skipped, unknown
    error: str = ""
    steps: list[dict[str, Any]] = field(default_factory=list)
    release: str = ""


@dataclass
class DeployResult:
    """The whole deploy, for people and machines."""

    model: str
    version: int
    release_id: str
    exit_code: ExitCode = ExitCode.OK
    message: str = ""
    hosts: dict[str, HostOutcome] = field(default_factory=dict)
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"model": self.model, "version": self.version, "release": self.release_id,
                "exit_code": int(self.exit_code), "result": self.exit_code.name.lower(),
                "message": self.message, "seconds": round(self.seconds, 3),
                "hosts": {n: o.__dict__ for n, o in self.hosts.items()}}


@dataclass
class Roll:
    """Everything the phases share."""

    playbook: Playbook
    release: Release
    jobs: list[HostJob]
    reporter: Reporter
    cancel: threading.Event
    serial: Sequence[int | str]
    max_fail_percentage: float
    on_failure: str
    result: DeployResult
    failed: set[str] = field(default_factory=set)

    def outcome(self, job: HostJob) -> HostOutcome:
        """The host's outcome record (created on first use)."""
        name = job.host.name
        if name not in self.result.hosts:
            self.result.hosts[name] = HostOutcome(name, "pending", steps=job.steps,
                                                  release=self.release.release_id)
        return self.result.hosts[name]


def run_tasks(roll: Roll, job: HostJob, phase: Phase) -> None:
    """Run a phase's tasks on one host, recording each step; raise on the first failure."""
    for task in phase.tasks:
        if roll.cancel.is_set():
            raise Interrupted()
        started = time.monotonic()
        try:
            detail = ACTIONS[task.action](job, **task.params)
        except Exception as error:
            seconds = time.monotonic() - started
            job.steps.append({"phase": phase.name, "step": task.action, "ok": False,
                              "seconds": round(seconds, 3), "detail": str(error)})
            roll.reporter.step(job.host.name, phase.name, task.action, "failed", seconds,
                               str(error))
            raise
        seconds = time.monotonic() - started
        job.steps.append({"phase": phase.name, "step": task.action, "ok": True,
                          "seconds": round(seconds, 3), "detail": detail})
        roll.reporter.step(job.host.name, phase.name, task.action, "ok", seconds, detail)


def run_parallel(roll: Roll, phase: Phase, jobs: list[HostJob]
                 ) -> dict[str, BaseException | None]:
    """Run ``phase`` on ``jobs`` at once (at most ``forks``); Ctrl-C cancels cleanly."""
    errors: dict[str, BaseException | None] = {}
    with ThreadPoolExecutor(max_workers=max(1, min(roll.playbook.forks, len(jobs)))) as pool:
        futures: dict[Future[None], HostJob] = {
            pool.submit(run_tasks, roll, job, phase): job for job in jobs}
        pending = set(futures)
        while pending:
            done, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
            for future in done:
                errors[futures[future].host.name] = future.exception()
    return errors


def deploy_phases(roll: Roll) -> DeployResult:
    """Run the playbook's phases; the exit code follows the README's table."""
    active = list(roll.jobs)
    for phase in roll.playbook.phases:
        if phase.mode == "batches":
            to_roll = [j for j in active if not j.unchanged]
            for job in active:
                if job.unchanged:
                    roll.outcome(job).status = "unchanged"
            if not roll_batches(roll, phase, to_roll):
                return roll.result
            # unchanged hosts go on too: finalize retires what a killed run left behind
            active = [j for j in active if j.host.name not in roll.failed]
            continue
        passed = run_fleet_phase(roll, phase, active)
        if passed is None:
            return roll.result
        active = passed
    for job in active:
        if roll.outcome(job).status == "pending":
            roll.outcome(job).status = "rolled"
    if roll.failed:
        _finish(roll, ExitCode.INCONSISTENT,
                f"{len(roll.failed)} host(s) failed within the allowed threshold and still "
                "serve their previous release")
    else:
        _finish(roll, ExitCode.OK, f"every host serves {roll.release.release_id}")
    return roll.result


def run_fleet_phase(roll: Roll, phase: Phase, jobs: list[HostJob]) -> list[HostJob] | None:
    """A parallel phase; returns the hosts that passed, or None when the deploy must stop."""
    errors = run_parallel(roll, phase, jobs)
    failed = [j for j in jobs if errors.get(j.host.name)]
    for job in failed:
        error = errors[job.host.name]
        status = "unreachable" if isinstance(error, HostUnreachable) else "failed"
        roll.outcome(job).status = status
        roll.outcome(job).error = str(error)
        roll.failed.add(job.host.name)
    if roll.cancel.is_set():
        _finish(roll, ExitCode.INVALID if phase.name != "finalize" else ExitCode.INCONSISTENT,
                f"interrupted during {phase.name}; no serving container was changed"
                if phase.name != "finalize" else "interrupted during finalize")
        return None
    if phase.name == "finalize":
        if failed:
            _finish(roll, ExitCode.INCONSISTENT, "the new release serves everywhere, but "
                    "finalize failed on " + ", ".join(j.host.name for j in failed))
            return None
        return jobs
    if threshold_exceeded(len(roll.failed), len(roll.jobs), roll.max_fail_percentage):
        _finish(roll, ExitCode.INVALID, f"{phase.name} failed on "
                f"{', '.join(sorted(roll.failed))}; nothing serving was changed")
        return None
    return [j for j in jobs if j.host.name not in roll.failed]


def roll_batches(roll: Roll, phase: Phase, jobs: list[HostJob]) -> bool:
    """Roll batch by batch; on a stop, restore and apply the policy. True to go on."""
    rolled: list[HostJob] = []
    batches = plan_batches(jobs, roll.serial)
    for number, batch in enumerate(batches, start=1):
        roll.reporter.note(f"batch {number}/{len(batches)}: "
                           + ", ".join(j.host.name for j in batch))
        errors = run_parallel(roll, phase, batch)
        for job in batch:
            error = errors.get(job.host.name)
            if error is None:
                rolled.append(job)
                roll.outcome(job).status = "rolled"
                continue
            roll.failed.add(job.host.name)
            roll.outcome(job).error = str(error)
            roll.outcome(job).status = restore_host(roll, job)
        stop = roll.cancel.is_set() or threshold_exceeded(
            len(roll.failed), len(roll.jobs), roll.max_fail_percentage)
        if stop:
            stop_roll(roll, rolled, batches[number:])
            return False
    return True


def stop_roll(roll: Roll, rolled: list[HostJob], untouched: list[list[HostJob]]) -> None:
    """After a stop: revert or keep the rolled hosts, and set the exit code."""
    for batch in untouched:
        for job in batch:
            roll.outcome(job).status = "skipped"
    reverted_ok = True
    if roll.on_failure == "revert":
        for job in rolled:
            status = restore_host(roll, job)
            roll.outcome(job).status = status
            reverted_ok &= status == "reverted"
    restored_ok = all(roll.result.hosts[n].status in ("restored", "reverted")
                      for n in roll.failed if n in roll.result.hosts)
    why = "interrupted" if roll.cancel.is_set() else "a gate failed"
    if roll.on_failure == "revert" and reverted_ok and restored_ok:
        _finish(roll, ExitCode.ROLLED_BACK, f"{why}; every host serves its previous release")
    else:
        _finish(roll, ExitCode.INCONSISTENT,
                f"{why}; the fleet is mixed or a host could not be restored: look at the hosts")


def restore_host(roll: Roll, job: HostJob) -> str:
    """Put the host back on its previous release; returns its final status."""
    started = time.monotonic()
    was_rolled = job.switched
    try:
        if job.switched:
            _switch_back(job)
        if job.started:
            job.runner.run(commands.remove(job.container))
        elif job.resumed:
            job.runner.run(commands.stop(job.container))
        directory = job.paths.release_dir(job.release.release_id)
        if job.started and not job.release.rollback:
            status = "reverted" if was_rolled else "failed"
            job.runner.put_bytes(_json(manifest(job, status)), f"{directory}/manifest.json")
        job.audit("restore", previous=job.old.release if job.old else None)
    except Exception as error:  # the host may be unreachable: a person must look
        roll.reporter.step(job.host.name, "restore", "restore", "failed",
                           time.monotonic() - started, str(error))
        return "unknown"
    status = "reverted" if was_rolled else "restored"
    roll.reporter.step(job.host.name, "restore", "restore", "ok", time.monotonic() - started,
                       f"back on {job.old.release if job.old else 'no release (first deploy)'}")
    return status


def _switch_back(job: HostJob) -> None:
    admin = ProxyAdmin(job.runner, job.ports.admin)
    if job.old:
        admin.send(proxy_switch_commands(job.old.slot, job.new_slot))
        config = render_proxy_config(job.host, job.release.model, job.ports, job.old.slot)
        job.runner.put_bytes(config.encode(), f"{job.paths.proxy_dir}/haproxy.cfg")
        end = time.monotonic() + job.release.model.rollout.drain_timeout_s
        while time.monotonic() < end:
            sessions = parse_sessions(admin.stat())
            if not sum(v for (_, s), v in sessions.items() if s == job.new_slot):
                break
            time.sleep(0.1)
        admin.send(maint_commands(job.new_slot))
        if job.state.current:
            job.runner.run(commands.point_symlink(f"releases/{job.old.release}",
                                                  job.paths.current))
    else:  # first deploy on this host: there was nothing serving before
        from tfsdeploy.layout import proxy_name

        job.runner.run(commands.remove(proxy_name(job.release.model.name)))
        job.runner.run(commands.remove_tree(job.paths.current))
    job.switched = False


def _json(data: dict[str, Any]) -> bytes:
    import json

    return json.dumps(data, indent=2).encode()


def _finish(roll: Roll, code: ExitCode, message: str) -> None:
    roll.result.exit_code = code
    roll.result.message = message
    for job in roll.jobs:  # every host appears in the result, even those never reached
        if roll.outcome(job).status == "pending":
            roll.outcome(job).status = "skipped"


def make_roll(*, playbook: Playbook, release: Release, jobs: list[HostJob], reporter: Reporter,
              cancel: threading.Event) -> Roll:
    """A Roll with the playbook's policy, or the model's where the playbook says null."""
    rollout = release.model.rollout
    return Roll(playbook=playbook, release=release, jobs=jobs, reporter=reporter, cancel=cancel,
                serial=playbook.serial or rollout.serial,
                max_fail_percentage=(playbook.max_fail_percentage
                                     if playbook.max_fail_percentage is not None
                                     else rollout.max_fail_percentage),
                on_failure=playbook.on_failure or rollout.on_failure,
                result=DeployResult(release.model.name, release.version, release.release_id))


__all__ = ["CancellableClock", "DeployResult", "GateFailed", "HostOutcome", "Interrupted",
           "Reporter", "Roll", "SystemClock", "deploy_phases", "make_roll", "restore_host"]
