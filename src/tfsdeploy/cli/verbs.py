"""Every command's options, declared once: one frozen dataclass per command, each field an
option with its type, default, help, the value `--help` names and, for a number, its bounds.

Everything else is derived from these classes: tasks.py makes each Fabric task from its
class (the signature invoke parses, the help), ``cli.options`` types the text a task received
into an instance (bounds and formats checked, every bad option named at once), ``cli.main``
runs the command with that instance, and the docs check compares docs/commands.md with them.

A default that a run's policy object also holds (``GuardPolicy``, ``TuneOptions``,
``AcceptOptions``) is taken from that object, so it is written in one place.

Light on purpose: `fab --list` imports this module (dataclasses, and those three light
modules; pydantic is imported when an option is checked).
"""

from __future__ import annotations

from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any, ClassVar

from tfsdeploy.accept.options import AcceptOptions
from tfsdeploy.core.observe.guard import GuardPolicy
from tfsdeploy.core.timetext import duration_text
from tfsdeploy.core.tuning.options import TuneOptions

# the policies whose defaults these options are (declared there once; the runs take them from
# the same objects)
GUARD = GuardPolicy()
TUNE = TuneOptions()
ACCEPT = AcceptOptions(model="")

ONE_DAY_S = 86_400.0
ONE_WEEK_S = 7 * ONE_DAY_S
MILLION = 1_000_000


@dataclass(frozen=True)
class Bound:
    """The range of a numeric option: ``low`` (excluded when ``above``) to ``high``, both
    finite; ``whole`` for a count."""

    low: float
    high: float
    above: bool = False  # low itself is refused (a rate or an interval of 0 means nothing)
    whole: bool = False

    def kind(self) -> Any:
        """The pydantic type that checks it (its errors name the bounds as written here)."""
        from typing import Annotated

        from pydantic import Field as Limit

        low, high = exact(self.low), exact(self.high)
        at_least = Limit(gt=low) if self.above else Limit(ge=low)
        if self.whole:
            return Annotated[int, at_least, Limit(le=high)]
        return Annotated[float, at_least, Limit(le=high, allow_inf_nan=False)]


def exact(number: float) -> float | int:
    """``number`` as an int when it is whole (a bound reads 86400, not 86400.0)."""
    return int(number) if float(number).is_integer() else number


@dataclass(frozen=True)
class Meta:
    """What an option is, beside its type and default."""

    help: str
    value: str = ""  # what `--help` shows after the flag: --lock-wait=SECONDS
    bound: Bound | None = None  # a number's range
    check: str = ""  # a text's format, by name (cli.options.CHECKS)
    repeat: bool = False  # given several times (--notify URL --notify URL)
    hidden: bool = False  # not an option of the task (exec's command after --)


def option(help: str, *, value: str = "", default: Any = None, bound: Bound | None = None,
           check: str = "", repeat: bool = False) -> Any:
    """An option with its default."""
    return field(default=default, metadata={"option": Meta(help, value, bound, check, repeat)})


def required(help: str, *, value: str, bound: Bound | None = None) -> Any:
    """An option the command cannot run without (its absence is named, exit 1)."""
    return field(metadata={"option": Meta(help, value, bound)})


def meta(one: Field[Any]) -> Meta:
    """The declaration of one option."""
    found: Meta = one.metadata["option"]
    return found


# where an option stands in a command's list: what it acts on, its own options, the runbook's,
# then what it leaves for scripts
_PLACE = {"model": 0, "inventory": 0, "hosts": 0, "limit": 0, "hooks": 2, "notify": 2,
          "json": 3, "log_file": 3, "json_file": 3, "metrics_file": 3}


def declared(args: type[Args]) -> list[Field[Any]]:
    """The options of a command, in the order its task declares them."""
    return sorted((f for f in fields(args) if not meta(f).hidden),
                  key=lambda f: _PLACE.get(f.name, 1))


def is_required(one: Field[Any]) -> bool:
    """Whether the option has no default."""
    return one.default is MISSING and one.default_factory is MISSING


@dataclass(frozen=True, kw_only=True)
class Args:
    """A command's options, typed."""

    command: ClassVar[str]  # the task's name (`fab deploy`)
    summary: ClassVar[str]  # the task's help: its first line is what `fab --list` shows


