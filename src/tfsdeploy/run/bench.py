"""`fab bench`: the project's load generator against the selected hosts' stable gRPC ports,
with the model's warmup records as request data: those of ``--version``, else of the version
the hosts serve (the requests the live release was warmed up with), else of the newest."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tfsdeploy.core.errors import ConfigError, Problem
from tfsdeploy.core.inventory.fleet import ResolvedHost
from tfsdeploy.core.inventory.gpu import instance_gpus
from tfsdeploy.core.inventory.layout import host_port, model_ports
from tfsdeploy.core.inventory.versions import available_versions, choose_version
from tfsdeploy.core.target import Target
from tfsdeploy.hosts.facts import HostFacts
from tfsdeploy.hosts.ssh import Connection, ConnectionFactory, SshConnection
from tfsdeploy.loadtest.cli import run_bench
from tfsdeploy.run import engine, survey

PATHS = ("report", "sweep_plot")
PASSED_WHEN_GIVEN = ("rps", "procs", "min_qps", *PATHS)


def live_version(facts: HostFacts) -> int | None:
    """The version a host serves: its serving container's, or the recorded ``current``
    release's while a canary splits the requests (None: nothing is live)."""
    serving = facts.serving(0)
    if serving is not None:
        return serving.version
    record = facts.record(facts.current)
    return record.version if record else None


def pick_data_version(live: Mapping[str, int | None], available: list[int]
                      ) -> tuple[int | None, str]:
    """The version whose warmup records to send (None: none fits) and the line that says
    which and why: the version most hosts serve (the newer on a tie), when the source still
    holds it; else the newest in the source."""
    counts = Counter(v for v in live.values() if v is not None)
    newest = available[-1] if available else None
    if newest is None and not counts:
        return None, "no host reported a live release and the source holds no version"
    if not counts:
        return newest, (f"request data: warmup records of version {newest}, the newest in the "
                        "source (no host reported a live release)")
    version = max(counts, key=lambda v: (counts[v], v))
    on = ", ".join(h for h, v in live.items() if v == version)
    others = sorted({v for v in counts if v != version})
    also = f"; other hosts serve {', '.join(f'v{v}' for v in others)}" if others else ""
    if version not in available:
        return newest, (f"request data: warmup records of version {newest}, the newest in the "
                        f"source (the live version {version} is no longer in it{also})")
    return version, (f"request data: warmup records of version {version}, live on {on}"
                     f"{also} (--version V to choose)")


def data_version(target: Target, requested: Any, *,
                 connect: ConnectionFactory = SshConnection) -> tuple[int, str]:
    """``--version`` when given, else the version the selected hosts serve (see
    pick_data_version, read on the engine's look); with the line that says which."""
    model = target.model
    if requested is not None:
        version = choose_version(model, requested, target.inventory.path)
        return version, f"request data: warmup records of version {version} (--version)"

    available = available_versions(model.source)
    if not available:  # the records always come from the source: known before connecting
        raise ConfigError(Problem(
            f"model {model.name!r}: its source {model.source!r} holds no version to take "
            "warmup records from", fix="point the model's source at the directory that holds its "
            "numbered versions", file=target.inventory.path, field=f"models.{model.name}.source"))

    def look(target: Target, host: ResolvedHost, conn: Connection, facts: HostFacts
             ) -> dict[str, Any]:
        return {"version": live_version(facts)}

    rows = engine.look(target, lambda session: survey.each_host(target, look, session=session),
                       connect=connect)
    live = {r["host"]: r.get("version") for r in rows}
    found, line = pick_data_version(live, available)
    assert found is not None  # the source holds a version
    return found, line


@dataclass(frozen=True)
class Load:
    """What `fab bench` sends and how it judges it (the command's options, typed)."""

    version: str | None
    duration: str
    concurrency: int
    slo_p99: float | None
    max_error_rate: float
    sweep: bool
    rps: float | None = None
    procs: int | None = None
    min_qps: float | None = None
    report: str | None = None
    sweep_plot: str | None = None


def bench(target: Target, load: Load, *, connect: ConnectionFactory = SshConnection) -> int:
    """Run the load test with the command's options; returns its exit code."""
    model = target.model
    version, line = data_version(target, load.version, connect=connect)
    print(line, flush=True)
    addresses = [host_port(h.address, model_ports(h, model).grpc) for h in target.hosts]
    # each stable port fronts the host's instances (one per GPU): the per-instance figure
    # divides by all of them
    instances = sum(len(instance_gpus(h, model)) for h in target.hosts)
    options: dict[str, Any] = {
        "model": model.name, "data_from_warmup": Path(model.source) / str(version),
        "duration": load.duration, "concurrency": load.concurrency,
        "slo_p99": load.slo_p99 or model.latency_slo_ms,
        "max_error_rate": load.max_error_rate, "sweep": load.sweep, "instances": instances}
    for key in PASSED_WHEN_GIVEN:
        value = getattr(load, key)
        if value is not None:
            options[key] = Path(value) if key in PATHS else value
    return run_bench(addresses, **options)
