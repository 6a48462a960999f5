"""The commands behind the `fab` tasks: arguments checked, the run made, its result printed,
the exit code returned. ``tasks.py`` holds only the tasks' signatures and help.

Every command ends with a documented exit code, whatever happens: a toolkit error gives its
own; any other exception (a defect) gives 1 when it came before any host was changed and 3
after (a run in progress records where it stands), one clear line, the traceback only with
``--debug`` (or TFSDEPLOY_DEBUG=1), and ``--json-file``/``--metrics-file`` still written.
"""

from __future__ import annotations

import os
import re
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, TypeAdapter, ValidationError
from pydantic_core import PydanticCustomError

from tfsdeploy.core.errors import ConfigError, ExitCode, Problem, TfsDeployError
from tfsdeploy.core.timetext import SINCE_FIX, since_seconds


def parsed(parse: Callable[[str], Any], fix: str) -> BeforeValidator:
    """An option given as text and parsed by ``parse`` (which raises ValueError saying why it
    cannot); the error carries ``fix`` for the problem options() reports."""
    def validate(value: Any) -> Any:
        try:
            return parse(str(value))
        except ValueError as error:
            raise PydanticCustomError("tfsdeploy", "{reason}",
                                      {"reason": str(error), "fix": fix}) from None
    return BeforeValidator(validate)


def since_text(text: str) -> str:
    """`fab logs --since`, checked before any host (cli.fleet.since_seconds) and passed on
    as given: logs() reads it against the clock when it starts."""
    since_seconds(text, time.time())
    return text


def release_id(text: str) -> str:
    """`fab rollback --to`: a release id as the toolkit makes them (it names paths on hosts)."""
    from tfsdeploy.core.records import RELEASE_ID

    if not RELEASE_ID.fullmatch(text):  # not match(): its $ lets a trailing newline through
        raise ValueError("is not a release id (r<date>-<time>-v<version>)")
    return text


def duration_text(text: str) -> str:
    """`fab bench --duration`, `fab accept --duration`: 10s, 500ms, 2m, 1.5h (the load
    generator's form), checked here and kept as text for the command to read."""
    import argparse
    import math

    from tfsdeploy.loadtest.cli import parse_duration

    if not text.isascii():  # the parsers' \d and float() also read other scripts' digits
        raise ValueError("is not a duration (ASCII digits and a unit)")
    try:
        seconds = parse_duration(text)
    except argparse.ArgumentTypeError:
        raise ValueError("is not a duration") from None
    if not math.isfinite(seconds):
        raise ValueError("is too long to be a duration")
    return text


def output_path(*, directory: bool) -> Callable[[str], str]:
    """A path a command writes (a file, or with ``directory`` a directory), checked before
    the command runs: not a NUL byte, not a directory where a file goes (nor the reverse),
    under a directory (missing ones are made) and a name the file system takes."""
    def check(text: str) -> str:
        if "\x00" in text:
            raise ValueError("holds a NUL byte")
        path = Path(text)
        try:
            if path.exists() and path.is_dir() != directory:
                raise ValueError("is a file, not a directory" if directory else
                                 "is a directory, not a file")
            above = next((p for p in path.parents if p.exists()), None)
            if above is not None and not above.is_dir():
                raise ValueError(f"is under {str(above)!r}, a file")
        except OSError as error:  # a name too long for the file system
            raise ValueError(f"cannot be used: {error.strerror}") from None
        return text
    return check


def input_file(text: str) -> str:
    """A file a command reads (--sweep-report)."""
    if "\x00" in text:
        raise ValueError("holds a NUL byte")
    try:
        found = Path(text).is_file()
    except OSError as error:
        raise ValueError(f"cannot be used: {error.strerror}") from None
    if not found:
        raise ValueError("is not a file")
    return text


OutputFile = Annotated[str, parsed(output_path(directory=False),
                                   "name a file in a directory this user can write")]
OutputDir = Annotated[str, parsed(output_path(directory=True),
                                  "name a directory (made when missing) this user can write")]