INVENTORY = "inventory file (default: $TFSDEPLOY_INVENTORY or inventory/testbed.py)"
LOCK_WAIT = "seconds to wait for another run's lock before exiting 4 (default 0)"
MAX_PULLS = "hosts with model_transfer 'pull' that pull the version at once (default 8)"


@dataclass(frozen=True, kw_only=True)
class Selected(Args):
    """A model and the hosts a command acts on."""

    model: str = required("model name from the inventory's catalog (required)", value="MODEL")
    inventory: str | None = option(INVENTORY, value="FILE")
    hosts: str | None = option("hosts, groups or globs, comma-separated (default: the model's "
                               "hosts)", value="HOSTS")
    limit: str | None = option("further narrow the hosts to these hosts, groups or globs",
                               value="HOSTS")


@dataclass(frozen=True, kw_only=True)
class Unattended(Args):
    """What a run leaves for scripts and cron."""

    json: bool = option("print the result as JSON on stdout (progress goes to stderr)",
                        default=False)
    log_file: str | None = option("also append the progress lines, time-stamped, to this file",
                                  value="FILE", check="output_file")
    json_file: str | None = option("write the JSON result to this file (atomically)",
                                   value="FILE", check="output_file")
    metrics_file: str | None = option("update this Prometheus textfile (node_exporter textfile "
                                      "collector)", value="FILE", check="output_file")


@dataclass(frozen=True, kw_only=True)
class Runbook(Args):
    """Hooks and notifications around a run."""

    hooks: str | None = option("hooks directory (default: hooks/ beside the inventory); see "
                               "docs/hooks.md", value="DIR")
    notify: tuple[str, ...] = option("POST a JSON event to this URL at each step of the run; "
                                     "repeat --notify for several URLs", value="URL",
                                     default=(), check="notify", repeat=True)


LOCK_WAIT_BOUND = Bound(0, ONE_DAY_S)


@dataclass(frozen=True, kw_only=True)
class PublishArgs(Selected):
    command: ClassVar[str] = "publish"
    summary: ClassVar[str] = ("Pack a model version once and push it to the hosts' "
                              "model_registry as an image.")
    version: str | None = option("model version to publish (default: the newest in the "
                                 "model's source)", value="VERSION")
    json: bool = option("print the result as JSON", default=False)


@dataclass(frozen=True, kw_only=True)
class StageArgs(Selected, Unattended):
    command: ClassVar[str] = "stage"
    summary: ClassVar[str] = ("Stage a model version on every host ahead of a release; "
                              "nothing serving changes.")
    version: str | None = option("model version to stage (default: the newest in the "
                                 "model's source)", value="VERSION")
    playbook: str | None = option("playbook file (default: playbooks/stage.yml)", value="FILE")
    lock_wait: float = option(LOCK_WAIT, value="SECONDS", default=0.0, bound=LOCK_WAIT_BOUND)
    max_pulls: int | None = option(MAX_PULLS, value="N", bound=Bound(1, 10_000, whole=True))


@dataclass(frozen=True, kw_only=True)
class RenderArgs(Selected):
    command: ClassVar[str] = "render"
    summary: ClassVar[str] = ("Render and validate the files each host would receive; "
                              "touches no host.")
    version: str | None = option("model version to render (default: the newest in the "
                                 "model's source)", value="VERSION")
    out: str = option("output directory; one folder per host (default: render/)", value="DIR",
                      default="render", check="output_dir")


@dataclass(frozen=True, kw_only=True)
class ObserveArgs(Args):
    command: ClassVar[str] = "observe"
    summary: ClassVar[str] = ("Write Prometheus' scrape config, rules and alerts and Grafana "
                              "dashboards for the fleet.\n\nFrom the inventory and the "
                              "catalog; with --targets, also the serving processes' targets.")
    model: str | None = option("only this model (default: every model of the catalog)",
                               value="MODEL")
    inventory: str | None = option(INVENTORY, value="FILE")
    out: str = option("output directory (default: observe/)", value="DIR", default="observe",
                      check="output_dir")
    targets: bool = option("also read each model's hosts and write its file_sd targets (where "
                           "the inventory's monitoring names, else DIR/prometheus/targets/)",
                           default=False)


@dataclass(frozen=True, kw_only=True)
class GatewayArgs(Args):
    command: ClassVar[str] = "gateway"
    summary: ClassVar[str] = ("Render the gateway hosts' HAProxy from the inventory and roll "
                              "it host by host.")
    inventory: str | None = option(INVENTORY, value="FILE")
    check: bool = option("show per gateway host whether its configuration would change; touch "
                         "nothing", default=False)
    diff: bool = option("show the diff of every gateway host's files against what is live "
                        "(implies --check)", default=False)


