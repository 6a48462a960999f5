"""`fab deploy` and `fab deploy --check [--diff]`: the run plan (``plans.deploy_plan``: render,
validate) handed to the engine, or only planned by it."""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Any

from tfsdeploy.core.canary_policy import CanaryPolicy
from tfsdeploy.core.errors import HostUnreachable
from tfsdeploy.core.gates import Clock
from tfsdeploy.core.target import Target
from tfsdeploy.hosts.ssh import ConnectionFactory, SshConnection
from tfsdeploy.run import engine, plans
from tfsdeploy.run.engine import PlannedStep, Reporter, RunResult
from tfsdeploy.run.jobs import ClientFactory, HostJob, Verb
from tfsdeploy.run.plans import RunPlan


def deploy(target: Target, *, version: int | str | None = None, playbook: str | None = None,
           lock_wait: float = 0.0, reporter: Reporter,
           connect: ConnectionFactory = SshConnection, clock: Clock | None = None,
           client_factory: ClientFactory | None = None,
           before: Callable[[RunPlan], None] | None = None,
           canary: CanaryPolicy | None = None) -> RunResult:
    """Validate everything, take the lock, run the deploy playbook; always release the lock
    (a paused canary keeps it). ``before`` sees the plan once everything is validated, before
    any connection (a pre-hook may stop the run there)."""
    plan = plans.deploy_plan(target, version=version, playbook=playbook, lock_wait=lock_wait,
                             canary=canary)
    return engine.run(plan, reporter=reporter, connect=connect, clock=clock,
                      client_factory=client_factory, before=before)


def check(target: Target, *, version: int | str | None = None, playbook: str | None = None,
          diff: bool = False, connect: ConnectionFactory = SshConnection
          ) -> list[dict[str, Any]]:
    """``--check``: per host, every step a deploy would run and the changes it would make
    (the same operations a deploy drives), and with ``diff`` the file diffs; touches
    nothing."""
    plan = plans.deploy_plan(target, version=version, playbook=playbook)
    _, planned, jobs = engine.check(plan, connect=connect, diff=diff)
    return [host_plan(job, planned[job.name], diff=diff) for job in jobs]


def host_plan(job: HostJob, steps: list[PlannedStep] | HostUnreachable, *,
              diff: bool) -> dict[str, Any]:
    """One host's plan as data (for --json and the table)."""
    if isinstance(steps, HostUnreachable):
        return {"host": job.name, "action": "unreachable", "detail": str(steps), "steps": [],
                "diff": ""}
    changes = sum(len(s.changes) for s in steps if s.phase != "preflight")
    action = ("nothing (unchanged)" if job.unchanged else
              (f"prune: {changes} change(s)" if changes else "nothing to prune")
              if job.run.verb is Verb.PRUNE else
              f"roll {job.old.release} -> v{job.run.version} in {job.new_slot}" if job.old
              else f"first release v{job.run.version} in blue")
    failed = next((s for s in steps if s.error), None)
    if failed:
        action = f"would fail at {failed.step}"
    return {"host": job.name, "action": action,
            "detail": failed.error if failed else next(
                (s.detail for s in steps if s.step == "discover"), ""),
            "steps": [{"phase": s.phase, "step": s.step, "detail": s.detail, "error": s.error,
                       "changes": [{"kind": c.kind, "what": c.describe()} for c in s.changes]}
                      for s in steps],
            "diff": file_diff(job) if diff else ""}


def file_diff(job: HostJob) -> str:
    """Unified diff of every rendered file against the live release's copy (read by the
    engine's check)."""
    live = job.live_files or {}
    chunks: list[str] = []
    for rendered in job.render.files:
        chunks += difflib.unified_diff(live.get(rendered.name, "").splitlines(keepends=True),
                                       rendered.text.splitlines(keepends=True),
                                       fromfile=f"{job.name}:live/{rendered.name}",
                                       tofile=f"{job.name}:new/{rendered.name}")
    return "".join(chunks)
