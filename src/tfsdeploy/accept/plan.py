"""What an acceptance run does, decided before the first connection (pure).

Every threshold carries its source (an option or the inventory's catalog), so the report can
say where each number came from. Problems are collected and raised together as a ConfigError
(exit 1, nothing touched).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from tfsdeploy.accept.options import AcceptOptions
from tfsdeploy.core.errors import ConfigError, Problem, shown
from tfsdeploy.core.inventory.catalog import Model
from tfsdeploy.core.inventory.fleet import ResolvedHost
from tfsdeploy.core.inventory.layout import host_port, model_ports
from tfsdeploy.core.inventory.load import Inventory
from tfsdeploy.core.inventory.versions import available_versions

DEFAULT_TARGET_QPS = 100.0
DEFAULT_MAX_ERROR_RATE_PCT = 0.01  # below 0.01% of requests fail
DEFAULT_RELEASE_AT = 0.25  # share of the window before the deploy starts
DEFAULT_START_MARGIN_S = 15.0
DEFAULT_TIMEOUT_S = 10.0
MAX_DURATION_S = 86_400.0  # --duration, --interval, --start-margin, --timeout, --release-at
PROC_QPS = 2000.0  # requests/s one generator process is given (it tops out near 9k, bare)
LATENCY_ROOM = 4.0  # workers for 4x the SLO of queueing before a request waits for one
MIN_WORKERS = 16
WARMUP_PER_TARGET = 5
LOCAL = "local"  # the generator on this machine, when no --loadgens group is given

_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h)?\s*$")
_UNITS = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


@dataclass(frozen=True)
class Threshold:
    """A limit of the table and where it came from."""

    value: float
    source: str


@dataclass(frozen=True)
class GeneratorSpec:
    """One load generator: its host (None: this machine) and its share of the rate."""

    name: str
    host: ResolvedHost | None
    share_qps: float


@dataclass(frozen=True)
class ReleasePlan:
    """A ``fab deploy --version`` started ``at_s`` seconds into the window."""

    version: int
    at_s: float


@dataclass(frozen=True)
class AcceptPlan:
    """A validated acceptance run."""

    model: Model
    inventory_path: str
    targets: tuple[str, ...]
    generators: tuple[GeneratorSpec, ...]
    target_qps: Threshold
    duration_s: float
    interval_s: int
    slo_p99_ms: Threshold
    max_error_rate_pct: Threshold
    release: ReleasePlan | None
    data_version: int
    start_margin_s: float
    timeout_s: float
    concurrency: int | None
    procs: int | None

    @property
    def remote(self) -> bool:
        """Whether any generator runs on another host."""
        return any(g.host is not None for g in self.generators)


def parse_seconds(text: str | float, option: str) -> float:
    """``90``, ``90s``, ``500ms``, ``5m``, ``1h`` to seconds; ConfigError naming the option."""
    match = _DURATION.match(str(text))
    if not match:
        raise ConfigError(Problem(f"{option} {text!r} is not a duration",
                                  fix=f"write it like 60s, 5m or 500ms ({option} 5m)",
                                  field=option))
    seconds = float(match.group(1)) * _UNITS[match.group(2) or "s"]
    if not seconds <= MAX_DURATION_S:  # inf (400 digits) too
        raise ConfigError(Problem(f"{option} {shown(text)} is longer than a day "
                                  f"({MAX_DURATION_S:g} s), the longest taken",
                                  fix=f"write it like 60s, 5m or 500ms ({option} 5m)",
                                  field=option))
    return seconds


def _release_at(text: str | None, duration_s: float, problems: list[Problem]) -> float:
    if text is None:
        return DEFAULT_RELEASE_AT * duration_s
    raw = str(text).strip()
    try:
        at = (float(raw[:-1]) / 100 * duration_s if raw.endswith("%")
              else parse_seconds(raw, "--release-at"))
    except (ValueError, ConfigError):
        problems.append(Problem(f"--release-at {text!r} is neither a duration nor a share",
                                fix="write 20s, 1m or 25% (of --duration)",
                                field="--release-at"))
        return 0.0
    if not 0 <= at < duration_s:
        problems.append(Problem(f"--release-at {text!r} is {at:g} s, outside the {duration_s:g} s "
                                "window", fix="start the release inside the window, e.g. 25%",
                                field="--release-at"))
    return at


def _version(text: str | int | None, option: str, model: Model,
             problems: list[Problem]) -> int | None:
    """A version present in the model's source (None when not asked for)."""
    if text is None:
        return None
    offered = available_versions(model.source)
    try:
        version = int(text)
    except (TypeError, ValueError):
        version = -1
    if version not in offered:
        problems.append(Problem(
            f"{option} {text!r}: no such version in the source {model.source!r} "
            f"(offered: {', '.join(map(str, offered)) or 'none'})",
            fix=f"pick one of the offered versions, or add the version under {model.source}",
            field=option))
        return None
    return version


def _data_version(options: AcceptOptions, model: Model, problems: list[Problem]) -> int:
    """Whose warmup records are the request data: asked for, else the newest version."""
    chosen = _version(options.data_version, "--data-version", model, problems)
    if chosen is not None:
        return chosen
    offered = available_versions(model.source)
    if not offered and options.data_version is None:
        problems.append(Problem(
            f"model {model.name!r}: no version in its source {model.source!r} to take the "
            "request data from", fix="put SavedModel versions (with warmup records) under the "
            "source (testbed: scripts/make-models)", field=f"models.{model.name}.source"))
    return offered[-1] if offered else 0