@dataclass(frozen=True, kw_only=True)
class HostsArgs(Args):
    command: ClassVar[str] = "hosts"
    summary: ClassVar[str] = "List the inventory's hosts with their groups, GPUs and models."
    inventory: str | None = option(INVENTORY, value="FILE")
    hosts: str | None = option("hosts, groups or globs, comma-separated", value="HOSTS")
    limit: str | None = option("further narrow the hosts", value="HOSTS")


@dataclass(frozen=True, kw_only=True)
class DeployArgs(Selected, Runbook, Unattended):
    command: ClassVar[str] = "deploy"
    summary: ClassVar[str] = ("Roll a model release host by host in a dual-version window, "
                              "gated on health.")
    version: str | None = option("model version to deploy (default: the newest in the "
                                 "model's source)", value="VERSION")
    playbook: str | None = option("playbook file (default: playbooks/deploy.yml)",
                                  value="FILE")
    lock_wait: float = option("seconds to wait for another deploy's lock before exiting 4 "
                              "(default 0)", value="SECONDS", default=0.0,
                              bound=LOCK_WAIT_BOUND)
    check: bool = option("show every host's plan: the steps and the changes a deploy would "
                         "make; touch nothing", default=False)
    diff: bool = option("with --check: also diff every file against what is live",
                        default=False)
    canary_weights: str | None = option("weighted steps on the first batch, percent of "
                                        "requests to the new release, e.g. 5,25,50 (default: "
                                        "the model's Rollout(canary=...))", value="PERCENTS",
                                        check="canary_weights")
    step_s: float | None = option("seconds each canary step is held and judged (default: the "
                                  "policy's, 60)", value="SECONDS",
                                  bound=Bound(0, ONE_DAY_S, above=True))
    pause: bool = option("after the last canary step, stop holding the canary (exit 6): fab "
                         "promote or fab abort finish it", default=False)
    max_pulls: int | None = option(MAX_PULLS, value="N", bound=Bound(1, 10_000, whole=True))


@dataclass(frozen=True, kw_only=True)
class RollbackArgs(Selected, Runbook, Unattended):
    command: ClassVar[str] = "rollback"
    summary: ClassVar[str] = ("Return hosts to a retained release: a gated switch back within "
                              "the window.")
    to: str | None = option("release id to return to (default: the newest release good on "
                            "every host)", value="RELEASE", check="release_id")
    playbook: str | None = option("playbook file (default: playbooks/rollback.yml)",
                                  value="FILE")
    lock_wait: float = option("seconds to wait for another deploy's lock before exiting 4 "
                              "(default 0)", value="SECONDS", default=0.0,
                              bound=LOCK_WAIT_BOUND)


@dataclass(frozen=True, kw_only=True)
class CanaryArgs(Selected, Runbook, Unattended):
    lock_wait: float = option(LOCK_WAIT, value="SECONDS", default=0.0, bound=LOCK_WAIT_BOUND)


@dataclass(frozen=True, kw_only=True)
class PromoteArgs(CanaryArgs):
    command: ClassVar[str] = "promote"
    summary: ClassVar[str] = ("Finish a paused canary: its hosts switch fully, the other hosts "
                              "roll in their batches.")


@dataclass(frozen=True, kw_only=True)
class AbortArgs(CanaryArgs):
    command: ClassVar[str] = "abort"
    summary: ClassVar[str] = ("Return a paused canary's hosts to their old release at 100% "
                              "and free the lock.")


@dataclass(frozen=True, kw_only=True)
class StatusArgs(Selected):
    command: ClassVar[str] = "status"
    summary: ClassVar[str] = ("Per host: live release, slots, traffic, version states, drift "
                              "and the lock.\n\nDuring a canary the traffic is each slot's "
                              "share of the requests.")
    json: bool = option("print JSON instead of a table", default=False)


@dataclass(frozen=True, kw_only=True)
class HistoryArgs(Selected):
    command: ClassVar[str] = "history"
    summary: ClassVar[str] = "Releases per host with results and durations, and the audit log."
    json: bool = option("print JSON instead of tables", default=False)


