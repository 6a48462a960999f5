"""The commands behind the `fab` tasks. ``main`` types a task's options (``options``), runs the
command and maps every way it ends to its documented exit code (``exits``); a command loads
its target, asks for its run (``tfsdeploy.run``) or its look at the hosts, and prints what
came of it (``output``). ``tasks.py`` holds only the tasks' signatures and help.

The pure core is imported here; each command's own modules (the run layer, the hosts, the
load and acceptance tools) are imported when that command runs, so that `fab render` and
`fab hosts` start without SSH, Docker, gRPC or HTTP.
"""

from __future__ import annotations

import dataclasses
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tfsdeploy.cli import output
from tfsdeploy.cli.exits import debugging, run_command, unattended_outputs
from tfsdeploy.cli.options import is_safe, options, safe_model, writable
from tfsdeploy.cli.render import arithmetic_lines, write_renders
from tfsdeploy.cli.render import summary_table as render_table
from tfsdeploy.cli.terminal import guarded_output, hangup_survived
from tfsdeploy.cli.unattended import INVALID_MODEL, update_textfile, write_json_file
from tfsdeploy.cli.verbs import (
    AbortArgs,
    AcceptArgs,
    BenchArgs,
    CanaryArgs,
    DeployArgs,
    DiagnoseArgs,
    ExecArgs,
    GatewayArgs,
    GuardArgs,
    HistoryArgs,
    HostsArgs,
    LockArgs,
    LogsArgs,
    ObserveArgs,
    PlanCapacityArgs,
    PromoteArgs,
    PruneArgs,
    PublishArgs,
    RenderArgs,
    RetireArgs,
    RollbackArgs,
    Selected,
    StageArgs,
    StatusArgs,
    TuneArgs,
    Unattended,
)
from tfsdeploy.core.errors import ConfigError, ExitCode, Problem, TfsDeployError
from tfsdeploy.core.inventory.canary_policy import CanaryPolicy, parse_weights
from tfsdeploy.core.inventory.load import load_inventory
from tfsdeploy.core.target import Target, load_target, render_release
from tfsdeploy.run.after import (
    AFTER_DEADLINE_S,
    AfterPass,
    Epilogue,
    NotePass,
    late_signals,
    run_after_passes,
)

ROOT = Path(__file__).resolve().parents[3]  # the checkout: playbooks, tasks, `fab` itself


def target(args: Selected | TuneArgs | LockArgs | AcceptArgs) -> Target:
    """The command's target: inventory, model (validated), selected hosts."""
    return load_target(safe_model(args.model), inventory=args.inventory,
                       hosts=getattr(args, "hosts", None), limit=getattr(args, "limit", None))


class Record:
    """A run's record, written by the engine before any after-pass: the JSON result and the
    textfile, from the run's own result (``extra``: what the command adds to the JSON)."""

    def __init__(self, command: str, args: Unattended, events: list[dict[str, Any]],
                 extra: Callable[[Any], dict[str, Any]] | None = None) -> None:
        self.command, self.events, self.extra = command, events, extra
        self.json_file, self.metrics_file = args.json_file, args.metrics_file
        self.data: dict[str, Any] = {}

    def __call__(self, result: Any) -> None:
        self.data = {"command": self.command, **result.as_dict(),
                     **(self.extra(result) if self.extra else {}), "events": self.events}
        record_run(self.json_file, self.metrics_file, self.data, model=result.model,
                   command=self.command, seconds=result.seconds, release=result.release_id,
                   version=result.version)

    def add(self, more: dict[str, Any], result: Any) -> None:
        """What an after-pass adds to the JSON result (the hooks' and notifications'
        outcomes); the exit code and the textfile stay as recorded."""
        self.data |= more
        record_run(self.json_file, None, self.data, model=result.model, command=self.command,
                   seconds=result.seconds, release="", version=None)


def shown_result(command: str, result: Any, record: Record, *, json: bool,
                 rows: list[tuple[str, ...]] | None = None) -> int:
    """Print a recorded run's summary (or its JSON); returns its exit code. Nothing here (a
    reader gone, the terminal closed, a late signal) changes the exit code or what was
    recorded: a failure is one line on stderr."""
    code = int(result.exit_code)
    with late_signals(output.note_sink(json)):
        try:
            if json:
                output.print_json(record.data)
            else:
                output.print_run(command, result, rows)
        except Exception as error:
            after_the_run(error, code)
    return code


