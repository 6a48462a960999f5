"""`fab deploy` and `fab deploy --check [--diff]`: render, validate, then hand the run to the
engine (or only plan it)."""

from __future__ import annotations

import difflib
import threading
from collections.abc import Callable
from typing import Any

from tfsdeploy.core.canary_policy import CanaryPolicy
from tfsdeploy.core.errors import HostUnreachable
from tfsdeploy.core.gates import Clock, SystemClock
from tfsdeploy.core.target import Target
from tfsdeploy.hosts.ssh import Connection, SshConnection
from tfsdeploy.run import engine
from tfsdeploy.run.engine import ConnectionFactory, PlannedStep, Reporter, RunPlan, RunResult
from tfsdeploy.run.jobs import ClientFactory, HostJob
from tfsdeploy.run.plans import deploy_context, deploy_planner, render_release
from tfsdeploy.run.playbook import Playbook, load_playbook, project_dir


def default_playbook(name: str, given: str | None) -> Playbook:
    """``--playbook``, or the project's ``playbooks/<name>.yml``."""
    return load_playbook(given or project_dir() / "playbooks" / f"{name}.yml")


def deploy_playbook(target: Target, given: str | None) -> Playbook:
    """``--playbook``, or the project's deploy playbook for the model's strategy (dual-slot:
    deploy.yml; recreate: deploy-recreate.yml)."""
    recreate = target.model.rollout.strategy == "recreate"
    return default_playbook("deploy-recreate" if recreate else "deploy", given)


def deploy_plan(target: Target, *, version: int | str | None, playbook: Playbook,
                clock: Clock, conns: dict[str, Connection],
                client_factory: ClientFactory | None, lock_wait: float = 0.0,
                canary: CanaryPolicy | None = None) -> RunPlan:
    """Everything a deploy needs before it touches a host: renders, context, planner; the
    canary policy is ``canary`` (the command line's) or the model's."""
    renders = render_release(target, version)
    context = deploy_context(target, renders[0].version, clock=clock,
                             client_factory=client_factory)
    context.canary = canary or target.model.rollout.canary
    images = sorted({r.host.vars.image for r in renders}
                    | {r.host.vars.proxy_image for r in renders})
    return RunPlan(verb="deploy", target=target, playbook=playbook,
                   planner=deploy_planner(target, renders, context, conns), images=images,
                   lock_wait=lock_wait, version=context.version, release=context.release_id)


def _shared(connect: ConnectionFactory) -> tuple[dict[str, Connection], ConnectionFactory]:
    """One connection per host, shared by the planner and the engine."""
    conns: dict[str, Connection] = {}

    def factory(host: Any) -> Connection:
        if host.name not in conns:
            conns[host.name] = connect(host)
        return conns[host.name]

    return conns, factory


def deploy(target: Target, *, version: int | str | None = None, playbook: str | None = None,
           lock_wait: float = 0.0, reporter: Reporter,
           connect: ConnectionFactory = SshConnection, clock: Clock | None = None,
           client_factory: ClientFactory | None = None,
           before: Callable[[RunPlan], None] | None = None,
           canary: CanaryPolicy | None = None) -> RunResult:
    """Validate everything, take the lock, run the deploy playbook; always release the lock
    (a paused canary keeps it). ``before`` sees the plan once everything is validated, before
    any connection (a pre-hook may stop the run there)."""
    cancel = threading.Event()
    run_clock = engine.CancellableClock(clock or SystemClock(), cancel)
    conns, factory = _shared(connect)
    plan = deploy_plan(target, version=version, playbook=deploy_playbook(target, playbook),
                       clock=run_clock, conns=conns, client_factory=client_factory,
                       lock_wait=lock_wait, canary=canary)
    if before is not None:
        before(plan)
    return engine.execute(plan, reporter=reporter, connect=factory, clock=run_clock,
                          cancel=cancel)


def check(target: Target, *, version: int | str | None = None, playbook: str | None = None,
          diff: bool = False, connect: ConnectionFactory = SshConnection
          ) -> list[dict[str, Any]]:
    """``--check``: per host, every step a deploy would run and the changes it would make
    (the same operations a deploy drives), and with ``diff`` the file diffs; touches
    nothing."""
    conns, factory = _shared(connect)
    plan = deploy_plan(target, version=version, playbook=deploy_playbook(target, playbook),
                       clock=SystemClock(), conns=conns, client_factory=None)
    _, plans, jobs = engine.check(plan, connect=factory)
    rows = []
    for job in jobs:
        steps = plans[job.name]
        rows.append(host_plan(job, steps, diff=diff and not isinstance(steps, HostUnreachable)))
    for conn in conns.values():
        conn.close()
    return rows


def host_plan(job: HostJob, steps: list[PlannedStep] | HostUnreachable, *,
              diff: bool) -> dict[str, Any]:
    """One host's plan as data (for --json and the table)."""
    if isinstance(steps, HostUnreachable):
        return {"host": job.name, "action": "unreachable", "detail": str(steps), "steps": [],
                "diff": ""}
    changes = sum(len(s.changes) for s in steps if s.phase != "preflight")
    action = ("nothing (unchanged)" if job.unchanged else
              (f"prune: {changes} change(s)" if changes else "nothing to prune")
              if job.run.verb == "prune" else
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
    """Unified diff of every rendered file against the live release's copy."""
    from tfsdeploy.run.plans import read_release_files

    live_id = job.old.release if job.old else None
    live: dict[str, str] = {}
    if live_id:
        try:
            live = read_release_files(job.conn, job.paths, live_id)
        except Exception:  # a live release without its files: everything is new
            live = {}
    chunks: list[str] = []
    for rendered in job.render.files:
        chunks += difflib.unified_diff(live.get(rendered.name, "").splitlines(keepends=True),
                                       rendered.text.splitlines(keepends=True),
                                       fromfile=f"{job.name}:live/{rendered.name}",
                                       tofile=f"{job.name}:new/{rendered.name}")
    return "".join(chunks)


def error_cell(error: str, diagnosis: dict[str, str] | None) -> str:
    """The summary's error: its first line, then the known failure's cause and fix."""
    first = (error.splitlines() or [""])[0][:80]
    if not diagnosis:
        return first
    return f"{first}\ncause: {diagnosis['cause']}\nfix: {diagnosis['fix']}"


def summary_rows(result: RunResult) -> list[tuple[str, ...]]:
    """Per host: result, time in each phase and gate, and the error (with its cause and fix
    when it is a known failure)."""
    rows: list[tuple[str, ...]] = []
    for name, outcome in result.hosts.items():
        by_phase: dict[str, float] = {}
        for step in outcome.steps:
            by_phase[step["phase"]] = by_phase.get(step["phase"], 0.0) + step["seconds"]
        gates = {s["step"]: s["seconds"] for s in outcome.steps if s["step"].startswith("gate_")}
        rows.append((name, outcome.status,
                     " ".join(f"{p} {s:.1f}s" for p, s in by_phase.items()),
                     " ".join(f"{g[5:]} {s:.1f}s" for g, s in gates.items()),
                     error_cell(outcome.error, outcome.diagnosis)))
    return rows


__all__ = ["check", "deploy", "deploy_plan", "summary_rows"]
