"""`fab deploy` and `fab deploy --check [--diff]`: the run plan (``plans.deploy_plan``: render,
validate) handed to the engine, or only planned by it."""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Any

from tfsdeploy.core.errors import HostUnreachable
from tfsdeploy.core.inventory.canary_policy import CanaryPolicy
from tfsdeploy.core.render.host_proxy import proxy_instances, render_proxy_config
from tfsdeploy.core.rollout.gates import Clock
from tfsdeploy.core.target import Target
from tfsdeploy.hosts.ssh import ConnectionFactory, SshConnection
from tfsdeploy.run import engine, plans
from tfsdeploy.run.after import NO_EPILOGUE, Epilogue
from tfsdeploy.run.engine import PlannedStep, Reporter, RunResult
from tfsdeploy.run.jobs import ClientFactory, HostJob, Verb
from tfsdeploy.run.operations.preflight import moved_ports
from tfsdeploy.run.plans import RunPlan
from tfsdeploy.run.views import orphans


def deploy(target: Target, *, version: int | str | None = None, playbook: str | None = None,
           lock_wait: float = 0.0, reporter: Reporter,
           connect: ConnectionFactory = SshConnection, clock: Clock | None = None,
           client_factory: ClientFactory | None = None,
           before: Callable[[RunPlan], None] | None = None,
           canary: CanaryPolicy | None = None, max_pulls: int | None = None,
        epilogue: Epilogue = NO_EPILOGUE) -> RunResult:
    """Validate everything, take the lock, run the deploy playbook; always release the lock
    (a paused canary keeps it). ``before`` sees the plan once everything is validated, before
    any connection (a pre-hook may stop the run there)."""
    plan = plans.deploy_plan(target, version=version, playbook=playbook, lock_wait=lock_wait,
                             canary=canary, max_pulls=max_pulls)
    return engine.run(plan, reporter=reporter, connect=connect, clock=clock,
                      client_factory=client_factory, before=before, epilogue=epilogue)


def check(target: Target, *, version: int | str | None = None, playbook: str | None = None,
          diff: bool = False, connect: ConnectionFactory = SshConnection
          ) -> list[dict[str, Any]]:
    """``--check``: per host, every step a deploy would run and the changes it would make
    (the same operations a deploy drives), and with ``diff`` the file diffs; touches
    nothing."""
    plan = plans.deploy_plan(target, version=version, playbook=playbook)
    _, planned, jobs = engine.check(plan, connect=connect, diff=diff)
    rows = [host_plan(job, planned[job.name], diff=diff) for job in jobs]
    left = engine.look(target, lambda session: orphans(target, session=session), connect=connect)
    return rows + [orphan_plan(row) for row in left]


def orphan_plan(status: dict[str, Any]) -> dict[str, Any]:
    """A check's row for a host that still holds the model outside its hosts: the deploy
    leaves it as it is, and says what to run."""
    return {"host": status["host"], "action": status["note"],
            "detail": f"serving {status['current'] or 'nothing'}", "steps": [], "diff": "",
            "orphan": True}


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
    return {"host": job.name, "action": action, "shape": shape_changes(job),
            "detail": failed.error if failed else next(
                (s.detail for s in steps if s.step == "discover"), ""),
            "steps": [{"phase": s.phase, "step": s.step, "detail": s.detail, "error": s.error,
                       "changes": [{"kind": c.kind, "what": c.describe()} for c in s.changes]}
                      for s in steps],
            "diff": file_diff(job) if diff else ""}


def _listed(indices: set[int] | frozenset[int]) -> str:
    return ", ".join(f"i{i}" for i in sorted(indices)) or "none"


def live_instances(job: HostJob) -> frozenset[int]:
    """The instances the host serves now: the proxy's servers, else its running containers."""
    facts = job.facts
    if facts.proxy.running and facts.proxy.answered:
        return proxy_instances(facts.proxy.servers)
    return frozenset(c.instance for c in facts.servers if c.running)


def shape_changes(job: HostJob) -> list[str]:
    """Every change of the host's shape the deploy carries out, and what it does about it:
    instances added or removed, an instance's GPUs, ports (pure, from the facts)."""
    if job.unreachable is not None or job.run.verb is not Verb.DEPLOY:
        return []
    live, planned = live_instances(job), frozenset(i.index for i in job.instances)
    lines = []
    if live and live != planned:
        lines.append(f"instances: {_listed(live)} -> {_listed(planned)}")
    if live and planned - live:
        lines.append(f"{_listed(planned - live)} added: the proxy's configuration gets their "
                     "servers and is reloaded seamlessly before the first instance rolls; "
                     "each new instance takes traffic at its own switch")
    if live - planned:
        lines.append(f"{_listed(live - planned)} removed: serving on through the roll, then "
                     "drained in finalize, the proxy reloaded without them, their containers "
                     "stopped (kept for rollback)")
    previous = job.previous_record
    before = {i.index: tuple(i.gpus) for i in previous.instances} if previous else {}
    for instance in job.instances:
        was = before.get(instance.index)
        if was is not None and was != instance.gpus:
            lines.append(f"i{instance.index} GPUs {','.join(map(str, was)) or 'none'} -> "
                         f"{','.join(map(str, instance.gpus)) or 'none'}: its new release "
                         "starts on them in the free slot")
    moved = moved_ports(job)
    if moved:
        lines.append(f"ports: {moved}; the proxy is reloaded seamlessly with both before the "
                     "first instance rolls, each new container starts on the new ports")
    return lines


def final_proxy_config(job: HostJob) -> str:
    """The proxy's configuration as the deploy leaves it: every planned instance on its new
    slot, no other instance."""
    return render_proxy_config(job.host, job.model, job.ports,
                               {i.index: i.new_slot for i in job.instances}, job.port_move)


def file_diff(job: HostJob) -> str:
    """Unified diff of every rendered file against the live release's copy (read by the
    engine's check), and of the proxy's configuration against the live one."""
    live = job.live_files or {}
    chunks: list[str] = []
    if not job.unchanged:
        was = (job.facts.proxy_config + "\n") if job.facts.proxy_config else ""
        chunks += difflib.unified_diff(
            was.splitlines(keepends=True),
            (final_proxy_config(job).strip() + "\n").splitlines(keepends=True),
            fromfile=f"{job.name}:live/proxy/haproxy.cfg",
            tofile=f"{job.name}:new/proxy/haproxy.cfg")
    for rendered in job.render.files:
        chunks += difflib.unified_diff(live.get(rendered.name, "").splitlines(keepends=True),
                                       rendered.text.splitlines(keepends=True),
                                       fromfile=f"{job.name}:live/{rendered.name}",
                                       tofile=f"{job.name}:new/{rendered.name}")
    return "".join(chunks)
