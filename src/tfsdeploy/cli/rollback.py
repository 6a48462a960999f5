"""`fab rollback`: return hosts to a retained release through the deploy's gates."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tfsdeploy import lock
from tfsdeploy.actions import Release
from tfsdeploy.cli.deploy import RunnerFactory, execute
from tfsdeploy.errors import ConfigError, Problem
from tfsdeploy.gates import Clock, SystemClock
from tfsdeploy.golden import load_golden
from tfsdeploy.gpu import plan_gpu
from tfsdeploy.inventory import Inventory, ResolvedHost, load_inventory
from tfsdeploy.layout import host_paths
from tfsdeploy.playbook import load_playbook, project_dir
from tfsdeploy.remote import HostUnreachable, Runner, SshRunner
from tfsdeploy.render import FILE_NAMES, HostRender, RenderedFile, placements
from tfsdeploy.rollout import CancellableClock, DeployResult, HostOutcome, Reporter
from tfsdeploy.state import common_good_release, read_releases


@dataclass(frozen=True)
class RollbackRequest:
    """What `fab rollback` was asked for."""

    model: str
    inventory: str | None = None
    hosts: str | None = None
    limit: str | None = None
    to: str | None = None
    playbook: str | None = None
    lock_wait: float = 0.0


def _histories(hosts: tuple[ResolvedHost, ...], runners: dict[str, Runner], model: Any
               ) -> tuple[dict[str, list[dict[str, Any]]], dict[str, str]]:
    histories, unreachable = {}, {}
    for host in hosts:
        try:
            histories[host.name] = read_releases(runners[host.name], host_paths(host, model))
        except HostUnreachable as error:
            unreachable[host.name] = str(error)
    return histories, unreachable


def _current(runner: Runner, host: ResolvedHost, model: Any) -> str | None:
    found = runner.run(["readlink", host_paths(host, model).current])
    return found.stdout.strip().rsplit("/", 1)[-1] if found.ok else None


def choose_target(request: RollbackRequest, histories: dict[str, list[dict[str, Any]]],
                  current: dict[str, str | None]) -> str:
    """``--to``, checked on every host, or the newest release good on all of them."""
    if request.to:
        missing = [h for h, releases in histories.items()
                   if request.to not in {m.get("id") for m in releases}]
        if missing:
            raise ConfigError(Problem(
                f"release {request.to!r} is not retained on {', '.join(missing)}",
                fix="pick a release listed by `fab history --model "
                    f"{request.model}` on every host, or narrow --hosts"))
        return request.to
    target = common_good_release(histories, current)
    if target is None:
        raise ConfigError(Problem(
            "no retained release served well on every selected host (besides the current one)",
            fix=f"see `fab history --model {request.model}` and pass --to RELEASE, or narrow "
                "--hosts"))
    return target


def _render_from_host(runner: Runner, host: ResolvedHost, inventory: Inventory, model: Any,
                      record: dict[str, Any]) -> HostRender:
    directory = host_paths(host, model).release_dir(record["id"])
    files = []
    for name in FILE_NAMES:
        found = runner.run(["cat", f"{directory}/{name}"])
        if not found.ok:
            raise ConfigError(Problem(f"release {record['id']} on {host.name} lacks {name}",
                                      fix="pick another release (`fab history`)",
                                      host=host.name, file=f"{directory}/{name}"))
        files.append(RenderedFile(name, found.stdout))
    placed = placements(inventory)
    co_located = [inventory.models[m] for m, on in placed.items() if host.name in on]
    return HostRender(host=host, model=model, version=int(record["version"]),
                      gpu=plan_gpu(host, model, co_located), files=tuple(files))


def rollback(request: RollbackRequest, *, reporter: Reporter,
             runner_factory: RunnerFactory = SshRunner, clock: Clock | None = None,
             client_factory: Callable[[str, int, str], Any] | None = None) -> DeployResult:
    """Pick the target, rebuild each host's release from its record, run rollback.yml."""
    inventory = load_inventory(request.inventory)
    model = inventory.model(request.model)
    hosts = inventory.select(request.hosts, limit=request.limit, model=model)
    runners = {h.name: runner_factory(h) for h in hosts}
    histories, unreachable = _histories(hosts, runners, model)
    current = {h: _current(runners[h], inventory.host(h), model) for h in histories}
    target = choose_target(request, histories, current)
    records = {h: next(m for m in releases if m.get("id") == target)
               for h, releases in histories.items()}
    first = next(iter(records.values()))
    cancel = threading.Event()
    version = int(first["version"])
    release = Release(model=model, version=version, release_id=target, image=first["image"],
                      source_dir=str(Path(model.source) / str(version)),
                      golden=load_golden(model.golden, version) if model.golden else [],
                      who=lock.current_user(),
                      clock=CancellableClock(clock or SystemClock(), cancel),
                      client_factory=client_factory, rollback=True)
    reachable = [inventory.host(h) for h in histories]
    renders = [_render_from_host(runners[h.name], h, inventory, model, records[h.name])
               for h in reachable]
    playbook = load_playbook(request.playbook or project_dir() / "playbooks" / "rollback.yml")
    result = execute(inventory=inventory, playbook=playbook, release=release, renders=renders,
                     runners={h.name: runners[h.name] for h in reachable}, reporter=reporter,
                     cancel=cancel, lock_wait=request.lock_wait, clock=clock,
                     runner_factory=runner_factory, verb="rollback")
    for name, error in unreachable.items():
        result.hosts[name] = HostOutcome(name, "unreachable", error=error)
    if unreachable and int(result.exit_code) < 3:
        from tfsdeploy.errors import ExitCode

        result.exit_code = ExitCode.INCONSISTENT
        result.message = (f"rolled back the reachable hosts; unreachable: "
                          f"{', '.join(sorted(unreachable))} (still on their release)")
    return result