def record_run(json_file: str | None, metrics_file: str | None, data: dict[str, Any], *,
               model: str, command: str, seconds: float, release: str, version: int | None
               ) -> None:
    """Write the JSON result and update the textfile; a file that cannot be written is
    reported on stderr and changes nothing else."""
    try:
        if json_file:
            write_json_file(json_file, data)
    except (OSError, ValueError) as error:
        print(f"tfsdeploy: the JSON result could not be written to {json_file}: {error}",
              file=sys.stderr)
    try:
        if metrics_file:
            update_textfile(metrics_file, model=model, command=command,
                            exit_code=int(data["exit_code"]), seconds=seconds,
                            release=release, version=version)
    except (OSError, ValueError) as error:
        print(f"tfsdeploy: the textfile could not be written to {metrics_file}: {error}",
              file=sys.stderr)


def after_the_run(error: BaseException, code: int) -> None:
    """One line for a failure after the run's result was recorded (the traceback with
    --debug); the exit code stays the run's."""
    print(f"tfsdeploy: after the run (exit code {code}, already recorded): "
          f"{type(error).__name__}: {error}", file=sys.stderr)
    if debugging():
        traceback.print_exc()


# -- the commands -----------------------------------------------------------------------

def cmd_render(args: RenderArgs) -> int:
    """`fab render`."""
    renders = render_release(target(args), args.version)
    written = write_renders(renders, Path(args.out))
    headers, rows = render_table(renders)
    output.print_table(f"{args.model}: {len(renders)} host(s) rendered and validated into "
                       f"{args.out}/", headers, rows)
    for line in arithmetic_lines(renders):
        print(line)
    print(f"{len(written)} files written; the TFServing files parsed with TFServing's "
          "definitions; proxy/haproxy.cfg as a first deploy writes it (slot blue).")
    return 0


def cmd_observe(args: ObserveArgs) -> int:
    """`fab observe`."""
    from tfsdeploy.cli.observe import observe

    inventory = load_inventory(args.inventory)
    model = safe_model(args.model) if args.model else None
    written, published = observe(inventory, model, Path(args.out),
                                 targets=bool(args.targets))
    for path in written:
        print(path)
    for place in published:
        print(f"targets: {place}")
    print(f"{len(written)} files written; check them with `promtool check config "
          f"{args.out}/prometheus/prometheus.yml`")
    return 0


def cmd_hosts(args: HostsArgs) -> int:
    """`fab hosts`."""
    inventory = load_inventory(args.inventory)
    chosen = inventory.select(args.hosts, limit=args.limit)
    output.print_table(f"{inventory.path}: {len(chosen)} host(s)",
                       ("host", "address", "groups", "GPUs", "models"),
                       output.host_rows(inventory, chosen))
    return 0


def cmd_deploy(args: DeployArgs) -> int:
    """`fab deploy` (and `--check [--diff]`)."""
    from tfsdeploy.run import deploy

    if args.check or args.diff:
        return output.print_check("deploy", args.model, args.json, deploy.check(
            target(args), version=args.version, playbook=args.playbook,
            diff=args.diff))
    from tfsdeploy.run.gateway import drift_notes

    return _surrounded(
        "deploy", args, lambda chosen, shown, before, epilogue: deploy.deploy(
            chosen, version=args.version, playbook=args.playbook,
            lock_wait=args.lock_wait, reporter=shown, before=before,
            canary=_canary_option(chosen, args), max_pulls=args.max_pulls,
            epilogue=epilogue),
        notes=lambda chosen: [lambda session: drift_notes(chosen.inventory, chosen.model.name,
                                                          session=session)])


def gateway_notes(chosen: Target) -> None:
    """A line on stderr per gateway host routing the model whose configuration no longer
    matches the inventory (nothing when no gateway routes it); never changes the exit code."""
    from tfsdeploy.run.views import gateway_drift

    with hangup_survived():
        try:
            for note in gateway_drift(chosen):
                print(note, file=sys.stderr, flush=True)
        except (Exception, KeyboardInterrupt) as error:
            print(f"gateway: not compared ({type(error).__name__}: {error})", file=sys.stderr)