def _generators(inventory: Inventory, loadgens: str | None, qps: float
                ) -> tuple[GeneratorSpec, ...]:
    if not loadgens:
        return (GeneratorSpec(LOCAL, None, qps),)
    hosts = inventory.match(loadgens, "--loadgens")
    if not hosts:
        raise ConfigError(Problem(f"--loadgens {loadgens!r} names no host",
                                  fix="name an inventory group or hosts (see `fab hosts`)",
                                  field="--loadgens", file=inventory.path))
    return tuple(GeneratorSpec(h.name, h, qps / len(hosts)) for h in hosts)


def _positive(value: float | None, option: str, problems: list[Problem]) -> None:
    if value is not None and not (value > 0 and math.isfinite(value)):
        problems.append(Problem(f"{option} {value!r} must be a positive number",
                                fix=f"pass {option} with a value above 0", field=option))


def _thresholds(options: AcceptOptions, model: Model, inventory: Inventory,
                problems: list[Problem]) -> tuple[Threshold, Threshold, Threshold]:
    qps = Threshold(options.target_qps, "--target-qps") if options.target_qps is not None \
        else Threshold(DEFAULT_TARGET_QPS, f"default {DEFAULT_TARGET_QPS:g} (--target-qps "
                       "not given)")
    slo = Threshold(options.slo_p99_ms, "--slo-p99-ms") if options.slo_p99_ms is not None \
        else Threshold(model.latency_slo_ms, f"catalog: models[{model.name!r}].latency_slo_ms "
                       f"in {inventory.path}")
    errors = Threshold(options.max_error_rate_pct, "--max-error-rate") \
        if options.max_error_rate_pct is not None \
        else Threshold(DEFAULT_MAX_ERROR_RATE_PCT, "the acceptance default (0.01%)")
    _positive(qps.value, "--target-qps", problems)
    _positive(slo.value, "--slo-p99-ms", problems)
    if not 0 <= errors.value <= 100:
        problems.append(Problem(f"--max-error-rate {errors.value!r} is not a percentage",
                                fix="pass a percentage between 0 and 100, e.g. 0.01",
                                field="--max-error-rate"))
    return qps, slo, errors


def _interval(text: str, duration_s: float, problems: list[Problem]) -> int:
    seconds = parse_seconds(text, "--interval")
    if seconds < 1 or seconds != int(seconds) or seconds > max(duration_s, 1):
        problems.append(Problem(f"--interval {text!r}: must be whole seconds, from 1 s to the "
                                "duration", fix="pass --interval 1s (or 5s, 10s...)",
                                field="--interval"))
        return 1
    return int(seconds)


def build_plan(options: AcceptOptions, inventory: Inventory) -> AcceptPlan:
    """Check every option against the inventory; raise one ConfigError listing all problems."""
    model = inventory.model(options.model)
    problems: list[Problem] = []
    duration = parse_seconds(options.duration, "--duration")
    if duration < 1:
        problems.append(Problem(f"--duration {options.duration!r} is under a second",
                                fix="pass --duration 60s or longer (the default is 5m)",
                                field="--duration"))
    qps, slo, errors = _thresholds(options, model, inventory, problems)
    release_version = _version(options.release, "--release", model, problems)
    release = None
    if options.release is not None:
        at = _release_at(options.release_at, duration, problems)
        release = ReleasePlan(release_version or 0, at)
    plan = AcceptPlan(
        model=model, inventory_path=inventory.path,
        targets=tuple(host_port(h.address, model_ports(h, model).grpc)
                      for h in inventory.select(model=model)),
        generators=_generators(inventory, options.loadgens, qps.value),
        target_qps=qps, duration_s=duration,
        interval_s=_interval(options.interval, duration, problems), slo_p99_ms=slo,
        max_error_rate_pct=errors, release=release,
        data_version=_data_version(options, model, problems),
        start_margin_s=parse_seconds(options.start_margin or DEFAULT_START_MARGIN_S,
                                     "--start-margin"),
        timeout_s=parse_seconds(options.timeout or DEFAULT_TIMEOUT_S, "--timeout"),
        concurrency=options.concurrency, procs=options.procs)
    for value, option in ((options.concurrency, "--concurrency"), (options.procs, "--procs")):
        if value is not None and value < 1:
            problems.append(Problem(f"{option} {value} must be at least 1",
                                    fix=f"pass {option} 1 or more, or leave it out",
                                    field=option))
    if problems:
        raise ConfigError(problems)
    return plan


# -- per generator ------------------------------------------------------------------------------

def generator_procs(share_qps: float, cores: int, asked: int | None) -> int:
    """Processes of one generator: asked for, else one per ``PROC_QPS`` of its share, at most
    one per core (a Python process uses one core at most)."""
    if asked is not None:
        return asked
    return max(1, min(cores, math.ceil(share_qps / PROC_QPS)))


def generator_workers(share_qps: float, slo_ms: float, asked: int | None, floor: int) -> int:
    """Requests one generator may have in flight: asked for, else enough for its rate at 4x
    the SLO (Little's law), at least ``MIN_WORKERS`` and at least ``floor`` (its
    connections)."""
    if asked is not None:
        return max(asked, floor)
    return max(MIN_WORKERS, floor, math.ceil(share_qps * LATENCY_ROOM * slo_ms / 1000))


def requests_file_note(model: Model, version: int) -> str:
    """Where the request data comes from, for the report."""
    return str(Path(model.source) / str(version) / "assets.extra" / "tf_serving_warmup_requests")