NonNegative = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Positive = Annotated[float, Field(gt=0, allow_inf_nan=False)]
Fraction = Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)]  # 0 divides by zero
Count = Annotated[int, Field(ge=1, le=1_000_000)]
OPTION_TYPES: dict[str, Any] = {
    "lock_wait": NonNegative, "for_s": NonNegative, "interval_s": Positive,
    "duration_s": Positive, "slo_p99_ms": Positive, "max_error_rate": NonNegative,
    "min_requests": Count, "concurrency": Count, "procs": Count, "rps": Positive,
    "slo_p99": Positive, "min_qps": Positive, "target_qps": Positive,
    "per_instance_qps": Positive, "load_factor": Fraction, "availability_factor": Fraction,
    "lines": Count, "step_s": Positive, "instances_per_host": Count,
    "since": Annotated[str, parsed(since_text, SINCE_FIX)],
    "to": Annotated[str, parsed(release_id, "give a release id that `fab history` lists, "
                                            "e.g. r20250131-080000000-v3")],
    "duration": Annotated[str, parsed(duration_text, "write it like 30s, 500ms, 2m or 1.5h")],
    "json_file": OutputFile, "metrics_file": OutputFile, "log_file": OutputFile,
    "report": OutputFile, "sweep_plot": OutputFile, "out": OutputDir,
    "sweep_report": Annotated[str, parsed(input_file, "name the JSON report of `fab bench "
                                                      "--sweep`")],
}


def _canary_weights(text: str) -> None:
    from tfsdeploy.core.canary_policy import parse_weights

    # int() takes other scripts' digits ('\u0665' is 5) and '1_0'; the command line takes ASCII
    if not re.fullmatch(r"[0-9, ]+", text):
        raise ConfigError(Problem(f"--canary-weights {text!r} is not a comma-separated list "
                                  "of integers", fix="write e.g. --canary-weights 5,25,50",
                                  field="--canary-weights"))
    parse_weights(text)


def _notify_urls(urls: list[str]) -> None:
    from tfsdeploy.runbook import notify

    try:
        notify.check_urls(urls)
    except ValueError as error:  # urlsplit's own refusals, e.g. "Invalid IPv6 URL"
        # the URL is not quoted: webhook URLs carry their secret token
        raise ConfigError(Problem(f"a --notify URL cannot be parsed: {error}",
                                  fix="give the receiver's full URL, e.g. "
                                      "https://hooks.example.com/T/B/X",
                                  field="--notify")) from None


# options checked by the module that reads them (a located ConfigError), whatever the
# command does with them: `deploy --check` reads neither the canary options nor --notify,
# yet must refuse what the deploy would
OPTION_CHECKS: dict[str, Callable[[Any], None]] = {
    "canary_weights": lambda value: _canary_weights(str(value)),
    "notify": lambda value: _notify_urls(list(value)),
}


def options(raw: dict[str, Any]) -> dict[str, Any]:
    """The command's options, typed and range-checked; every bad one named at once."""
    checked, problems = dict(raw), []
    for name, value in raw.items():
        flag = f"--{name.replace('_', '-')}"
        if isinstance(value, str) and not value.strip():
            # an empty value is never a choice: `--inventory "$INV"` with $INV unset must not
            # mean the default inventory, nor `--hosts ""` every host of the model
            problems.append(Problem(f"{flag} is empty", fix=f"give a value, or leave {flag} out",
                                    field=flag))
        elif name in OPTION_CHECKS and value is not None:
            try:
                OPTION_CHECKS[name](value)
            except ConfigError as error:
                problems += error.problems
        elif name in OPTION_TYPES and value is not None:
            try:
                checked[name] = TypeAdapter(OPTION_TYPES[name]).validate_python(value)
            except ValidationError as error:
                first = error.errors()[0]
                fix = (first.get("ctx") or {}).get("fix") or \
                    "give a number in range (see `fab --help <command>`)"
                problems.append(Problem(f"{flag} {value!r}: {first['msg']}", fix=fix,
                                        field=flag))
    if problems:
        raise ConfigError(problems)
    return checked


def debugging() -> bool:
    """Whether tracebacks are wanted (``fab --debug`` or TFSDEPLOY_DEBUG=1)."""
    return os.environ.get("TFSDEPLOY_DEBUG") == "1" or "--debug" in sys.argv or "-d" in sys.argv