@dataclass(frozen=True, kw_only=True)
class GuardArgs(Selected, Runbook, Unattended):
    command: ClassVar[str] = "guard"
    summary: ClassVar[str] = ("Watch TFServing's metrics and roll back automatically when the "
                              "SLO breaks.\n\nA paused canary that fails against its old "
                              "release is aborted instead.")
    max_error_rate: float = option(
        f"act above this rate of server errors (default {GUARD.max_error_rate:g} = "
        f"{GUARD.max_error_rate:.0%})", value="RATE", default=GUARD.max_error_rate,
        bound=Bound(0, 1))
    slo_p99_ms: float | None = option("act above this P99 in ms (default: the model's latency "
                                      "SLO)", value="MS", bound=Bound(0, 3_600_000, above=True))
    for_s: float = option(f"only after the breach lasted this long (default {GUARD.for_s:g} s)",
                          value="SECONDS", default=GUARD.for_s, bound=Bound(0, ONE_DAY_S))
    interval_s: float = option(f"seconds between metric reads (default {GUARD.interval_s:g})",
                               value="SECONDS", default=GUARD.interval_s, bound=Bound(0.1, 3600))
    duration_s: float | None = option("stop watching after this long (default: until a "
                                      "rollback)", value="SECONDS",
                                      bound=Bound(0, ONE_WEEK_S, above=True))
    min_requests: int = option(f"ignore windows with fewer requests (default "
                               f"{GUARD.min_requests})", value="N", default=GUARD.min_requests,
                               bound=Bound(1, 1_000_000_000, whole=True))
    count_client_errors: bool = option("count client errors (malformed requests) too; by "
                                       "default only the server's errors count",
                                       default=GUARD.count_client_errors)
    lock_wait: float = option("seconds its rollback or abort waits for another run's lock "
                              f"(default {GUARD.lock_wait:g})", value="SECONDS",
                              default=GUARD.lock_wait, bound=LOCK_WAIT_BOUND)


SLO_MS = Bound(0, 3_600_000, above=True)
RATE = Bound(0, 10 * MILLION, above=True)


@dataclass(frozen=True, kw_only=True)
class BenchArgs(Selected):
    command: ClassVar[str] = "bench"
    summary: ClassVar[str] = ("Load-test the model on the inventory's hosts (their stable gRPC "
                              "ports), with SLO gates.")
    version: str | None = option("version whose warmup records are the request data (default: "
                                 "the version the hosts serve; the newest in the source when "
                                 "none does)", value="VERSION")
    duration: str = option("how long to send load, e.g. 30s (default 10s); the duration gate "
                           "allows 1% of it, or one request interval of --rps, whichever is "
                           "more", value="DURATION", default="10s", check="duration")
    concurrency: int = option("requests in flight (default 16)", value="N", default=16,
                              bound=Bound(1, 100_000, whole=True))
    rps: float | None = option("open loop at this rate (requests/s); latency from the intended "
                               "send time", value="RPS", bound=RATE)
    procs: int | None = option("client processes (default: the number of cores)", value="N",
                               bound=Bound(1, 1024, whole=True))
    slo_p99: float | None = option("gate: P99 in ms (default: the model's latency SLO)",
                                   value="MS", bound=SLO_MS)
    max_error_rate: float = option("gate: error rate in percent (default 0.01)", value="RATE",
                                   default=0.01, bound=Bound(0, 100))
    min_qps: float | None = option("gate: minimum requests/s", value="QPS", bound=RATE)
    sweep: bool = option("double the concurrency until throughput stops rising or P99 breaks "
                         "the SLO", default=False)
    report: str | None = option("write the ghz-compatible JSON report here", value="FILE",
                                check="output_file")
    sweep_plot: str | None = option("with --sweep: write the PNG of QPS, P50, P99 against "
                                    "concurrency", value="FILE", check="output_file")


@dataclass(frozen=True, kw_only=True)
class TuneArgs(Args):
    command: ClassVar[str] = "tune"
    summary: ClassVar[str] = ("Measure batching and thread configurations on one host, beside "
                              "what serves.")
    model: str = required("model name from the inventory's catalog (required)", value="MODEL")
    inventory: str | None = option(INVENTORY, value="FILE")
    host: str | None = option("the host to measure on, one of the model's (default: its "
                              "first)", value="HOST")
    budget: str = option("time the search may take, e.g. 10m (default "
                         f"{duration_text(TUNE.budget_s)}); the catalog's configuration is "
                         "always measured", value="DURATION",
                         default=duration_text(TUNE.budget_s), check="duration")
    step: str = option("each rate step's measured window, e.g. 5s (default "
                       f"{duration_text(TUNE.step_s)})", value="DURATION",
                       default=duration_text(TUNE.step_s), check="duration")
    trials: int | None = option("at most this many trials, the catalog's included (default: as "
                                "many as the budget holds)", value="N",
                                bound=Bound(1, 10_000, whole=True))
    out: str | None = option("directory for tune.json and tune.png (default: tune-MODEL/)",
                             value="DIR", check="output_dir")
    write: str | None = option("write the recommended Batching(...)/Threads(...) as Python to "
                               "this file", value="FILE", check="output_file")


