"""tfsdeploy's Fabric tasks: thin wrappers over the `tfsdeploy` package.

Run from the repository root: `fab --list`, `fab render --model resnet50`.
Every task exits with the codes documented in the README (0 ok, 1 invalid input, ...).
"""

from __future__ import annotations

import sys
from pathlib import Path

# This checkout's own package, whatever another checkout installed into the shared venv
# (an editable install points at whichever checkout ran scripts/setup last).
_SRC = str(Path(__file__).resolve().parent / "src")
if sys.path[:1] != [_SRC]:
    sys.path.insert(0, _SRC)

from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

from fabric import task  # noqa: E402
from invoke.collection import Collection  # noqa: E402
from invoke.exceptions import Exit  # noqa: E402


def _run(body: Callable[[], int], on_error: Callable[[int, str], None] | None = None) -> None:
    """Run a command body; turn toolkit errors into their exit code with a clear message.

    ``on_error`` lets unattended runs record a failure that ended the command early (invalid
    input, lock held, lock host unreachable) in their JSON and metrics files too.
    """
    from tfsdeploy.cli.output import print_error
    from tfsdeploy.errors import TfsDeployError

    try:
        code = body()
    except TfsDeployError as error:
        print_error(error)
        if on_error:
            on_error(int(error.exit_code), str(error))
        raise Exit(code=int(error.exit_code)) from None
    if code:
        raise Exit(code=code)


def _record_failure(command: str, model: str, json_file: str | None,
                    metrics_file: str | None) -> Callable[[int, str], None]:
    """An ``on_error`` that writes the unattended outputs of a run that ended early."""
    import time

    started = time.monotonic()

    def record(code: int, message: str) -> None:
        from tfsdeploy.cli.unattended import update_textfile, write_json_file
        from tfsdeploy.errors import ExitCode

        if json_file:
            write_json_file(json_file, {"command": command, "model": model, "exit_code": code,
                                        "result": ExitCode(code).name.lower(),
                                        "message": message, "hosts": {}})
        if metrics_file:
            update_textfile(metrics_file, model=model, command=command, exit_code=code,
                            seconds=time.monotonic() - started, release="", version=None)

    return record


@task(help={
    "model": "model name from the inventory's catalog (required)",
    "inventory": "inventory file (default: $TFSDEPLOY_INVENTORY or inventory/testbed.py)",
    "hosts": "hosts, groups or globs, comma-separated (default: the model's hosts)",
    "limit": "further narrow the hosts to these hosts, groups or globs",
    "version": "model version to render (default: the newest in the model's source)",
    "out": "output directory; one folder per host (default: render/)",
})
def render(c: Any, model: str, inventory: str | None = None, hosts: str | None = None,
           limit: str | None = None, version: str | None = None, out: str = "render") -> None:
    """Render and validate the files each host would receive; touches no host."""
    def body() -> int:
        from pathlib import Path

        from tfsdeploy.cli.output import print_table
        from tfsdeploy.cli.render import (
            RenderRequest,
            render_and_validate,
            summary_rows,
            write_renders,
        )

        renders = render_and_validate(RenderRequest(model=model, inventory=inventory,
                                                    hosts=hosts, limit=limit, version=version))
        written = write_renders(renders, Path(out))
        print_table(f"{model}: {len(renders)} host(s) rendered and validated into {out}/",
                    ("host", "address", "version", "GPU fraction", "files"),
                    summary_rows(renders))
        print(f"{len(written)} files written; the TFServing files parsed with TFServing's "
              "definitions; proxy/haproxy.cfg as a first deploy writes it (slot blue).")
        return 0

    _run(body)


@task(help={"inventory": "inventory file (default: $TFSDEPLOY_INVENTORY or inventory/testbed.py)",
            "hosts": "hosts, groups or globs, comma-separated",
            "limit": "further narrow the hosts"})