Outputs = Callable[[int, str], None]


def run_command(body: Callable[[], int], *, record: Outputs | None = None) -> int:
    """Run a command's body; map every way it can end to its exit code and one clear line."""
    from tfsdeploy.cli.output import print_error

    try:
        return body()
    except TfsDeployError as error:
        code = int(error.exit_code)
        message = str(error)
        print_error(error)
    except KeyboardInterrupt:
        code, message = int(ExitCode.INVALID), "interrupted before any host was changed"
        print(f"tfsdeploy: {message}", file=sys.stderr)
    except Exception as error:  # a defect: still a documented exit code and outputs
        code, message = int(ExitCode.INVALID), f"unexpected {type(error).__name__}: {error}"
        print_error(error)
        if debugging():
            traceback.print_exc()
    if record is not None:
        record(code, message)
    return code


def unattended_outputs(command: str, model: str, json_file: str | None,
                       metrics_file: str | None) -> Outputs:
    """Write the JSON result and metrics of a run that ended early (invalid input, lock held,
    a defect): cron and dashboards still see it."""
    started = time.monotonic()

    def record(code: int, message: str) -> None:
        from tfsdeploy.cli.unattended import update_textfile, write_json_file

        try:
            if json_file:
                write_json_file(json_file, {
                    "command": command, "model": model, "exit_code": code,
                    "result": ExitCode(code).name.lower(), "message": message, "hosts": {}})
            if metrics_file:
                update_textfile(metrics_file, model=model, command=command, exit_code=code,
                                seconds=time.monotonic() - started, release="", version=None)
        except (OSError, ValueError) as error:  # the paths were refused, or the disk is full
            print(f"tfsdeploy: the result could not be written: {error}", file=sys.stderr)

    return record


def safe_model(name: str) -> str:
    """A model name fit for files and metric labels (checked before it is recorded)."""
    import re

    if not re.fullmatch(r"[A-Za-z0-9_.-]{1,128}", name or "") or name in (".", ".."):
        raise ConfigError(Problem(f"--model {name!r} is not a model name",
                                  fix="give a name from the inventory's catalog "
                                      "(letters, digits, '.', '_', '-')", field="--model"))
    return name


def finish(command: str, result: Any, *, json: bool, json_file: str | None,
           metrics_file: str | None, events: list[dict[str, Any]] | None = None,
           around: Any = None, rows: list[tuple[str, ...]] | None = None,
           extra: dict[str, Any] | None = None) -> int:
    """Print a run's summary (or JSON), write the unattended outputs, run the post-hooks and
    report the notifications; return the run's exit code (hooks never change it). ``rows``
    replace the table's per-host rows (host, result, what, size, error); ``extra`` is added to
    the JSON result."""
    from tfsdeploy.cli.deploy import summary_rows
    from tfsdeploy.cli.output import print_json, print_table
    from tfsdeploy.cli.unattended import update_textfile, write_json_file

    data = {"command": command, **result.as_dict(), **(extra or {}), "events": events or []}
    if json_file:
        write_json_file(json_file, data)
    if around is not None:
        from tfsdeploy.cli.around import after

        data |= after(around, _note_sink(json), result=result,
                      exit_code=int(result.exit_code), seconds=result.seconds,
                      message=result.message, data=data, json_file=json_file)
    if json:
        print_json(data)
    else:
        # a run without a release (prune) names none
        what = f" v{result.version} ({result.release_id})" if result.release_id else ""
        print_table(f"{command} {result.model}{what}: {result.exit_code.name.lower()} in "
                    f"{result.seconds:.1f} s",
                    ("host", "result", "removed", "freed", "error") if rows is not None else
                    ("host", "result", "time per phase", "gates", "error"),
                    rows if rows is not None else summary_rows(result))
        print(result.message)
    if json_file and around is not None:
        write_json_file(json_file, data)
    if metrics_file:
        update_textfile(metrics_file, model=result.model, command=command,
                        exit_code=int(result.exit_code), seconds=result.seconds,
                        release=result.release_id, version=result.version)
    return int(result.exit_code)