@dataclass(frozen=True, kw_only=True)
class DiagnoseArgs(Selected):
    command: ClassVar[str] = "diagnose"
    summary: ClassVar[str] = ("Name the stage that limits each live instance (gRPC threads, "
                              "batching, pools, CPUs).")
    for_: str = option("how long to read each live instance's metrics, e.g. 60s (default "
                       "60s); the instance must take traffic meanwhile", value="DURATION",
                       default="60s", check="duration")
    json: bool = option("print the findings as JSON", default=False)


@dataclass(frozen=True, kw_only=True)
class PlanCapacityArgs(Args):
    command: ClassVar[str] = "plan-capacity"
    summary: ClassVar[str] = ("Instances needed: target QPS / (per-instance QPS x load factor "
                              "x availability).")
    target_qps: float = required("the QPS the fleet must carry (required)", value="QPS",
                                 bound=RATE)
    sweep_report: str | None = option("per-instance figure from a `bench --sweep` report (best "
                                      "point under SLO)", value="FILE", check="input_file")
    tune_report: str | None = option("or the recommended trial's QPS at the SLO from a `fab "
                                     "tune` tune.json", value="FILE", check="input_file")
    per_instance_qps: float | None = option("or give the per-instance QPS at the SLO directly",
                                            value="QPS", bound=RATE)
    load_factor: float = option("share of capacity used at peak (default 0.65)",
                                value="FRACTION", default=0.65, bound=Bound(0, 1, above=True))
    availability_factor: float = option("share left after a rolling release or a lost "
                                        "instance (0.9)", value="FRACTION", default=0.9,
                                        bound=Bound(0, 1, above=True))
    instances_per_host: int = option("server instances per host (one per GPU: its GPU count; "
                                     "default 1)", value="N", default=1,
                                     bound=Bound(1, 1024, whole=True))
    json: bool = option("print JSON", default=False)


@dataclass(frozen=True, kw_only=True)
class LockArgs(Args):
    command: ClassVar[str] = "lock"
    summary: ClassVar[str] = ("Show the deploy lock of a model's fleet, or break a stale one "
                              "with --break.")
    model: str = required("model whose fleet lock to show (required)", value="MODEL")
    inventory: str | None = option(INVENTORY, value="FILE")
    break_: bool = option("remove the lock whoever holds it (only when no deploy runs)",
                          default=False)


@dataclass(frozen=True, kw_only=True)
class LogsArgs(Selected):
    command: ClassVar[str] = "logs"
    summary: ClassVar[str] = ("The serving containers' logs from every selected host, merged "
                              "in time order.\n\nBoth slots of a canary and every instance; "
                              "each line prefixed host[/instance][/slot].")
    lines: int = option("lines per container from the end of its log (default 50)", value="N",
                        default=50, bound=Bound(1, MILLION, whole=True))
    follow: bool = option("keep printing new lines of every serving container (both slots of "
                          "a canary, every instance) as they come; Ctrl-C to stop",
                          default=False)
    since: str | None = option("only lines since this time: a span back from now (30s, 10m, "
                               "2h, 1h30m, 1d) or an RFC 3339 time (2026-11-30T23:28:00Z)",
                               value="TIME", check="since")


@dataclass(frozen=True, kw_only=True)
class ExecArgs(Selected):
    command: ClassVar[str] = "exec"
    summary: ClassVar[str] = ("Run `-- CMD ...` in each selected host's serving containers and "
                              "summarize the exit codes.\n\nBoth slots of a canary, each "
                              "labelled host[/instance][/slot] with its share of the requests.")
    force: bool = option("run even while a deploy holds the model's lock (a paused canary does "
                         "not refuse it)", default=False)
    argv: tuple[str, ...] = field(default=(), metadata={
        "option": Meta("the command after --", hidden=True)})


