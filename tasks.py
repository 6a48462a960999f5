"""tfsdeploy's Fabric tasks: their signatures and help; each hands its arguments to
``tfsdeploy.cli.main`` and exits with its code (README "Exit codes").

Run from the repository root: `fab --list`, `fab render --model resnet50`.

Numeric options are declared as text: invoke converts an option whose default is a number
itself, and `--lines abc` then ends in its ValueError's traceback; as text, every value
reaches ``tfsdeploy.cli.main.options``, which types it and names the option it is wrong for.
"""

from __future__ import annotations

import functools
import inspect
import sys
from pathlib import Path

# This checkout's own package, whatever another checkout installed into the shared venv
# (an editable install points at whichever checkout ran scripts/setup last).
_SRC = str(Path(__file__).resolve().parent / "src")
if sys.path[:1] != [_SRC]:
    sys.path.insert(0, _SRC)

from tfsdeploy.cli.terminal import guard_process_streams  # noqa: E402

# a reader that stops early (`fab deploy --help | head -1`) or a terminal that closed never
# turns into a traceback or another exit code (cli/terminal.py)
guard_process_streams()

from collections.abc import Callable  # noqa: E402
from typing import Any, NoReturn  # noqa: E402

import invoke.collection  # noqa: E402
from fabric import Task  # noqa: E402
from fabric import task as fabric_task  # noqa: E402
from invoke.collection import Collection  # noqa: E402
from invoke.exceptions import Exit  # noqa: E402
from invoke.parser.context import ParserContext  # noqa: E402


def _main(command: str, arguments: dict[str, Any]) -> None:
    from tfsdeploy.cli.main import main

    code = main(command, arguments)
    if code:
        raise Exit(code=code)


def command(**options: Any) -> Callable[[Callable[..., None]], Task]:
    """@task whose parameters are all options, long names only; one without a default is a
    required option.

    invoke makes a parameter without a default a positional argument and fills it with the
    next word, whatever it is: `fab deploy --help` took "--help" for the model's name. As an
    option, ``--model`` leaves ``--help`` to invoke, and its being given is checked here.
    Automatic short flags ran out of letters and gave some options the flag ``--`` (shown as
    ``--=STRING``).
    """
    def decorate(body: Callable[..., None]) -> Task:
        name = options.get("name") or body.__name__.replace("_", "-")
        required = [parameter.name for parameter in
                    list(inspect.signature(body).parameters.values())[1:]
                    if parameter.default is inspect.Parameter.empty]

        @functools.wraps(body)  # invoke reads the options from body's signature
        def checked(c: Any, **arguments: Any) -> None:
            missing = [option for option in required if arguments.get(option) is None]
            if missing:
                _refuse_missing(name, missing)
            body(c, **arguments)

        made: Task = fabric_task(auto_shortflags=False, positional=[], **options)(checked)
        return made
    return decorate


def _refuse_missing(task: str, missing: list[str]) -> NoReturn:
    """Exit 1 naming each required option left out, as cli.main names a bad one."""
    from tfsdeploy.cli.output import print_error
    from tfsdeploy.core.errors import ConfigError, Problem

    problems = []
    for option in missing:
        flag, value = f"--{option.replace('_', '-')}", VALUES.get(option, option.upper())
        problems.append(Problem(f"{flag} is required", field=flag, fix=f"give {flag} {value} "
                                f"(`fab {task} --help` lists every option)"))
    print_error(ConfigError(problems))
    raise Exit(code=1)