def _note_sink(json: bool) -> Any:
    """Where the lines after a run go: stderr with --json, else stdout."""
    class Notes:
        def note(self, text: str) -> None:
            print(f"== {text}", file=sys.stderr if json else sys.stdout)

    return Notes()


def reporter(json: bool, log_file: str | None) -> Any:
    """Progress lines on stdout (stderr with --json), and in the log file."""
    from tfsdeploy.cli.output import LineReporter

    return LineReporter(sys.stderr if json else sys.stdout, log_file)


def target(args: dict[str, Any]) -> Any:
    """The command's target: inventory, model (validated), selected hosts."""
    from tfsdeploy.core.target import load_target

    return load_target(safe_model(args["model"]), inventory=args.get("inventory"),
                       hosts=args.get("hosts"), limit=args.get("limit"))


# -- the commands -----------------------------------------------------------------------

def cmd_render(a: dict[str, Any]) -> int:
    """`fab render`."""
    from tfsdeploy.cli.output import print_table
    from tfsdeploy.cli.render import render_and_validate, summary_rows, write_renders

    renders = render_and_validate(target(a), a["version"])
    written = write_renders(renders, Path(a["out"]))
    print_table(f"{a['model']}: {len(renders)} host(s) rendered and validated into {a['out']}/",
                ("host", "address", "version", "GPU fraction", "files"), summary_rows(renders))
    print(f"{len(written)} files written; the TFServing files parsed with TFServing's "
          "definitions; proxy/haproxy.cfg as a first deploy writes it (slot blue).")
    return 0


def cmd_hosts(a: dict[str, Any]) -> int:
    """`fab hosts`."""
    from tfsdeploy.cli.output import print_table
    from tfsdeploy.core.fleet import ResolvedHost
    from tfsdeploy.core.gpu import instance_gpus
    from tfsdeploy.core.inventory import load_inventory
    from tfsdeploy.core.render import placements

    inv = load_inventory(a["inventory"])
    placed = placements(inv)

    def models(host: ResolvedHost) -> str:
        """Each model on the host, with its instances' GPUs when it runs one per GPU."""
        cells = []
        for name in (m for m, on in placed.items() if host.name in on):
            gpus = instance_gpus(host, inv.models[name])
            cells.append(name if len(gpus) < 2 else
                         f"{name} x{len(gpus)} (GPU {','.join(str(g[0]) for g in gpus)})")
        return ", ".join(cells) or "-"

    rows = [(h.name, h.address, ",".join(h.groups) or "-",
             " ".join(f"{g.index}:{g.memory_mib}MiB" for g in h.gpus) or "-", models(h))
            for h in inv.select(a["hosts"], limit=a["limit"])]
    print_table(f"{inv.path}: {len(rows)} host(s)",
                ("host", "address", "groups", "GPUs", "models"), rows)
    return 0


def cmd_deploy(a: dict[str, Any]) -> int:
    """`fab deploy` (and `--check [--diff]`)."""
    from tfsdeploy.cli import deploy as cmd

    if a["check"] or a["diff"]:
        return _print_check(a, cmd.check(target(a), version=a["version"],
                                         playbook=a["playbook"], diff=a["diff"]))
    return _surrounded("deploy", a, lambda t, shown, before: cmd.deploy(
        t, version=a["version"], playbook=a["playbook"], lock_wait=a["lock_wait"],
        reporter=shown, before=before, canary=_canary_option(t, a)))


def _canary_option(chosen: Any, a: dict[str, Any]) -> Any:
    """The command line's canary policy (over the model's), or None to keep the model's."""
    import dataclasses

    from tfsdeploy.core.canary_policy import CanaryPolicy, parse_weights

    if not (a.get("canary_weights") or a.get("pause") or a.get("step_s")):
        return None
    base = chosen.model.rollout.canary or CanaryPolicy()
    changes: dict[str, Any] = {}
    if a.get("canary_weights"):
        changes["weights"] = parse_weights(str(a["canary_weights"]))
    if a.get("step_s"):
        changes["step_s"] = float(a["step_s"])
    if a.get("pause"):
        changes["pause"] = True
    return dataclasses.replace(base, **changes)


