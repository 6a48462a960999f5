"""`fab promote` and `fab abort`: finish a paused canary, from any machine, at any later
time (cron-safe: both are idempotent and refuse with a clear message when nothing is
paused)."""

from __future__ import annotations

import threading
from collections.abc import Callable

from tfsdeploy.cli.deploy import _shared, default_playbook, deploy_playbook
from tfsdeploy.core.gates import Clock, SystemClock
from tfsdeploy.core.target import Target
from tfsdeploy.hosts.ssh import SshConnection
from tfsdeploy.run import engine
from tfsdeploy.run.engine import ConnectionFactory, Reporter, RunPlan, RunResult
from tfsdeploy.run.jobs import ClientFactory
from tfsdeploy.run.plans import canary_planner


def finish_canary(verb: str, target: Target, *, lock_wait: float = 0.0, reporter: Reporter,
                  connect: ConnectionFactory = SshConnection, clock: Clock | None = None,
                  client_factory: ClientFactory | None = None,
                  before: Callable[[RunPlan], None] | None = None) -> RunResult:
    """``promote``: the paused release rolls on from where it paused (its canary hosts
    switch fully, the other hosts roll in their batches); ``abort``: the canary hosts go back
    to their old release at 100 %. Either takes the lock the paused canary holds."""
    cancel = threading.Event()
    run_clock = engine.CancellableClock(clock or SystemClock(), cancel)
    conns, factory = _shared(connect)
    playbook = (deploy_playbook(target, None) if verb == "promote"
                else default_playbook("abort", None))
    plan = RunPlan(verb=verb, target=target, playbook=playbook,
                   planner=canary_planner(verb, target, clock=run_clock,
                                          client_factory=client_factory, conns=conns),
                   images=sorted({h.vars.image for h in target.hosts}
                                 | {h.vars.proxy_image for h in target.hosts}),
                   lock_wait=lock_wait, take_over=True)
    if before is not None:
        before(plan)
    return engine.execute(plan, reporter=reporter, connect=factory, clock=run_clock,
                          cancel=cancel)