# What each option's value is, shown in `fab TASK --help` as --name=VALUE
VALUES = {
    "model": "MODEL", "inventory": "FILE", "hosts": "HOSTS", "limit": "HOSTS",
    "loadgens": "HOSTS", "version": "VERSION", "data_version": "VERSION",
    "release": "VERSION", "to": "RELEASE", "playbook": "FILE", "hooks": "DIR", "out": "DIR",
    "notify": "URL", "log_file": "FILE", "json_file": "FILE", "metrics_file": "FILE",
    "report": "FILE", "sweep_report": "FILE", "tune_report": "FILE", "sweep_plot": "FILE",
    "lock_wait": "SECONDS", "step_s": "SECONDS", "for_s": "SECONDS", "interval_s": "SECONDS",
    "duration_s": "SECONDS", "duration": "DURATION", "interval": "DURATION",
    "start_margin": "DURATION", "timeout": "DURATION", "since": "TIME", "release_at": "OFFSET",
    "canary_weights": "PERCENTS", "max_error_rate": "RATE", "slo_p99_ms": "MS", "slo_p99": "MS",
    "rps": "RPS", "min_qps": "QPS", "target_qps": "QPS", "per_instance_qps": "QPS",
    "load_factor": "FRACTION", "availability_factor": "FRACTION", "lines": "N",
    "concurrency": "N", "procs": "N", "host": "HOST", "budget": "DURATION",
    "step": "DURATION", "write": "FILE", "for_": "DURATION", "min_requests": "N",
    "instances_per_host": "N", "max_pulls": "N",
}


class _ValueNamed(ParserContext):
    """A task's parser context whose help names each option's value (``--lock-wait=SECONDS``,
    ``--notify=URL``) where invoke gives only its type (``=STRING``) or, for a repeatable
    option, nothing."""

    def help_for(self, flag: str) -> tuple[str, str]:
        names, text = super().help_for(flag)
        argument = self.flags[flag]
        if argument.takes_value and argument.name in VALUES:
            names = f"{names.split('=')[0]}={VALUES[argument.name]}"
        return names, text


# invoke (2.2) makes every task's parser context in Collection.to_contexts, from this name,
# and has no other way to name a value; `fab` loads the tasks into a Collection of its own,
# so a subclass of Collection would not be the one asked.
invoke.collection.ParserContext = _ValueNamed  # type: ignore[attr-defined]


INVENTORY = "inventory file (default: $TFSDEPLOY_INVENTORY or inventory/testbed.py)"
SELECT = {
    "model": "model name from the inventory's catalog (required)",
    "inventory": INVENTORY,
    "hosts": "hosts, groups or globs, comma-separated (default: the model's hosts)",
    "limit": "further narrow the hosts to these hosts, groups or globs",
}
RUNBOOK = {
    "hooks": "hooks directory (default: hooks/ beside the inventory); see docs/hooks.md",
    "notify": "POST a JSON event to this URL at each step of the run; repeat --notify for "
              "several URLs",
}
UNATTENDED = {
    "json": "print the result as JSON on stdout (progress goes to stderr)",
    "log_file": "also append the progress lines, time-stamped, to this file",
    "json_file": "write the JSON result to this file (atomically)",
    "metrics_file": "update this Prometheus textfile (node_exporter textfile collector)",
}


MAX_PULLS = ("hosts with model_transfer 'pull' that pull the version at once (default 8)")


@command(help={**SELECT, "version": "model version to publish (default: the newest in the "
                                  "model's source)",
               "json": "print the result as JSON"})
def publish(c: Any, model: str, inventory: str | None = None, hosts: str | None = None,
            limit: str | None = None, version: str | None = None, json: bool = False) -> None:
    """Pack a model version once and push it to the hosts' model_registry as an image."""
    _main("publish", locals())


@command(help={**SELECT, "version": "model version to stage (default: the newest in the "
                                  "model's source)",
               "playbook": "playbook file (default: playbooks/stage.yml)",
               "lock_wait": "seconds to wait for another run's lock before exiting 4 (default 0)",
               "max_pulls": MAX_PULLS, **UNATTENDED})
def stage(c: Any, model: str, inventory: str | None = None, hosts: str | None = None,
          limit: str | None = None, version: str | None = None, playbook: str | None = None,
          lock_wait: str = "0", max_pulls: str | None = None, json: bool = False,
          log_file: str | None = None, json_file: str | None = None,
          metrics_file: str | None = None) -> None:
    """Stage a model version on every host ahead of a release; nothing serving changes."""
    _main("stage", locals())


@command(help={**SELECT, "version": "model version to render (default: the newest in the "
                                  "model's source)",
            "out": "output directory; one folder per host (default: render/)"})
