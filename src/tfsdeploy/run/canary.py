"""`fab promote` and `fab abort`: finish a paused canary, from any machine, at any later
time (cron-safe: both are idempotent and refuse with a clear message when nothing is
paused)."""

from __future__ import annotations

from collections.abc import Callable

from tfsdeploy.core.rollout.gates import Clock
from tfsdeploy.core.target import Target
from tfsdeploy.hosts.ssh import ConnectionFactory, SshConnection
from tfsdeploy.run import engine, plans
from tfsdeploy.run.after import NO_EPILOGUE, Epilogue
from tfsdeploy.run.engine import Reporter, RunResult
from tfsdeploy.run.jobs import ClientFactory, Verb
from tfsdeploy.run.plans import RunPlan


def finish_canary(verb: Verb, target: Target, *, lock_wait: float = 0.0, reporter: Reporter,
                  connect: ConnectionFactory = SshConnection, clock: Clock | None = None,
                  client_factory: ClientFactory | None = None,
                  before: Callable[[RunPlan], None] | None = None,
                  judged: str | None = None,
        epilogue: Epilogue = NO_EPILOGUE) -> RunResult:
    """``promote``: the paused release rolls on from where it paused (its canary hosts
    switch fully, the other hosts roll in their batches); ``abort``: the canary hosts go back
    to their old release at 100 %. Either takes the lock the paused canary holds (an
    interrupted canary, a killed run's split weights, is finished or undone the same way).
    ``judged``: the guard's abort of the canary release it judged (refused, exit 3, when
    another canary is under way by the time it holds the lock)."""
    plan = plans.canary_plan(Verb(verb), target, lock_wait=lock_wait, judged=judged)
    return engine.run(plan, reporter=reporter, connect=connect, clock=clock,
                      client_factory=client_factory, before=before, epilogue=epilogue)
