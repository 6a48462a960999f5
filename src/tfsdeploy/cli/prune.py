"""`fab prune`: free the hosts' disk of what no retained release needs, under the model's
lock; `--check` lists what would go."""

from __future__ import annotations

import threading
from typing import Any

from tfsdeploy import engine
from tfsdeploy.cli.deploy import _shared, default_playbook, host_plan
from tfsdeploy.engine import ConnectionFactory, Reporter, RunPlan, RunResult
from tfsdeploy.errors import HostUnreachable
from tfsdeploy.facts import HostFacts
from tfsdeploy.gates import SystemClock
from tfsdeploy.jobs import HostJob, Planner, RunContext
from tfsdeploy.lock import current_user
from tfsdeploy.remote import Connection, SshConnection
from tfsdeploy.render import HostRender
from tfsdeploy.target import Target


def prune_planner(target: Target, conns: dict[str, Connection], clock: Any) -> Planner:
    """Every selected host's job, judged from its own facts (no release is rolled)."""
    def plan(facts: dict[str, HostFacts | HostUnreachable]
             ) -> tuple[RunContext, list[HostJob]]:
        context = RunContext(verb="prune", model=target.model, version=0, release_id="",
                             who=current_user(), clock=clock, golden=[], source_dir="")
        jobs = []
        for host in target.hosts:
            job = HostJob(run=context, host=host, conn=conns[host.name],
                          render=HostRender(host, target.model, 0, None, ()), image="")
            seen = facts[host.name]
            if isinstance(seen, HostUnreachable):
                job.unreachable = seen
            else:
                job.facts = seen
            jobs.append(job)
        return context, jobs

    return plan


def _plan(target: Target, playbook: str | None, conns: dict[str, Connection], clock: Any,
          lock_wait: float) -> RunPlan:
    return RunPlan(verb="prune", target=target, playbook=default_playbook("prune", playbook),
                   planner=prune_planner(target, conns, clock), lock_wait=lock_wait)


def prune(target: Target, *, playbook: str | None = None, lock_wait: float = 0.0,
          reporter: Reporter, connect: ConnectionFactory = SshConnection) -> RunResult:
    """Prune every selected host."""
    cancel = threading.Event()
    clock = engine.CancellableClock(SystemClock(), cancel)
    conns, factory = _shared(connect)
    plan = _plan(target, playbook, conns, clock, lock_wait)
    return engine.execute(plan, reporter=reporter, connect=factory, clock=clock,
                          cancel=cancel)


def prune_check(target: Target, *, playbook: str | None = None,
                connect: ConnectionFactory = SshConnection) -> list[dict[str, Any]]:
    """What a prune would remove on each host; touches nothing."""
    conns, factory = _shared(connect)
    _, plans, jobs = engine.check(_plan(target, playbook, conns, SystemClock(), 0.0),
                                  connect=factory)
    rows = [host_plan(job, plans[job.name], diff=False) for job in jobs]
    for conn in conns.values():
        conn.close()
    return rows