def _surrounded(command: str, a: dict[str, Any], run: Callable[..., Any]) -> int:
    """A command's run with its hooks and notifications around it (cli/around.py): the
    pre-hook once the release is known and everything is validated (it may stop the run
    before any host is changed), events during the run, the post-hooks and the delivery
    report after it."""
    from tfsdeploy.cli import around as runbook

    chosen = target(a)
    shown = runbook.EventReporter(reporter(a["json"], a["log_file"]))
    before = runbook.surround(shown, command, chosen, hooks_dir=a.get("hooks"),
                              notify_urls=a.get("notify") or ())
    try:
        result = run(chosen, shown, before)
    except BaseException:
        if shown.around is not None:
            runbook.close(shown.around)
        raise
    return finish(command, result, json=a["json"], json_file=a["json_file"],
                  metrics_file=a["metrics_file"], events=shown.events, around=shown.around)


def _print_check(a: dict[str, Any], rows: list[dict[str, Any]]) -> int:
    from tfsdeploy.cli.output import print_json, print_table

    if a["json"]:
        print_json(rows)
        return 0
    print_table(f"{a.get('command', 'deploy')} --check {a['model']}: nothing was changed",
                ("host", "would do", "live"), [(r["host"], r["action"], r["detail"])
                                               for r in rows])
    for row in rows:
        print(f"{row['host']}:")
        for step in row["steps"]:
            if step["error"]:
                print(f"  {step['phase']:<9} {step['step']:<15} WOULD FAIL: {step['error']}")
            for change in step["changes"]:
                print(f"  {step['phase']:<9} {step['step']:<15} {change['what']}")
        if row["diff"]:
            print(row["diff"])
    return 0


def cmd_promote(a: dict[str, Any]) -> int:
    """`fab promote`."""
    from tfsdeploy.cli.canary import finish_canary

    return _surrounded("promote", a, lambda t, shown, before: finish_canary(
        "promote", t, lock_wait=a["lock_wait"], reporter=shown, before=before))


def cmd_abort(a: dict[str, Any]) -> int:
    """`fab abort`."""
    from tfsdeploy.cli.canary import finish_canary

    return _surrounded("abort", a, lambda t, shown, before: finish_canary(
        "abort", t, lock_wait=a["lock_wait"], reporter=shown, before=before))


def cmd_rollback(a: dict[str, Any]) -> int:
    """`fab rollback`."""
    from tfsdeploy.cli.rollback import rollback

    return _surrounded("rollback", a, lambda t, shown, before: rollback(
        t, to=a["to"], playbook=a["playbook"], lock_wait=a["lock_wait"], reporter=shown,
        before=before))


def cmd_status(a: dict[str, Any]) -> int:
    """`fab status`."""
    from tfsdeploy.cli.fleet import status
    from tfsdeploy.cli.output import print_json, print_table

    rows = status(target(a))
    if a["json"]:
        print_json(rows)
    else:
        print_table(f"{a['model']}: status", ("host", "release", "version", "traffic", "slots",
                                              "drift", "lock"), [_status_row(r) for r in rows])
    return 0 if all(r["reachable"] for r in rows) else 3


def _status_row(row: dict[str, Any]) -> tuple[str, ...]:
    from tfsdeploy.cli.fleet import traffic_cell

    if not row["reachable"]:
        return (row["host"], "UNREACHABLE", "", "", row.get("error", "")[:60], "", "")
    instances = row.get("instances") or [{"instance": 0, "traffic_slot": row["traffic_slot"],
                                          "slots": row["slots"]}]
    several = len(instances) > 1

    def label(instance: dict[str, Any]) -> str:
        return f"i{instance['instance']} " if several else ""

    slots = "; ".join(
        f"{label(instance)}{slot}: " + ", ".join(
            f"{c['release']} {'running' if c['running'] else 'stopped'}"
            + "".join(f" [{v.get('version', '?')} {v.get('state', v.get('error'))}]"
                      for v in c["versions"])
            for c in containers)
        for instance in instances
        for slot, containers in instance["slots"].items() if containers)
    return (row["host"], str(row["current"] or "-"), str(row["version"] or "-"),
            traffic_cell(instances, row.get("canary")), slots or "-",
            ", ".join(row["drift"]) or "none", row["lock"] or "free")