def hosts(c: Any, inventory: str | None = None, hosts: str | None = None,
          limit: str | None = None) -> None:
    """List the inventory's hosts with their groups, GPUs and models."""
    def body() -> int:
        from tfsdeploy.cli.output import print_table
        from tfsdeploy.inventory import load_inventory
        from tfsdeploy.render import placements

        inv = load_inventory(inventory)
        placed = placements(inv)
        rows = [(h.name, h.address, ",".join(h.groups) or "-",
                 " ".join(f"{g.index}:{g.memory_mib}MiB" for g in h.gpus) or "-",
                 ",".join(m for m, on in placed.items() if h.name in on) or "-")
                for h in inv.select(hosts, limit=limit)]
        print_table(f"{inv.path}: {len(rows)} host(s)",
                    ("host", "address", "groups", "GPUs", "models"), rows)
        return 0

    _run(body)


UNATTENDED = {
    "json": "print the result as JSON on stdout (progress goes to stderr)",
    "log_file": "also append the progress lines, time-stamped, to this file",
    "json_file": "write the JSON result to this file (atomically)",
    "metrics_file": "update this Prometheus textfile (node_exporter textfile collector)",
}
SELECT = {
    "model": "model name from the inventory's catalog (required)",
    "inventory": "inventory file (default: $TFSDEPLOY_INVENTORY or inventory/testbed.py)",
    "hosts": "hosts, groups or globs, comma-separated (default: the model's hosts)",
    "limit": "further narrow the hosts",
}


def _finish(command: str, result: Any, *, json: bool, json_file: str | None,
            metrics_file: str | None) -> int:
    """Print the summary (or JSON), write the unattended outputs, return the exit code."""
    from tfsdeploy.cli import deploy as cmd
    from tfsdeploy.cli.output import print_table
    from tfsdeploy.cli.unattended import update_textfile, write_json_file

    data = {"command": command, **result.as_dict()}
    if json:
        cmd.print_json(data)
    else:
        print_table(f"{command} {result.model} v{result.version} ({result.release_id}): "
                    f"{result.exit_code.name.lower()} in {result.seconds:.1f} s",
                    ("host", "result", "time per phase", "gates", "error"),
                    cmd.summary_rows(result))
        print(result.message)
    if json_file:
        write_json_file(json_file, data)
    if metrics_file:
        update_textfile(metrics_file, model=result.model, command=command,
                        exit_code=int(result.exit_code), seconds=result.seconds,
                        release=result.release_id, version=result.version)
    return int(result.exit_code)


def _reporter(json: bool, log_file: str | None) -> Any:
    import sys

    from tfsdeploy.cli.deploy import LineReporter

    return LineReporter(sys.stderr if json else sys.stdout, log_file)


@task(help={
    **SELECT,
    "version": "model version to deploy (default: the newest in the model's source)",
    "playbook": "playbook file (default: playbooks/deploy.yml)",
    "lock_wait": "seconds to wait for another deploy's lock before exiting 4 (default 0)",
    "check": "show the per-host plan; touch nothing",
    "diff": "with --check: also diff every file against what is live",
    **UNATTENDED,
})
def deploy(c: Any, model: str, inventory: str | None = None, hosts: str | None = None,
           limit: str | None = None, version: str | None = None, playbook: str | None = None,
           lock_wait: float = 0.0, check: bool = False, diff: bool = False,
           json: bool = False, log_file: str | None = None, json_file: str | None = None,
           metrics_file: str | None = None) -> None:
    """Roll a model release host by host in a dual-version window, gated on health."""
    def body() -> int:
        from tfsdeploy.cli import deploy as cmd
        from tfsdeploy.cli.output import print_table

        request = cmd.DeployRequest(model=model, inventory=inventory, hosts=hosts, limit=limit,
                                    version=version, playbook=playbook,
                                    lock_wait=float(lock_wait))
        if check or diff:
            rows = cmd.plan(request, diff=diff)
            if json:
                cmd.print_json(rows)
                return 0
            print_table(f"deploy --check {model}: nothing was changed",
                        ("host", "would do", "live"),
                        [(r["host"], r["action"], r["detail"]) for r in rows])
            for row in rows:
                if row["diff"]:
                    print(row["diff"])
            return 0
        result = cmd.deploy(request, reporter=_reporter(json, log_file))
        return _finish("deploy", result, json=json, json_file=json_file,
                       metrics_file=metrics_file)

    _run(body, _record_failure("deploy", model, json_file, metrics_file))