def _canary_option(chosen: Target, args: DeployArgs) -> CanaryPolicy | None:
    """The command line's canary policy (over the model's), or None to keep the model's."""
    if not (args.canary_weights or args.pause or args.step_s):
        return None
    base = chosen.model.rollout.canary or CanaryPolicy()
    changes: dict[str, Any] = {}
    if args.canary_weights:
        changes["weights"] = parse_weights(str(args.canary_weights))
    if args.step_s:
        changes["step_s"] = float(args.step_s)
    if args.pause:
        changes["pause"] = True
    return dataclasses.replace(base, **changes)


def _surrounded(command: str, args: DeployArgs | RollbackArgs | CanaryArgs,
                run: Callable[..., Any],
                notes: Callable[[Target], list[NotePass]] = lambda chosen: []) -> int:
    """A command's run with its hooks and notifications around it (cli/around.py): the
    pre-hook once the release is known and everything is validated (it may stop the run
    before any host is changed), events during the run; the engine then records the result
    (``Record``) before its after-passes: the model's targets, the post-hooks and the
    delivery report. ``notes``: reads of the fleet whose lines join the result."""
    from tfsdeploy.cli import around
    from tfsdeploy.run.targets import Retargeter, retargets

    chosen = target(args)
    started = time.monotonic()
    shown = around.EventReporter(output.reporter(args.json, args.log_file))
    before = around.surround(shown, command, chosen, hooks_dir=args.hooks,
                             notify_urls=args.notify or ())
    retarget = Retargeter(chosen) if retargets(chosen) else None
    record = Record(command, args, shown.events)

    def hooks_after(result: Any, _session: Any) -> None:
        if shown.around is not None:
            record.add(around.after(shown.around, output.note_sink(args.json),
                                    result=result, exit_code=int(result.exit_code),
                                    seconds=result.seconds, message=result.message,
                                    data=record.data, json_file=args.json_file), result)

    epilogue = Epilogue(
        notes=notes(chosen), record=record,
        after=[*([retarget.after_pass()] if retarget else []),
               AfterPass("post-hooks and notifications", hooks_after)],
        listeners=[retarget.on_step] if retarget else [])
    try:
        result = run(chosen, shown, before, epilogue)
    except TfsDeployError as error:  # the lock held, no host reachable, ...: hooks still run
        if retarget is not None:
            retarget.stop()
        if shown.around is not None:
            with hangup_survived():
                try:  # nothing in them changes the run's exit code (run_command records it)
                    around.ended_early(shown.around, output.note_sink(args.json), error,
                                       command=command, seconds=time.monotonic() - started)
                except (Exception, KeyboardInterrupt) as late:
                    after_the_run(late, int(error.exit_code))
        raise
    except BaseException:
        if retarget is not None:
            retarget.stop()
        if shown.around is not None:
            around.close(shown.around)
        raise
    return shown_result(command, result, record, json=args.json)


def cmd_promote(args: PromoteArgs) -> int:
    """`fab promote`."""
    from tfsdeploy.run import canary
    from tfsdeploy.run.jobs import Verb

    return _surrounded("promote", args, lambda chosen, shown, before, epilogue: (
        canary.finish_canary(Verb.PROMOTE, chosen, lock_wait=args.lock_wait, reporter=shown,
                             before=before, epilogue=epilogue)))


def cmd_abort(args: AbortArgs) -> int:
    """`fab abort`."""
    from tfsdeploy.run import canary
    from tfsdeploy.run.jobs import Verb

    return _surrounded("abort", args, lambda chosen, shown, before, epilogue: (
        canary.finish_canary(Verb.ABORT, chosen, lock_wait=args.lock_wait, reporter=shown,
                             before=before, epilogue=epilogue)))


def cmd_rollback(args: RollbackArgs) -> int:
    """`fab rollback`."""
    from tfsdeploy.run import rollback

    return _surrounded("rollback", args, lambda chosen, shown, before, epilogue: (
        rollback.rollback(chosen, to=args.to, playbook=args.playbook,
                          lock_wait=args.lock_wait, reporter=shown, before=before,
                          epilogue=epilogue)))


