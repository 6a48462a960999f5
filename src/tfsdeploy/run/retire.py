"""`fab retire`: take a model off hosts (the selected ones; by default every inventory host
that holds it), under its lock; `--check` lists what would go. A host that holds nothing of
the model is reported ``absent``."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from tfsdeploy.core.target import Target
from tfsdeploy.hosts.ssh import ConnectionFactory, SshConnection
from tfsdeploy.run import engine, plans
from tfsdeploy.run.after import NO_EPILOGUE, Epilogue
from tfsdeploy.run.deploy import host_plan
from tfsdeploy.run.engine import HostOutcome, Reporter, RunResult

NOTHING_HERE = "nothing of the model here"


def retire(target: Target, *, playbook: str | None = None, lock_wait: float = 0.0,
           reporter: Reporter, connect: ConnectionFactory = SshConnection,
        epilogue: Epilogue = NO_EPILOGUE) -> RunResult:
    """Retire the model from every selected host."""
    plan = plans.retire_plan(target, playbook=playbook, lock_wait=lock_wait)
    return engine.run(plan, reporter=reporter, connect=connect, epilogue=replace(
        epilogue, summarize=lambda result: summarize(result, target)))


def retire_check(target: Target, *, playbook: str | None = None,
                 connect: ConnectionFactory = SshConnection) -> list[dict[str, Any]]:
    """What a retirement would remove on each host; touches nothing."""
    _, planned, jobs = engine.check(plans.retire_plan(target, playbook=playbook),
                                    connect=connect)
    rows = [host_plan(job, planned[job.name], diff=False) for job in jobs]
    for row in rows:
        changes = sum(len(s["changes"]) for s in row["steps"])
        if not row["action"].startswith(("would fail", "unreachable")):
            row["action"] = f"retire: {changes} change(s)" if changes else "nothing to retire"
    return rows


def _absent(outcome: HostOutcome) -> bool:
    return all(NOTHING_HERE in str(s.get("detail", "")) for s in outcome.steps
               if s.get("phase") == "retire")


def summarize(result: RunResult, target: Target) -> RunResult:
    """Each host ``retired`` (or ``absent``: it held nothing of the model) instead of
    ``rolled``, and a message that says where the model was taken off."""
    for outcome in result.hosts.values():
        if outcome.status == "rolled":
            outcome.status = "absent" if _absent(outcome) else "retired"
    retired = sorted(n for n, o in result.hosts.items() if o.status == "retired")
    summary = (f"{target.model.name} retired from {', '.join(retired)}" if retired
               else f"no selected host held {target.model.name}")
    result.message = summary if result.exit_code == 0 else f"{result.message}; {summary}"
    return result