@task(help={
    **SELECT,
    "to": "release id to return to (default: the newest release good on every host)",
    "playbook": "playbook file (default: playbooks/rollback.yml)",
    "lock_wait": "seconds to wait for another deploy's lock before exiting 4 (default 0)",
    **UNATTENDED,
})
def rollback(c: Any, model: str, inventory: str | None = None, hosts: str | None = None,
             limit: str | None = None, to: str | None = None, playbook: str | None = None,
             lock_wait: float = 0.0, json: bool = False, log_file: str | None = None,
             json_file: str | None = None, metrics_file: str | None = None) -> None:
    """Return hosts to a retained release: a gated switch back within the window."""
    def body() -> int:
        from tfsdeploy.cli.rollback import RollbackRequest
        from tfsdeploy.cli.rollback import rollback as run_rollback

        result = run_rollback(RollbackRequest(model=model, inventory=inventory, hosts=hosts,
                                              limit=limit, to=to, playbook=playbook,
                                              lock_wait=float(lock_wait)),
                              reporter=_reporter(json, log_file))
        return _finish("rollback", result, json=json, json_file=json_file,
                       metrics_file=metrics_file)

    _run(body, _record_failure("rollback", model, json_file, metrics_file))


@task(help={**SELECT, "json": "print JSON instead of a table"})
def status(c: Any, model: str, inventory: str | None = None, hosts: str | None = None,
           limit: str | None = None, json: bool = False) -> None:
    """Per host: live release, slots, traffic, version states, drift and the lock."""
    def body() -> int:
        from tfsdeploy.cli.deploy import print_json
        from tfsdeploy.cli.fleet import FleetRequest
        from tfsdeploy.cli.fleet import status as fleet_status
        from tfsdeploy.cli.output import print_table

        rows = fleet_status(FleetRequest(model, inventory, hosts, limit))
        if json:
            print_json(rows)
        else:
            print_table(f"{model}: status", ("host", "release", "version", "traffic", "slots",
                                             "drift", "lock"),
                        [_status_row(r) for r in rows])
        return 0 if all(r["reachable"] for r in rows) else 3

    _run(body)


def _status_row(row: dict[str, Any]) -> tuple[str, ...]:
    if not row["reachable"]:
        return (row["host"], "UNREACHABLE", "", "", row.get("error", "")[:60], "", "")
    slots = "; ".join(
        f"{slot}: " + ", ".join(
            f"{c['release']} {'running' if c['running'] else 'stopped'}"
            + "".join(f" [{v.get('version', '?')} {v.get('state', v.get('error'))}]"
                      for v in c["versions"])
            for c in containers)
        for slot, containers in row["slots"].items() if containers)
    return (row["host"], str(row["current"] or "-"), str(row["version"] or "-"),
            str(row["traffic_slot"] or "-"), slots or "-", ", ".join(row["drift"]) or "none",
            row["lock"] or "free")


@task(help={**SELECT, "json": "print JSON instead of tables"})
def history(c: Any, model: str, inventory: str | None = None, hosts: str | None = None,
            limit: str | None = None, json: bool = False) -> None:
    """Releases per host with results and durations, and the audit log."""
    def body() -> int:
        from tfsdeploy.cli.deploy import print_json
        from tfsdeploy.cli.fleet import FleetRequest
        from tfsdeploy.cli.fleet import history as fleet_history
        from tfsdeploy.cli.output import print_table

        rows = fleet_history(FleetRequest(model, inventory, hosts, limit))
        if json:
            print_json(rows)
            return 0
        for row in rows:
            if not row["reachable"]:
                print(f"{row['host']}: UNREACHABLE ({row['error']})")
                continue
            print_table(f"{row['host']}: releases of {model}",
                        ("release", "version", "status", "slot", "by", "at", "seconds", "gates"),
                        [(r["id"], str(r["version"]), str(r["status"]), str(r["slot"]),
                          str(r["by"]), str(r["at"]), str(r["seconds"]),
                          " ".join(f"{g} {s:.1f}s" for g, s in r["gates"].items()))
                         for r in row["releases"]])
            for entry in row["audit"][-15:]:
                extra = {k: v for k, v in entry.items()
                         if k not in ("time", "who", "host", "model", "event", "release")}
                print(f"  {entry.get('time')} {entry.get('who')} {entry.get('event')} "
                      f"{entry.get('release')} {extra or ''}")
        return 0 if all(r["reachable"] for r in rows) else 3

    _run(body)