def cmd_history(a: dict[str, Any]) -> int:
    """`fab history`."""
    from tfsdeploy.cli.fleet import history
    from tfsdeploy.cli.output import print_json, print_table

    rows = history(target(a))
    if a["json"]:
        print_json(rows)
        return 0 if all(r["reachable"] for r in rows) else 3
    for row in rows:
        if not row["reachable"]:
            print(f"{row['host']}: UNREACHABLE ({row['error']})")
            continue
        print_table(f"{row['host']}: releases of {a['model']}",
                    ("release", "version", "status", "slot", "by", "at", "seconds", "gates"),
                    [(r["id"], str(r["version"]), str(r["status"]), str(r["slot"]),
                      str(r["by"]), str(r["at"]), str(r["seconds"]),
                      " ".join(f"{g} {s:.1f}s" for g, s in r["gates"].items()))
                     for r in row["releases"]])
        for broken in row["broken_records"]:
            print(f"  unreadable record {broken['path']}: {broken['error']}")
        for entry in row["audit"][-15:]:
            print(f"  {entry['time']} {entry['who']} {entry['event']} {entry['release']} "
                  f"{entry['details'] or ''}")
    return 0 if all(r["reachable"] for r in rows) else 3


def cmd_guard(a: dict[str, Any]) -> int:
    """`fab guard`: when it acts, the rollback (or the abort of a paused canary) runs with the
    hooks and events `fab rollback` (`fab abort`) has, after a ``guard_triggered`` event."""
    from tfsdeploy.cli import around as runbook
    from tfsdeploy.cli.guard import GuardPolicy, guard
    from tfsdeploy.cli.unattended import update_textfile

    started = time.monotonic()
    policy = GuardPolicy(max_error_rate=a["max_error_rate"], slo_p99_ms=a["slo_p99_ms"],
                         for_s=a["for_s"], interval_s=a["interval_s"],
                         duration_s=a["duration_s"], min_requests=a["min_requests"],
                         count_client_errors=bool(a.get("count_client_errors")))
    chosen = target(a)
    shown = runbook.EventReporter(reporter(False, a["log_file"]))
    around = shown.around = runbook.prepare("guard", chosen, hooks_dir=a.get("hooks"),
                                            notify_urls=a.get("notify") or ())
    act, abort = runbook.guard_actions(shown, chosen, lock_wait=policy.lock_wait)
    try:
        code, message = guard(chosen, policy, reporter=shown, act=act, abort=abort)
    except BaseException:
        runbook.close(around)
        raise
    seconds = time.monotonic() - started
    if around.verb:  # it acted
        data = {"command": "guard", "model": chosen.model.name, "exit_code": int(code),
                "result": ExitCode(code).name.lower(), "message": message,
                "action": around.verb,
                "run": around.outcome.as_dict() if around.outcome is not None else None}
        runbook.after(around, shown, result=around.outcome, exit_code=int(code),
                      seconds=seconds, message=message, data=data, json_file=None)
    else:
        runbook.close(around)
    print(message)
    if a["metrics_file"]:
        update_textfile(a["metrics_file"], model=a["model"], command="guard",
                        exit_code=int(code), seconds=seconds, release="", version=None)
    return int(code)


def cmd_bench(a: dict[str, Any]) -> int:
    """`fab bench`."""
    from tfsdeploy.cli.bench import bench

    return bench(target(a), a)


def cmd_plan_capacity(a: dict[str, Any]) -> int:
    """`fab plan-capacity`."""
    from tfsdeploy.loadtest.cli import plan_capacity as plan

    source: str | float | None = a["sweep_report"] or a["per_instance_qps"]
    if source is None:
        raise ConfigError(Problem("no per-instance figure",
                                  fix="pass --sweep-report FILE or --per-instance-qps N"))
    code, text = plan(a["target_qps"], source, load_factor=a["load_factor"],
                      availability_factor=a["availability_factor"],
                      instances_per_host=a["instances_per_host"], as_json=a["json"])
    print(text)
    return code