@dataclass(frozen=True, kw_only=True)
class PruneArgs(Selected, Unattended):
    command: ClassVar[str] = "prune"
    summary: ClassVar[str] = ("Free the hosts' disk: old releases, versions and images no "
                              "retained release needs.")
    check: bool = option("list what would be removed; touch nothing", default=False)
    playbook: str | None = option("playbook file (default: playbooks/prune.yml)", value="FILE")
    lock_wait: float = option(LOCK_WAIT, value="SECONDS", default=0.0, bound=LOCK_WAIT_BOUND)


@dataclass(frozen=True, kw_only=True)
class RetireArgs(Selected, Unattended):
    command: ClassVar[str] = "retire"
    summary: ClassVar[str] = ("Take a model off hosts: out of rotation, drained, containers, "
                              "proxy and files removed.\n\nThe audit log stays, with the "
                              "retirement in it; other models are untouched.")
    hosts: str | None = option("hosts, groups or globs to take the model off (default: every "
                               "inventory host; those that hold nothing of it are absent)",
                               value="HOSTS")
    check: bool = option("list what would be removed; touch nothing", default=False)
    playbook: str | None = option("playbook file (default: playbooks/retire.yml)",
                                  value="FILE")
    lock_wait: float = option(LOCK_WAIT, value="SECONDS", default=0.0, bound=LOCK_WAIT_BOUND)


@dataclass(frozen=True, kw_only=True)
class AcceptArgs(Args):
    command: ClassVar[str] = "accept"
    summary: ClassVar[str] = ("The fleet acceptance run: the acceptance table against the "
                              "model's stable ports.")
    model: str = required("model name from the inventory's catalog (required)", value="MODEL")
    inventory: str | None = option(INVENTORY, value="FILE")
    target_qps: float | None = option("open-loop rate the fleet must sustain, in all (default "
                                      "100)", value="QPS", bound=RATE)
    duration: str = option(f"how long, e.g. 60s, 5m (default {ACCEPT.duration})",
                           value="DURATION", default=ACCEPT.duration, check="duration")
    release: str | None = option("deploy this version in the middle of the window (fab deploy "
                                 "--version)", value="VERSION")
    release_at: str | None = option("when the release starts: seconds (20s) or share of the "
                                    "window (default 25%)", value="OFFSET")
    loadgens: str | None = option("inventory hosts or group running the generators (default: "
                                  "this machine)", value="HOSTS")
    interval: str = option("P99 must hold in every interval of this length (default "
                           f"{ACCEPT.interval})", value="DURATION", default=ACCEPT.interval)
    slo_p99_ms: float | None = option("P99 limit in ms (default: the model's latency_slo_ms in "
                                      "the catalog)", value="MS", bound=SLO_MS)
    max_error_rate: float | None = option("error-rate limit in percent (default 0.01)",
                                          value="RATE", bound=Bound(0, 100))
    data_version: str | None = option("version whose warmup records are the requests "
                                      "(default: the newest)", value="VERSION")
    start_margin: str | None = option("time given to the generators to start before the "
                                      "common start (default 15s)", value="DURATION")
    timeout: str | None = option("deadline per request (default 10s)", value="DURATION")
    concurrency: int | None = option("requests in flight per generator (default: from its rate "
                                     "and the SLO)", value="N",
                                     bound=Bound(1, 100_000, whole=True))
    procs: int | None = option("processes per generator (default: one per 2000 QPS of its "
                               "share, per core)", value="N", bound=Bound(1, 1024, whole=True))
    out: str | None = option("directory for accept.json, accept.png, deploy.log (default "
                             "out/accept/<run>)", value="DIR", check="output_dir")


VERBS: tuple[type[Args], ...] = (
    RenderArgs, HostsArgs, DeployArgs, RollbackArgs, StatusArgs, HistoryArgs, GuardArgs,
    BenchArgs, PlanCapacityArgs, LockArgs, LogsArgs, ExecArgs, PruneArgs, RetireArgs,
    AcceptArgs, PromoteArgs, AbortArgs, PublishArgs, StageArgs, ObserveArgs, GatewayArgs,
    TuneArgs, DiagnoseArgs)
"""Every command, in the order `fab --list` has always shown them."""


def verb(command: str) -> type[Args]:
    """The options of ``command`` (a task's name: `plan-capacity`, or its function's:
    `plan_capacity`)."""
    name = command.replace("_", "-")
    return next(v for v in VERBS if v.command == name)