def cmd_status(args: StatusArgs) -> int:
    """`fab status`."""
    from tfsdeploy.run.views import status

    chosen = target(args)
    rows = status(chosen, with_orphans=not args.hosts and not args.limit)
    if args.json:
        output.print_json(rows)
    else:
        output.print_table(f"{args.model}: status", ("host", "release", "version",
                                                    "traffic", "slots", "drift", "lock",
                                                    "GPU MiB planned/held"),
                           [output.status_row(r) for r in rows])
        for row in rows:  # the table cuts the error short: its reason and fix in full
            if not row["reachable"]:
                print(f"{row['host']}: UNREACHABLE ({row.get('error', '')})")
            for note in row.get("instance_drift") or []:
                print(f"{row['host']}: {note}")
            for found in row.get("scratch") or []:
                print(f"{row['host']}: {found['note']}")
    gateway_notes(chosen)
    return 0 if all(r["reachable"] and not r.get("down") for r in rows) else 3


def cmd_history(args: HistoryArgs) -> int:
    """`fab history`."""
    from tfsdeploy.run.views import history

    rows = history(target(args))
    if args.json:
        output.print_json(rows)
    else:
        output.print_history(args.model, rows)
    return 0 if all(r["reachable"] for r in rows) else 3


def cmd_guard(args: GuardArgs) -> int:
    """`fab guard`: when it acts, the rollback (or the abort of a paused canary) runs with the
    hooks and events `fab rollback` (`fab abort`) has, after a ``guard_triggered`` event. Its
    end is recorded first (the JSON result, the textfile), then its after-passes run."""
    from tfsdeploy.cli import around
    from tfsdeploy.core.observe.guard import GuardPolicy
    from tfsdeploy.run.guard import watch

    started = time.monotonic()
    policy = GuardPolicy(max_error_rate=args.max_error_rate, slo_p99_ms=args.slo_p99_ms,
                         for_s=args.for_s, interval_s=args.interval_s,
                         duration_s=args.duration_s, min_requests=args.min_requests,
                         count_client_errors=bool(args.count_client_errors),
                         lock_wait=args.lock_wait)
    chosen = target(args)
    shown = around.EventReporter(output.reporter(args.json, args.log_file))
    hooked = shown.around = around.prepare("guard", chosen, hooks_dir=args.hooks,
                                           notify_urls=args.notify or ())
    act, abort = around.guard_actions(shown, chosen, lock_wait=policy.lock_wait)
    try:
        code, message = watch(chosen, policy, reporter=shown, act=act, abort=abort)
    except BaseException:
        around.close(hooked)
        raise
    seconds = time.monotonic() - started
    data = {"command": "guard", "model": chosen.model.name, "exit_code": int(code),
            "result": ExitCode(code).name.lower(), "message": message,
            "seconds": round(seconds, 3), "action": hooked.verb or None,
            "run": hooked.outcome.as_dict() if hooked.outcome is not None else None}
    passes = [AfterPass("the guard's runbook", lambda _r, _s: _guard_after(
        hooked, shown, code=int(code), message=message, seconds=seconds, data=data,
        json_file=args.json_file))]
    if hooked.verb:
        from tfsdeploy.run.targets import after_run

        passes.insert(0, AfterPass("the model's Prometheus targets",
                                   lambda _r, _s: after_run(chosen)))
    with late_signals(shown) as late:
        # the guard's end is recorded first; then, when it acted, the model's targets (what
        # serves now) and its runbook's post-hooks, under the after-passes' deadline
        record_run(args.json_file, args.metrics_file, data, model=args.model,
                   command="guard", seconds=seconds, release="", version=None)
        run_after_passes(passes, None, None, deadline_s=AFTER_DEADLINE_S, late=late,
                         reporter=shown)
        if args.json:
            output.print_json(data)
        else:
            print(message)
    return int(code)


def _guard_after(hooked: Any, shown: Any, *, code: int, message: str, seconds: float,
                 data: dict[str, Any], json_file: str | None) -> None:
    """The guard's runbook after it watched: when it acted, the hooks and events of its
    rollback (or abort), their outcomes added to the JSON result (its exit code and the
    textfile stay as recorded); else only its notifier closed."""
    from tfsdeploy.cli import around

    if not hooked.verb:  # it never acted
        around.close(hooked)
        return
    data |= around.after(hooked, shown, result=hooked.outcome, exit_code=code,
                         seconds=seconds, message=message, data=data, json_file=None)
    record_run(json_file, None, data, model=data["model"], command="guard", seconds=seconds,
               release="", version=None)


