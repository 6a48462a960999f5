"""`fab rollback`: return hosts to a retained release through the deploy's gates."""

from __future__ import annotations

import threading
from collections.abc import Callable

from tfsdeploy.cli.deploy import _shared, default_playbook
from tfsdeploy.core.gates import Clock, SystemClock
from tfsdeploy.core.target import Target
from tfsdeploy.hosts.ssh import SshConnection
from tfsdeploy.run import engine
from tfsdeploy.run.engine import ConnectionFactory, Reporter, RunPlan, RunResult
from tfsdeploy.run.jobs import ClientFactory
from tfsdeploy.run.plans import rollback_planner


def rollback(target: Target, *, to: str | None = None, playbook: str | None = None,
             lock_wait: float = 0.0, reporter: Reporter,
             connect: ConnectionFactory = SshConnection, clock: Clock | None = None,
             client_factory: ClientFactory | None = None,
             before: Callable[[RunPlan], None] | None = None,
             by_guard: bool = False) -> RunResult:
    """Choose the release (``--to`` or the newest good on every reachable host), rebuild each
    host's job from its record, run the rollback playbook."""
    cancel = threading.Event()
    run_clock = engine.CancellableClock(clock or SystemClock(), cancel)
    conns, factory = _shared(connect)
    plan = RunPlan(verb="rollback", target=target,
                   playbook=default_playbook(
                       "rollback-recreate" if target.model.rollout.strategy == "recreate"
                       else "rollback", playbook),
                   planner=rollback_planner(target, to, clock=run_clock,
                                            client_factory=client_factory, conns=conns,
                                            by_guard=by_guard),
                   images=sorted({h.vars.proxy_image for h in target.hosts}),
                   lock_wait=lock_wait)
    if before is not None:
        before(plan)
    return engine.execute(plan, reporter=reporter, connect=factory, clock=run_clock,
                          cancel=cancel)
