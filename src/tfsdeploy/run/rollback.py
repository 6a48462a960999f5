"""`fab rollback`: return hosts to a retained release through the deploy's gates."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from tfsdeploy.core.rollout.gates import Clock
from tfsdeploy.core.target import Target
from tfsdeploy.hosts.ssh import ConnectionFactory, SshConnection
from tfsdeploy.run import engine, plans
from tfsdeploy.run.after import NO_EPILOGUE, Epilogue
from tfsdeploy.run.engine import Reporter, RunResult
from tfsdeploy.run.jobs import ClientFactory
from tfsdeploy.run.plans import RunPlan


def rollback(target: Target, *, to: str | None = None, playbook: str | None = None,
             lock_wait: float = 0.0, reporter: Reporter,
             connect: ConnectionFactory = SshConnection, clock: Clock | None = None,
             client_factory: ClientFactory | None = None,
             before: Callable[[RunPlan], None] | None = None,
             by_guard: bool = False, judged: Mapping[str, str] | None = None,
        epilogue: Epilogue = NO_EPILOGUE) -> RunResult:
    """Choose the release (``--to`` or the newest good on every reachable host), rebuild each
    host's job from its record, run the rollback playbook. ``judged``: the release the guard
    judged on each host; another one live there (read under the lock) refuses the run."""
    plan = plans.rollback_plan(target, to=to, playbook=playbook, lock_wait=lock_wait,
                               by_guard=by_guard, judged=judged)
    return engine.run(plan, reporter=reporter, connect=connect, clock=clock,
                      client_factory=client_factory, before=before, epilogue=epilogue)