def cmd_bench(args: BenchArgs) -> int:
    """`fab bench`."""
    from tfsdeploy.run.bench import Load, bench

    return bench(target(args), Load(
        version=args.version, duration=args.duration, concurrency=args.concurrency,
        slo_p99=args.slo_p99, max_error_rate=args.max_error_rate, sweep=args.sweep,
        rps=args.rps, procs=args.procs, min_qps=args.min_qps, report=args.report,
        sweep_plot=args.sweep_plot))


def cmd_tune(args: TuneArgs) -> int:
    """`fab tune`."""
    from tfsdeploy.cli.tune import run_tune

    return run_tune(target(args), args)


def cmd_diagnose(args: DiagnoseArgs) -> int:
    """`fab diagnose`."""
    from tfsdeploy.cli.tune import print_diagnosis
    from tfsdeploy.core.timetext import duration_seconds
    from tfsdeploy.run.diagnose import diagnose_hosts

    window = duration_seconds(args.for_ or "60s")
    print(f"reading each instance's metrics for {window:g} s", file=sys.stderr, flush=True)
    rows = diagnose_hosts(target(args), window)
    if args.json:
        output.print_json(rows)
    else:
        print_diagnosis(rows)
    return 0 if all(r.get("reachable") for r in rows) else 3


def cmd_plan_capacity(args: PlanCapacityArgs) -> int:
    """`fab plan-capacity`."""
    from tfsdeploy.loadtest.cli import plan_capacity

    given = [k for k in ("sweep_report", "tune_report", "per_instance_qps")
             if getattr(args, k) is not None]
    if len(given) != 1:
        raise ConfigError(Problem(
            "no per-instance figure" if not given else
            f"{' and '.join('--' + k.replace('_', '-') for k in given)} both give the "
            "per-instance figure", fix="pass one of --sweep-report FILE, --tune-report FILE "
                                       "or --per-instance-qps N"))
    source: str | float = getattr(args, given[0])
    code, text = plan_capacity(args.target_qps, source, load_factor=args.load_factor,
                               availability_factor=args.availability_factor,
                               instances_per_host=args.instances_per_host,
                               as_json=args.json, tune=given[0] == "tune_report")
    print(text)
    return code


def cmd_lock(args: LockArgs) -> int:
    """`fab lock`."""
    from tfsdeploy.run.views import lock_state

    lines, verdict = lock_state(target(args), breaking=args.break_)
    print("\n".join([*lines, verdict]))
    return 0


def cmd_logs(args: LogsArgs) -> int:
    """`fab logs`."""
    from tfsdeploy.run.views import logs

    return logs(target(args), lines=int(args.lines), since=args.since,
                follow=args.follow,
                out=lambda line: print(line, flush=True))  # followed lines show as they come


def cmd_exec(args: ExecArgs) -> int:
    """`fab exec -- CMD ...`."""
    from tfsdeploy.run.views import exec_in

    return exec_in(target(args), list(args.argv), force=args.force, out=print)


def cmd_prune(args: PruneArgs) -> int:
    """`fab prune` (and `--check`)."""
    from tfsdeploy.run import prune

    if args.check:
        return output.print_check("prune", args.model, args.json,
                                  prune.prune_check(target(args), playbook=args.playbook))
    shown = output.reporter(args.json, args.log_file)
    record = Record("prune", args, shown.events, extra=prune.summary_data)
    result = prune.prune(target(args), playbook=args.playbook, lock_wait=args.lock_wait,
                         reporter=shown, epilogue=Epilogue(record=record))
    return shown_result("prune", result, record, json=args.json,
                        rows=prune.summary_rows(result))


def cmd_publish(args: PublishArgs) -> int:
    """`fab publish`: the version packed once and pushed to each registry the model's hosts
    name; only what a registry lacks is pushed."""
    from tfsdeploy.run import stage

    chosen = target(args)
    published = stage.publish_version(chosen, args.version)
    if args.json:
        output.print_json(stage.publish_data(chosen, published))
        return 0
    for done in published:
        print(done.describe())
        print(f"digest {done.digest}  tag {done.tag}")
    return 0