def render(c: Any, model: str, inventory: str | None = None, hosts: str | None = None,
           limit: str | None = None, version: str | None = None, out: str = "render") -> None:
    """Render and validate the files each host would receive; touches no host."""
    _main("render", locals())


@command(help={"model": "only this model (default: every model of the catalog)",
               "inventory": INVENTORY,
               "out": "output directory (default: observe/)",
               "targets": "also read each model's hosts and write its file_sd targets (where "
                          "the inventory's monitoring names, else DIR/prometheus/targets/)"})
def observe(c: Any, model: str | None = None, inventory: str | None = None,
            out: str = "observe", targets: bool = False) -> None:
    """Write Prometheus' scrape config, rules and alerts and Grafana dashboards for the fleet.

    From the inventory and the catalog; with --targets, also the serving processes' targets."""
    _main("observe", locals())


@command(help={"inventory": INVENTORY,
               "check": "show per gateway host whether its configuration would change; "
                        "touch nothing",
               "diff": "show the diff of every gateway host's files against what is live "
                       "(implies --check)"})
def gateway(c: Any, inventory: str | None = None, check: bool = False,
            diff: bool = False) -> None:
    """Render the gateway hosts' HAProxy from the inventory and roll it host by host."""
    _main("gateway", locals())


@command(help={"inventory": INVENTORY, "hosts": "hosts, groups or globs, comma-separated",
            "limit": "further narrow the hosts"})
def hosts(c: Any, inventory: str | None = None, hosts: str | None = None,
          limit: str | None = None) -> None:
    """List the inventory's hosts with their groups, GPUs and models."""
    _main("hosts", locals())


@command(iterable=["notify"], help={
    **SELECT,
    "version": "model version to deploy (default: the newest in the model's source)",
    "playbook": "playbook file (default: playbooks/deploy.yml)",
    "lock_wait": "seconds to wait for another deploy's lock before exiting 4 (default 0)",
    "check": "show every host's plan: the steps and the changes a deploy would make; "
             "touch nothing",
    "diff": "with --check: also diff every file against what is live",
    "canary_weights": "weighted steps on the first batch, percent of requests to the new "
                      "release, e.g. 5,25,50 (default: the model's Rollout(canary=...))",
    "step_s": "seconds each canary step is held and judged (default: the policy's, 60)",
    "pause": "after the last canary step, stop holding the canary (exit 6): fab promote or "
             "fab abort finish it",
    "max_pulls": MAX_PULLS,
    **RUNBOOK,
    **UNATTENDED,
})
def deploy(c: Any, model: str, inventory: str | None = None, hosts: str | None = None,
           limit: str | None = None, version: str | None = None, playbook: str | None = None,
           lock_wait: str = "0", check: bool = False, diff: bool = False,
           canary_weights: str | None = None, step_s: str | None = None,
           pause: bool = False, max_pulls: str | None = None, hooks: str | None = None,
           notify: list[str] | None = None, json: bool = False, log_file: str | None = None,
           json_file: str | None = None, metrics_file: str | None = None) -> None:
    """Roll a model release host by host in a dual-version window, gated on health."""
    _main("deploy", locals())


@command(iterable=["notify"], help={
    **SELECT,
    "to": "release id to return to (default: the newest release good on every host)",
    "playbook": "playbook file (default: playbooks/rollback.yml)",
    "lock_wait": "seconds to wait for another deploy's lock before exiting 4 (default 0)",
    **RUNBOOK,
    **UNATTENDED,
})
def rollback(c: Any, model: str, inventory: str | None = None, hosts: str | None = None,
             limit: str | None = None, to: str | None = None, playbook: str | None = None,
             lock_wait: str = "0", hooks: str | None = None, notify: list[str] | None = None,
             json: bool = False, log_file: str | None = None,
             json_file: str | None = None, metrics_file: str | None = None) -> None:
    """Return hosts to a retained release: a gated switch back within the window."""
    _main("rollback", locals())