def cmd_lock(a: dict[str, Any]) -> int:
    """`fab lock`."""
    from tfsdeploy.cli.fleet import lock_state

    lines, verdict = lock_state(target(a), breaking=a["break_"])
    print("\n".join([*lines, verdict]))
    return 0


def cmd_logs(a: dict[str, Any]) -> int:
    """`fab logs`."""
    from tfsdeploy.cli.fleet import logs

    return logs(target(a), lines=int(a["lines"]), since=a["since"], follow=a["follow"],
                out=lambda line: print(line, flush=True))  # followed lines show as they come


def cmd_exec(a: dict[str, Any]) -> int:
    """`fab exec -- CMD ...`."""
    from tfsdeploy.cli.fleet import exec_in

    return exec_in(target(a), list(a["argv"]), force=a["force"], out=print)


def cmd_prune(a: dict[str, Any]) -> int:
    """`fab prune` (and `--check`)."""
    from tfsdeploy.cli.prune import prune, prune_check

    if a["check"]:
        return _print_check({**a, "command": "prune"}, prune_check(target(a),
                                                                   playbook=a["playbook"]))
    from tfsdeploy.cli.prune import summary_data, summary_rows

    shown = reporter(a["json"], a["log_file"])
    result = prune(target(a), playbook=a["playbook"], lock_wait=a["lock_wait"],
                   reporter=shown)
    return finish("prune", result, json=a["json"], json_file=a["json_file"],
                  metrics_file=a["metrics_file"], events=shown.events,
                  rows=summary_rows(result), extra=summary_data(result))


def cmd_accept(a: dict[str, Any]) -> int:
    """`fab accept` (docs/acceptance.md)."""
    from tfsdeploy.accept.plan import AcceptOptions
    from tfsdeploy.accept.run import run_accept
    from tfsdeploy.cli.output import print_table

    options = AcceptOptions(
        model=safe_model(a["model"]), inventory=a["inventory"], target_qps=a["target_qps"],
        duration=a["duration"], interval=a["interval"], release=a["release"],
        release_at=a["release_at"], loadgens=a["loadgens"], slo_p99_ms=a["slo_p99_ms"],
        max_error_rate_pct=a["max_error_rate"], data_version=a["data_version"],
        start_margin=a["start_margin"], timeout=a["timeout"], concurrency=a["concurrency"],
        procs=a["procs"])
    root = Path(__file__).resolve().parents[3]
    return run_accept(options, root=root, out=Path(a["out"]) if a["out"] else None,
                      show_table=print_table)


COMMANDS: dict[str, Callable[[dict[str, Any]], int]] = {
    "render": cmd_render, "hosts": cmd_hosts, "deploy": cmd_deploy, "rollback": cmd_rollback,
    "status": cmd_status, "history": cmd_history, "guard": cmd_guard, "bench": cmd_bench,
    "plan_capacity": cmd_plan_capacity, "lock": cmd_lock, "logs": cmd_logs, "exec": cmd_exec,
    "prune": cmd_prune, "accept": cmd_accept, "promote": cmd_promote, "abort": cmd_abort,
}
UNATTENDED = ("deploy", "rollback", "guard", "prune", "promote", "abort")


def main(command: str, raw: dict[str, Any]) -> int:
    """Run ``command`` with the task's arguments; returns the exit code."""
    args = {k: v for k, v in raw.items() if k != "c"}
    record = None
    if command in UNATTENDED:
        from tfsdeploy.cli.unattended import INVALID_MODEL

        model = str(args.get("model", ""))
        # a --model that is no model name is recorded under a label no model can have
        label = model if _is_safe(model) else INVALID_MODEL
        record = unattended_outputs(command, label, _writable(args.get("json_file")),
                                    _writable(args.get("metrics_file")))
    return run_command(lambda: COMMANDS[command](options(args)), record=record)


def _writable(path: Any) -> str | None:
    """``path`` when it passes the output file check (a refused one is reported by
    options() and never written)."""
    try:
        return output_path(directory=False)(path) if isinstance(path, str) and path else None
    except ValueError:
        return None


def _is_safe(name: str) -> bool:
    try:
        safe_model(name)
    except ConfigError:
        return False
    return True