def cmd_stage(args: StageArgs) -> int:
    """`fab stage`: the version put in place on every selected host ahead of a release."""
    from tfsdeploy.run import stage

    shown = output.reporter(args.json, args.log_file)
    record = Record("stage", args, shown.events)
    result = stage.stage(target(args), version=args.version, playbook=args.playbook,
                         lock_wait=args.lock_wait, max_pulls=args.max_pulls,
                         reporter=shown, epilogue=Epilogue(record=record))
    return shown_result("stage", result, record, json=args.json)


def cmd_retire(args: RetireArgs) -> int:
    """`fab retire` (and `--check`): by default from every inventory host (each one that holds
    the model is retired; the others are reported absent)."""
    from tfsdeploy.run import retire

    chosen = load_target(safe_model(args.model), inventory=args.inventory,
                         hosts=args.hosts or "all", limit=args.limit)
    if args.check:
        return output.print_check("retire", args.model, args.json,
                                  retire.retire_check(chosen, playbook=args.playbook))
    shown = output.reporter(args.json, args.log_file)
    record = Record("retire", args, shown.events)
    result = retire.retire(chosen, playbook=args.playbook, lock_wait=args.lock_wait,
                           reporter=shown, epilogue=Epilogue(record=record))
    return shown_result("retire", result, record, json=args.json)


def cmd_accept(args: AcceptArgs) -> int:
    """`fab accept` (docs/acceptance.md), on the engine's session (``engine.operate``): its
    generator hosts' connections are the session's, closed at the end, and Ctrl-C, SIGTERM
    and SIGHUP end the window as the engine stops a run."""
    from tfsdeploy.accept.options import AcceptOptions
    from tfsdeploy.accept.run import ACCEPT_STOPPING, run_accept, say
    from tfsdeploy.run import engine

    accept = AcceptOptions(
        model=safe_model(args.model), inventory=args.inventory,
        target_qps=args.target_qps, duration=args.duration, interval=args.interval,
        release=args.release, release_at=args.release_at, loadgens=args.loadgens,
        slo_p99_ms=args.slo_p99_ms, max_error_rate_pct=args.max_error_rate,
        data_version=args.data_version, start_margin=args.start_margin,
        timeout=args.timeout, concurrency=args.concurrency, procs=args.procs)
    return engine.operate(
        lambda session, stop: run_accept(accept, root=ROOT,
                                         out=Path(args.out) if args.out else None,
                                         runner_factory=session.connection,
                                         show_table=output.print_table, stop=stop),
        note=say, saying=ACCEPT_STOPPING)


def cmd_gateway(args: GatewayArgs) -> int:
    """`fab gateway` (and `--check [--diff]`)."""
    from tfsdeploy.cli.gateway import cmd_gateway as run_gateway

    return run_gateway(args.inventory, check=args.check, diff=args.diff)


COMMANDS: dict[str, Callable[[Any], int]] = {
    "render": cmd_render, "hosts": cmd_hosts, "deploy": cmd_deploy, "rollback": cmd_rollback,
    "status": cmd_status, "history": cmd_history, "guard": cmd_guard, "bench": cmd_bench,
    "plan_capacity": cmd_plan_capacity, "lock": cmd_lock, "logs": cmd_logs, "exec": cmd_exec,
    "prune": cmd_prune, "retire": cmd_retire, "accept": cmd_accept, "promote": cmd_promote,
    "abort": cmd_abort, "publish": cmd_publish, "stage": cmd_stage, "observe": cmd_observe,
    "gateway": cmd_gateway, "tune": cmd_tune, "diagnose": cmd_diagnose,
}
UNATTENDED = ("deploy", "rollback", "guard", "prune", "retire", "promote", "abort", "stage")


def main(command: str, raw: dict[str, Any]) -> int:
    """Run ``command`` with the task's arguments (as invoke parsed them, text) typed into its
    options class (``cli.verbs``); returns the exit code."""
    name = command.replace("-", "_")
    given = {k: v for k, v in raw.items() if k != "c"}
    record = None
    if name in UNATTENDED:
        model = str(given.get("model", ""))
        # a --model that is no model name is recorded under a label no model can have
        label = model if is_safe(model) else INVALID_MODEL
        record = unattended_outputs(name, label, writable(given.get("json_file")),
                                    writable(given.get("metrics_file")))
    with guarded_output():
        return run_command(lambda: COMMANDS[name](options(given, name)), record=record)