CANARY = {**SELECT,
          "lock_wait": "seconds to wait for another run's lock before exiting 4 (default 0)",
          **RUNBOOK, **UNATTENDED}


@command(iterable=["notify"], help=CANARY)
def promote(c: Any, model: str, inventory: str | None = None, hosts: str | None = None,
            limit: str | None = None, lock_wait: str = "0", hooks: str | None = None,
            notify: list[str] | None = None, json: bool = False, log_file: str | None = None,
            json_file: str | None = None, metrics_file: str | None = None) -> None:
    """Finish a paused canary: its hosts switch fully, the other hosts roll in their batches."""
    _main("promote", locals())


@command(iterable=["notify"], help=CANARY)
def abort(c: Any, model: str, inventory: str | None = None, hosts: str | None = None,
          limit: str | None = None, lock_wait: str = "0", hooks: str | None = None,
          notify: list[str] | None = None, json: bool = False, log_file: str | None = None,
          json_file: str | None = None, metrics_file: str | None = None) -> None:
    """Return a paused canary's hosts to their old release at 100% and free the lock."""
    _main("abort", locals())


@command(help={**SELECT, "json": "print JSON instead of a table"})
def status(c: Any, model: str, inventory: str | None = None, hosts: str | None = None,
           limit: str | None = None, json: bool = False) -> None:
    """Per host: live release, slots, traffic, version states, drift and the lock.

    During a canary the traffic is each slot's share of the requests."""
    _main("status", locals())


@command(help={**SELECT, "json": "print JSON instead of tables"})
def history(c: Any, model: str, inventory: str | None = None, hosts: str | None = None,
            limit: str | None = None, json: bool = False) -> None:
    """Releases per host with results and durations, and the audit log."""
    _main("history", locals())


@command(iterable=["notify"], help={
    **SELECT,
    "max_error_rate": "act above this rate of server errors (default 0.01 = 1%)",
    "slo_p99_ms": "act above this P99 in ms (default: the model's latency SLO)",
    "for_s": "only after the breach lasted this long (default 30 s)",
    "interval_s": "seconds between metric reads (default 5)",
    "duration_s": "stop watching after this long (default: until a rollback)",
    "min_requests": "ignore windows with fewer requests (default 20)",
    "count_client_errors": "count client errors (malformed requests) too; by default only "
                           "the server's errors count",
    "lock_wait": "seconds its rollback or abort waits for another run's lock (default 60)",
    **RUNBOOK,
    "log_file": UNATTENDED["log_file"],
    "metrics_file": UNATTENDED["metrics_file"],
})
def guard(c: Any, model: str, inventory: str | None = None, hosts: str | None = None,
          limit: str | None = None, max_error_rate: str = "0.01",
          slo_p99_ms: str | None = None, for_s: str = "30", interval_s: str = "5",
          duration_s: str | None = None, min_requests: str = "20",
          count_client_errors: bool = False, lock_wait: str = "60",
          hooks: str | None = None, notify: list[str] | None = None,
          log_file: str | None = None, metrics_file: str | None = None) -> None:
    """Watch TFServing's metrics and roll back automatically when the SLO breaks.

    A paused canary that fails against its old release is aborted instead."""
    _main("guard", locals())


@command(help={
    **SELECT,
    "version": "version whose warmup records are the request data (default: the version "
               "the hosts serve; the newest in the source when none does)",
    "duration": "how long to send load, e.g. 30s (default 10s); the duration gate allows "
                "1% of it, or one request interval of --rps, whichever is more",
    "concurrency": "requests in flight (default 16)",
    "rps": "open loop at this rate (requests/s); latency from the intended send time",
    "procs": "client processes (default: the number of cores)",
    "slo_p99": "gate: P99 in ms (default: the model's latency SLO)",
    "max_error_rate": "gate: error rate in percent (default 0.01)",
    "min_qps": "gate: minimum requests/s",
    "sweep": "double the concurrency until throughput stops rising or P99 breaks the SLO",
    "report": "write the ghz-compatible JSON report here",
    "sweep_plot": "with --sweep: write the PNG of QPS, P50, P99 against concurrency",
})
def bench(c: Any, model: str, inventory: str | None = None, hosts: str | None = None,
          limit: str | None = None, version: str | None = None, duration: str = "10s",
          concurrency: str = "16", rps: str | None = None, procs: str | None = None,
          slo_p99: str | None = None, max_error_rate: str = "0.01",
          min_qps: str | None = None, sweep: bool = False, report: str | None = None,
          sweep_plot: str | None = None) -> None:
    """Load-test the model on the inventory's hosts (their stable gRPC ports), with SLO gates."""
    _main("bench", locals())