@task(help={
    **SELECT,
    "max_error_rate": "act above this error rate (default 0.01 = 1%)",
    "slo_p99_ms": "act above this P99 in ms (default: the model's latency SLO)",
    "for_s": "only after the breach lasted this long (default 30 s)",
    "interval_s": "seconds between metric reads (default 5)",
    "duration_s": "stop watching after this long (default: until a rollback)",
    "min_requests": "ignore windows with fewer requests (default 20)",
    "log_file": UNATTENDED["log_file"],
    "metrics_file": UNATTENDED["metrics_file"],
})
def guard(c: Any, model: str, inventory: str | None = None, hosts: str | None = None,
          limit: str | None = None, max_error_rate: float = 0.01,
          slo_p99_ms: float | None = None, for_s: float = 30.0, interval_s: float = 5.0,
          duration_s: float | None = None, min_requests: int = 20,
          log_file: str | None = None, metrics_file: str | None = None) -> None:
    """Watch TFServing's metrics; roll back automatically when the SLO breaks."""
    def body() -> int:
        import time

        from tfsdeploy.cli.guard import GuardRequest
        from tfsdeploy.cli.guard import guard as run_guard
        from tfsdeploy.cli.unattended import update_textfile

        started = time.monotonic()
        code, message = run_guard(GuardRequest(
            model=model, inventory=inventory, hosts=hosts, limit=limit,
            max_error_rate=float(max_error_rate),
            slo_p99_ms=float(slo_p99_ms) if slo_p99_ms else None, for_s=float(for_s),
            interval_s=float(interval_s),
            duration_s=float(duration_s) if duration_s else None,
            min_requests=int(min_requests)), reporter=_reporter(False, log_file))
        print(message)
        if metrics_file:
            update_textfile(metrics_file, model=model, command="guard", exit_code=int(code),
                            seconds=time.monotonic() - started, release="", version=None)
        return int(code)

    _run(body, _record_failure("guard", model, None, metrics_file))