@command(help={
    "model": SELECT["model"], "inventory": INVENTORY,
    "host": "the host to measure on, one of the model's (default: its first)",
    "budget": "time the search may take, e.g. 10m (default 10m); the catalog's configuration "
              "is always measured",
    "step": "each rate step's measured window, e.g. 5s (default 5s)",
    "out": "directory for tune.json and tune.png (default: tune-MODEL/)",
    "write": "write the recommended Batching(...)/Threads(...) as Python to this file",
})
def tune(c: Any, model: str, inventory: str | None = None, host: str | None = None,
         budget: str = "10m", step: str = "5s", out: str | None = None,
         write: str | None = None) -> None:
    """Measure batching and thread configurations on one host, beside what serves."""
    _main("tune", locals())


@command(help={
    **SELECT,
    "for_": "how long to read each live instance's metrics, e.g. 60s (default 60s); "
            "the instance must take traffic meanwhile",
    "json": "print the findings as JSON",
})
def diagnose(c: Any, model: str, inventory: str | None = None, hosts: str | None = None,
             limit: str | None = None, for_: str = "60s", json: bool = False) -> None:
    """Name the stage that limits each live instance (gRPC threads, batching, pools, CPUs)."""
    _main("diagnose", locals())


@command(help={
    "target_qps": "the QPS the fleet must carry (required)",
    "sweep_report": "per-instance figure from a `bench --sweep` report (best point under SLO)",
    "tune_report": "or the recommended trial's QPS at the SLO from a `fab tune` tune.json",
    "per_instance_qps": "or give the per-instance QPS at the SLO directly",
    "load_factor": "share of capacity used at peak (default 0.65)",
    "availability_factor": "share left after a rolling release or a lost instance (0.9)",
    "instances_per_host": "server instances per host (one per GPU: its GPU count; default 1)",
    "json": "print JSON",
})
def plan_capacity(c: Any, target_qps: str, sweep_report: str | None = None,
                  tune_report: str | None = None, per_instance_qps: str | None = None,
                  load_factor: str = "0.65",
                  availability_factor: str = "0.9", instances_per_host: str = "1",
                  json: bool = False) -> None:
    """Instances needed: target QPS / (per-instance QPS x load factor x availability)."""
    _main("plan_capacity", locals())


@command(help={"model": "model whose fleet lock to show (required)", "inventory": INVENTORY,
            "break_": "remove the lock whoever holds it (only when no deploy runs)"})
def lock(c: Any, model: str, inventory: str | None = None, break_: bool = False) -> None:
    """Show the deploy lock of a model's fleet, or break a stale one with --break."""
    _main("lock", locals())


@command(help={**SELECT, "lines": "lines per container from the end of its log (default 50)",
            "follow": "keep printing new lines of every serving container (both slots of a "
                      "canary, every instance) as they come; Ctrl-C to stop",
            "since": "only lines since this time: a span back from now (30s, 10m, 2h, "
                     "1h30m, 1d) or an RFC 3339 time (2026-11-30T23:28:00Z)"})
def logs(c: Any, model: str, inventory: str | None = None, hosts: str | None = None,
         limit: str | None = None, lines: str = "50", follow: bool = False,
         since: str | None = None) -> None:
    """The serving containers' logs from every selected host, merged in time order.

    Both slots of a canary and every instance; each line prefixed host[/instance][/slot]."""
    _main("logs", locals())


@command(name="exec", help={**SELECT, "force": "run even while a deploy holds the model's lock "
                                              "(a paused canary does not refuse it)"})
def exec_(c: Any, model: str, inventory: str | None = None, hosts: str | None = None,
          limit: str | None = None, force: bool = False) -> None:
    """Run `-- CMD ...` in each selected host's serving containers and summarize the exit codes.

    Both slots of a canary, each labelled host[/instance][/slot] with its share of the
    requests."""
    _main("exec", {**locals(), "argv": _after_dashes()})


def _after_dashes() -> list[str]:
    return sys.argv[sys.argv.index("--") + 1:] if "--" in sys.argv else []


@command(help={**SELECT, "check": "list what would be removed; touch nothing",
            "playbook": "playbook file (default: playbooks/prune.yml)",
            "lock_wait": "seconds to wait for another run's lock before exiting 4 (default 0)",
            **UNATTENDED})
def prune(c: Any, model: str, inventory: str | None = None, hosts: str | None = None,
          limit: str | None = None, check: bool = False, playbook: str | None = None,
          lock_wait: str = "0", json: bool = False, log_file: str | None = None,
          json_file: str | None = None, metrics_file: str | None = None) -> None:
    """Free the hosts' disk: old releases, versions and images no retained release needs."""
    _main("prune", locals())


@command(help={**SELECT, "hosts": "hosts, groups or globs to take the model off (default: every "
                                  "inventory host; those that hold nothing of it are absent)",
               "check": "list what would be removed; touch nothing",
               "playbook": "playbook file (default: playbooks/retire.yml)",
               "lock_wait": "seconds to wait for another run's lock before exiting 4 "
                            "(default 0)",
               **UNATTENDED})
def retire(c: Any, model: str, inventory: str | None = None, hosts: str | None = None,
           limit: str | None = None, check: bool = False, playbook: str | None = None,
           lock_wait: str = "0", json: bool = False, log_file: str | None = None,
           json_file: str | None = None, metrics_file: str | None = None) -> None:
    """Take a model off hosts: out of rotation, drained, containers, proxy and files removed.

    The audit log stays, with the retirement in it; other models are untouched."""
    _main("retire", locals())


@command(help={
    "model": "model name from the inventory's catalog (required)",
    "inventory": INVENTORY,
    "target_qps": "open-loop rate the fleet must sustain, in all (default 100)",
    "duration": "how long, e.g. 60s, 5m (default 5m)",
    "release": "deploy this version in the middle of the window (fab deploy --version)",
    "release_at": "when the release starts: seconds (20s) or share of the window (default 25%)",
    "loadgens": "inventory hosts or group running the generators (default: this machine)",
    "interval": "P99 must hold in every interval of this length (default 1s)",
    "slo_p99_ms": "P99 limit in ms (default: the model's latency_slo_ms in the catalog)",
    "max_error_rate": "error-rate limit in percent (default 0.01)",
    "data_version": "version whose warmup records are the requests (default: the newest)",
    "start_margin": "time given to the generators to start before the common start (15s)",
    "timeout": "deadline per request (default 10s)",
    "concurrency": "requests in flight per generator (default: from its rate and the SLO)",
    "procs": "processes per generator (default: one per 2000 QPS of its share, per core)",
    "out": "directory for accept.json, accept.png, deploy.log (default out/accept/<run>)",
})
def accept(c: Any, model: str, inventory: str | None = None, target_qps: str | None = None,
           duration: str = "5m", release: str | None = None, release_at: str | None = None,
           loadgens: str | None = None, interval: str = "1s", slo_p99_ms: str | None = None,
           max_error_rate: str | None = None, data_version: str | None = None,
           start_margin: str | None = None, timeout: str | None = None,
           concurrency: str | None = None, procs: str | None = None,
           out: str | None = None) -> None:
    """The fleet acceptance run: the acceptance table against the model's stable ports."""
    _main("accept", locals())


ns = Collection(render, hosts, deploy, rollback, status, history, guard, bench, plan_capacity,
                lock, logs, exec_, prune, retire, accept, promote, abort, publish, stage,
                observe, gateway, tune, diagnose)