@task(help={
    **SELECT,
    "version": "version whose warmup records are the request data (default: the newest)",
    "duration": "how long to send load, e.g. 30s (default 10s)",
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
          concurrency: int = 16, rps: float | None = None, procs: int | None = None,
          slo_p99: float | None = None, max_error_rate: float = 0.01,
          min_qps: float | None = None, sweep: bool = False, report: str | None = None,
          sweep_plot: str | None = None) -> None:
    """Load-test the model on the inventory's hosts (their stable gRPC ports), with SLO gates."""
    def body() -> int:
        from pathlib import Path

        from tfsdeploy.inventory import load_inventory
        from tfsdeploy.layout import model_ports
        from tfsdeploy.loadtest.cli import run_bench
        from tfsdeploy.versions import choose_version

        inv = load_inventory(inventory)
        catalog = inv.model(model)
        chosen = choose_version(catalog, version, inv.path)
        targets = [f"{h.address}:{model_ports(h, catalog).grpc}"
                   for h in inv.select(hosts, limit=limit, model=catalog)]
        options: dict[str, Any] = {
            "model": model, "data_from_warmup": Path(catalog.source) / str(chosen),
            "duration": duration, "concurrency": int(concurrency),
            "slo_p99": float(slo_p99) if slo_p99 else catalog.latency_slo_ms,
            "max_error_rate": float(max_error_rate), "sweep": bool(sweep)}
        optional = {"rps": rps, "procs": procs, "min_qps": min_qps, "report": report,
                    "sweep_plot": sweep_plot}
        for key, value in optional.items():
            if value is not None:
                options[key] = Path(str(value)) if key in ("report", "sweep_plot") else (
                    float(value) if key in ("rps", "min_qps") else int(value))
        return run_bench(targets, **options)

    _run(body)


@task(help={
    "target_qps": "the QPS the fleet must carry (required)",
    "sweep_report": "per-instance figure from a `bench --sweep` report (best point under SLO)",
    "per_instance_qps": "or give the per-instance QPS at the SLO directly",
    "load_factor": "share of capacity used at peak (default 0.65)",
    "availability_factor": "share left after a rolling release or a lost instance (0.9)",
    "json": "print JSON",
})
def plan_capacity(c: Any, target_qps: float, sweep_report: str | None = None,
                  per_instance_qps: float | None = None, load_factor: float = 0.65,
                  availability_factor: float = 0.9, json: bool = False) -> None:
    """Instances needed: target QPS / (per-instance QPS x load factor x availability)."""
    def body() -> int:
        from tfsdeploy.errors import ConfigError, Problem
        from tfsdeploy.loadtest.cli import plan_capacity as plan

        source: str | float | None = sweep_report or (
            float(per_instance_qps) if per_instance_qps else None)
        if source is None:
            raise ConfigError(Problem("no per-instance figure",
                                      fix="pass --sweep-report FILE or --per-instance-qps N"))
        code, text = plan(float(target_qps), source, load_factor=float(load_factor),
                          availability_factor=float(availability_factor), as_json=json)
        print(text)
        return code

    _run(body)


@task(help={"model": "model whose fleet lock to show (required)",
            "inventory": "inventory file",
            "break_": "remove the lock whoever holds it (only when no deploy runs)"})
def lock(c: Any, model: str, inventory: str | None = None, break_: bool = False) -> None:
    """Show the deploy lock of a model's fleet, or break a stale one with --break."""
    def body() -> int:
        from tfsdeploy import lock as locks
        from tfsdeploy.cli.deploy import lock_sites
        from tfsdeploy.inventory import load_inventory
        from tfsdeploy.remote import HostUnreachable, SshRunner

        inv = load_inventory(inventory)
        sites = lock_sites(inv, inv.model(model), {}, SshRunner)
        held = 0
        for site in sites:
            try:
                holder = (locks.break_lock if break_ else locks.read_lock)(site.runner,
                                                                          site.lock_dir)
            except HostUnreachable as error:
                print(f"{site.host}: unreachable ({error})")
                continue
            finally:
                site.runner.close()
            held += holder is not None
            state = "free" if holder is None else holder.describe() + (
                " STALE: that process is gone" if locks.is_stale(holder) else "")
            print(f"{site.host}: {'broken, was ' if break_ and holder else ''}{state}")
        verdict = "broken" if break_ else ("locked" if held * 2 > len(sites) else
                                           "partly locked" if held else "free")
        print(f"{model}: {verdict} ({held} of {len(sites)} hosts hold a lock record)")
        return 0

    _run(body)


@task(auto_shortflags=False, help={
    "model": "model name from the inventory's catalog (required)",
    "inventory": "inventory file (default: $TFSDEPLOY_INVENTORY or inventory/testbed.py)",
    "target_qps": "open-loop rate the fleet must sustain, in all (default 100)",
    "duration": "how long, e.g. 60s, 5m (default 5m, the article's)",
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
def accept(c: Any, model: str, inventory: str | None = None, target_qps: float | None = None,
           duration: str = "5m", release: str | None = None, release_at: str | None = None,
           loadgens: str | None = None, interval: str = "1s", slo_p99_ms: float | None = None,
           max_error_rate: float | None = None, data_version: str | None = None,
           start_margin: str | None = None, timeout: str | None = None,
           concurrency: int | None = None, procs: int | None = None,
           out: str | None = None) -> None:
    """The fleet acceptance run: the article's table against the model's stable ports."""
    def body() -> int:
        from tfsdeploy.accept.plan import AcceptOptions
        from tfsdeploy.accept.run import run_accept

        def number(value: Any, kind: Any) -> Any:
            return None if value is None else kind(value)

        options = AcceptOptions(
            model=model, inventory=inventory, target_qps=number(target_qps, float),
            duration=duration, interval=interval, release=release, release_at=release_at,
            loadgens=loadgens, slo_p99_ms=number(slo_p99_ms, float),
            max_error_rate_pct=number(max_error_rate, float), data_version=data_version,
            start_margin=start_margin, timeout=timeout,
            concurrency=number(concurrency, int), procs=number(procs, int))
        return run_accept(options, root=Path(__file__).resolve().parent,
                          out=Path(out) if out else None)

    _run(body)


ns = Collection(render, hosts, deploy, rollback, status, history, guard, bench, plan_capacity,
                lock, accept)
