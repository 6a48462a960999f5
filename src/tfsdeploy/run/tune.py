"""`fab tune`: measure configurations of a model on one of its hosts, beside what serves.

One SSH connection to the host; its facts (what serves, the ports in use, the GPUs); then
``core.tune.search`` with a ``measure`` that, for one configuration at a time, renders the
release's files with it (the deploy's own templates and checks), starts a scratch instance of
the live release's image and version on free ports above 14000 (neither listening nor given
by the inventory to a model of the host), outside the proxy and not labelled as one of the
model's servers, waits for the version to be AVAILABLE, finds its QPS at the SLO with the
toolkit's open-loop load generator (``core.tune.Ramp``), reads the server's own metrics and
CPU time around the step that met the SLO, and removes the instance.
The live release is never touched. Every scratch instance of the model is removed on every
ending: the search's end, an error, Ctrl-C, SIGTERM or SIGHUP (a second signal does not cut
the clean-up short). The search runs on the engine's session (``engine.operate``: its
connection to the host, and the signals, which stop the search at its next safe point, never
in the middle of an SSH or Docker call).

One tune of a model per host at a time: the tune lock on the host (``hosts.scratch``) is taken
first, and each scratch instance carries its token. A second tune is refused (exit 4, naming
the first) before it touches anything. What a killed tune (kill -9) leaves never restarts on
its own (restart policy "no"), `fab status` names it, and the next tune, deploy, rollback,
prune or retire of the model removes it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tfsdeploy.core.errors import ConfigError, ExitCode, Problem, TfsDeployError
from tfsdeploy.core.inventory.catalog import Model
from tfsdeploy.core.inventory.fleet import ResolvedHost
from tfsdeploy.core.inventory.gpu import plan_instances
from tfsdeploy.core.inventory.layout import (
    HostPaths,
    assigned_ports,
    host_paths,
    host_port,
    model_ports,
)
from tfsdeploy.core.render.files import FLAGS, HostRender, placements, render_host
from tfsdeploy.core.rollout.gates import GateFailed, SystemClock, Verdict, poll
from tfsdeploy.core.target import Target
from tfsdeploy.core.tfserving.warmup_records import WarmupError
from tfsdeploy.core.tuning.options import TuneOptions
from tfsdeploy.core.tuning.search import (
    Config,
    Ramp,
    RatePoint,
    Search,
    Trial,
    config_problems,
    dimensions,
    first_rate,
    recommend,
    scratch_gpu_problem,
    scratch_ports,
    search,
    step_fits,
)
from tfsdeploy.core.tuning.stages import StageWindow, parse_totals, stage_window
from tfsdeploy.hosts import probes, scratch
from tfsdeploy.hosts.commands.containers import parse_gpus, scratch_spec
from tfsdeploy.hosts.commands.files import mkdir
from tfsdeploy.hosts.dockerapi import DockerFailed
from tfsdeploy.hosts.facts import HostFacts, gather
from tfsdeploy.hosts.lock import new_lock_record
from tfsdeploy.hosts.scratch import ScratchLeft, TuneHeld
from tfsdeploy.hosts.ssh import Connection, ConnectionFactory, SshConnection
from tfsdeploy.loadtest.cli import measure_once, warmup_payloads
from tfsdeploy.loadtest.payloads import PayloadError, Payloads
from tfsdeploy.run import engine
from tfsdeploy.run.jobs import Session

Note = Callable[[str], None]


class TuneStopped(TfsDeployError):
    """Ctrl-C, SIGTERM or SIGHUP: the search stopped; the scratch instances are removed."""

    exit_code = ExitCode.ROLLED_BACK


@dataclass
class TuneResult:
    """What `fab tune` found on one host."""

    model: Model
    host: str
    version: int
    release: str
    image: str
    host_cpus: int
    course: Search
    recommended: int | None
    warnings: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        """tune.json: every trial, the recommended one's index and what was measured where."""
        return {"kind": "tfsdeploy.tune", "version": 1, "model": self.model.name,
                "host": self.host, "release": self.release, "model_version": self.version,
                "image": self.image, "host_cpus": self.host_cpus,
                "slo_p99_ms": self.model.latency_slo_ms,
                "trials": [t.as_json() for t in self.course.trials],
                "recommended": self.recommended,
                "skipped": [{**s.config.as_json(), "reason": s.reason}
                            for s in self.course.skipped],
                "ended": self.course.ended, "spent_s": round(self.course.spent_s, 1),
                "warnings": self.warnings}


def tune(target: Target, host: ResolvedHost, options: TuneOptions, *, note: Note,
         connect: ConnectionFactory = SshConnection) -> TuneResult:
    """Search ``target.model``'s configurations on ``host`` (see the module docstring), under
    the model's tune lock on the host (``hosts.scratch``): a second tune is refused with
    TuneHeld, naming the first, before it removes or starts anything."""
    return engine.operate(
        lambda session, stop: _tune(target, host, options, session, stop, note=note),
        note=note, connect=connect, saying=TUNE_STOPPING)


# what a tune says at a signal: the live release is never touched, its scratch instances go
TUNE_STOPPING = ("stopping after the current step; the scratch instances are removed first",
                 "already stopping: removing the scratch instances first")


def _tune(target: Target, host: ResolvedHost, options: TuneOptions, session: Session,
          stop: engine.Stop, *, note: Note) -> TuneResult:
    model = target.model
    paths = host_paths(host, model)
    record = new_lock_record(f"fab tune --host {host.name}")
    conn = session.connection(host)
    taken = False
    try:
        taken, holder = scratch.attempt(conn, paths, record, on_stale=note)
        if not taken:
            raise TuneHeld(scratch.held_message(model.name, host.name, holder, paths))
        facts = gather(conn, model.name, paths)
        _remove_scratch(conn, model, paths, note, leftover=True)
        _check(stop)
        return _search_on(target, host, conn, facts, options, note=note, stop=stop,
                          run=record.token)
    finally:  # a signal now is only said (engine.interrupts_cancel): the removal goes on
        if taken:
            _clean_up(conn, host, paths, model, record.token, note=note, session=session)


def _check(stop: engine.Stop) -> None:
    """At a safe point of the search: raise TuneStopped when a signal came."""
    if stop.is_set():
        raise TuneStopped(f"{stop.signal or stop.why}: stopped; the scratch instances are "
                          "removed, the live release was never touched")


def _clean_up(conn: Connection, host: ResolvedHost, paths: HostPaths, model: Model,
              token: str, *, note: Note, session: Session) -> None:
    """Remove the scratch instances, then give the tune lock back; on a fresh connection
    when a signal broke the first one mid-call (an interrupted Docker call leaves its stream
    unusable)."""
    try:
        _finish(conn, model, paths, token, note)
    except ScratchLeft:
        raise
    except Exception:  # any failure of the old connection: try a new one
        assert session.connect is not None  # engine.operate's session opens connections
        fresh = session.connect(host)
        try:
            _finish(fresh, model, paths, token, note)
        finally:
            fresh.close()


def _finish(conn: Connection, model: Model, paths: HostPaths, token: str, note: Note) -> None:
    try:
        _remove_scratch(conn, model, paths, note)
    finally:
        scratch.give_back(conn, paths, token)


def _search_on(target: Target, host: ResolvedHost, conn: Connection, facts: HostFacts,
               options: TuneOptions, *, note: Note, stop: engine.Stop, run: str) -> TuneResult:
    model = target.model
    live = facts.serving(0)
    if live is None:
        raise ConfigError(Problem(f"nothing of {model.name} serves on {host.name}: the trials "
                                  "start its live release's image and version",
                                  fix=f"deploy it first (fab deploy --model {model.name}) or "
                                      "choose another --host", host=host.name))
    co_located = _co_located(target, host)
    plan = plan_instances(host, model, co_located)[0].plan
    resident = sum(1 for c in facts.servers if c.running and c.instance == 0)
    warnings = [f"the trials share {host.name}'s CPUs"
                f"{' and GPU' if plan else ''} with what serves there: its clients may see "
                "slower answers while fab tune runs, and the figures are the host's under "
                "that load"]
    if plan is not None:
        problem = scratch_gpu_problem(plan, resident)
        if problem:
            raise ConfigError(Problem(problem, fix="tune on a host whose GPU has room for "
                                      "one more instance (--host), or while no deploy window "
                                      "holds a second release", host=host.name))
    # ports the inventory gives the host's models count as taken even while nothing listens
    # there (a proxy or slot a deploy is about to start): a scratch instance must not take them
    taken = facts.listening.union(*(
        assigned_ports(model_ports(host, m), len(plan_instances(host, m, co_located)))
        for m in co_located))
    ports = scratch_ports(taken)
    if ports is None:
        raise ConfigError(Problem(f"no two free ports above 14000 on {host.name}",
                                  fix="free a port pair", host=host.name))
    cpus = _host_cpus(conn)
    bodies = _payloads(model, live.version)
    for line in warnings:
        note(f"warning: {line}")
    bench = _Bench(target=target, host=host, conn=conn, paths=host_paths(host, model),
                   version=live.version, image=live.image, ports=ports, bodies=bodies,
                   co_located=co_located, options=options, note=note, stop=stop, run=run)
    dims = dimensions(model, host_cpus=cpus)
    bench.deadline = time.monotonic() + options.budget_s
    course = search(Config.of(model), dims, measure=bench.trial, problems=bench.problems,
                    budget_s=options.budget_s, estimate_s=bench.estimate_s(),
                    min_gain=options.min_gain, max_trials=options.max_trials)
    note(f"search ended: {course.ended}")
    return TuneResult(model=model, host=host.name, version=live.version, release=live.release,
                      image=live.image, host_cpus=cpus, course=course,
                      recommended=recommend(course.trials, options.min_gain),
                      warnings=warnings)


def _co_located(target: Target, host: ResolvedHost) -> list[Model]:
    placed = placements(target.inventory)
    return [target.inventory.models[name] for name, on in placed.items() if host.name in on]


def _host_cpus(conn: Connection) -> int:
    result = conn.run(["nproc"], timeout=30)
    text = result.stdout.strip()
    return int(text) if result.ok and text.isascii() and text.isdigit() else 1


def _payloads(model: Model, version: int) -> Payloads:
    directory = Path(model.source) / str(version)
    if not directory.is_dir():
        raise ConfigError(Problem(
            f"the live version {version} of {model.name} is not in its source {model.source!r}"
            ": the trials send its warmup records", fix="restore the version in the source",
            field=f"models.{model.name}.source"))
    try:
        return warmup_payloads(model.name, directory)
    except (WarmupError, PayloadError, OSError) as error:
        raise ConfigError(Problem(
            f"the warmup records of {model.name} version {version} cannot be the trials' "
            f"requests: {error}", fix="give the version representative warmup records "
            "(assets.extra/tf_serving_warmup_requests)",
            field=f"models.{model.name}.source")) from None


@dataclass
class _Bench:
    """One trial at a time on the host: start, measure, remove."""

    target: Target
    host: ResolvedHost
    conn: Connection
    paths: HostPaths
    version: int
    image: str
    ports: tuple[int, int]
    bodies: Payloads
    co_located: list[Model]
    options: TuneOptions
    note: Note
    stop: engine.Stop
    run: str  # the tune lock's token: each scratch instance is labelled with it
    made: int = 0
    deadline: float = math.inf  # the end of the budget (time.monotonic()): no step beyond it

    @property
    def model(self) -> Model:
        return self.target.model

    def problems(self, config: Config) -> list[Problem]:
        return config_problems(self.model, self.host, self.version, config,
                               inventory_file=self.target.inventory.path,
                               co_located=self.co_located)

    def estimate_s(self) -> float:
        """A trial's expected cost before any was made: start, probe and a ramp of 4 steps."""
        return self.model.warmup.timeout_s / 4 + self.options.probe_s + 4 * self.options.step_s

    def trial(self, config: Config) -> Trial:
        _check(self.stop)
        started = time.monotonic()
        index = self.made
        self.made += 1
        self.note(f"trial {index}: {config.label()}")
        name = None
        try:
            name = self._start(index, config)
            made = self._measure(config, name, started)
        except (GateFailed, DockerFailed, ConfigError) as error:
            made = Trial(config=config, qps=0.0, p50_ms=None, p95_ms=None, p99_ms=None,
                         meets_slo=False, seconds=time.monotonic() - started,
                         error=str(error).splitlines()[0])
        finally:
            if name is not None:
                self.conn.docker.remove(name)
        self.note(f"trial {index}: {_trial_line(made)}")
        return made

    def _start(self, index: int, config: Config) -> str:
        render = render_host(self.host, config.applied(self.model), self.version,
                             co_located=self.co_located)
        directory = f"{self.paths.home}/tune/{index}"
        self._write(render, directory)
        gpus = parse_gpus(self.host.vars.docker_gpus)
        instance = render.instances[0]
        if gpus is not None and instance.gpus:
            gpus = replace(gpus, count=0, device_ids=tuple(str(g) for g in instance.gpus))
        spec = scratch_spec(model=self.model.name, trial=index, version=self.version,
                            image=self.image, paths=self.paths, config_dir=directory,
                            ports=self.ports, flags=_flag_lines(render), gpus=gpus,
                            run=self.run)
        self.conn.docker.run(spec)
        self._wait_available(spec.name)
        return spec.name

    def _write(self, render: HostRender, directory: str) -> None:
        result = self.conn.run(mkdir(directory), timeout=30)
        if not result.ok:
            raise ConfigError(Problem(f"cannot make {directory} on {self.host.name}: "
                                      f"{result.tail()}", fix="check the data root",
                                      host=self.host.name))
        for file in render.files:
            self.conn.put_bytes(file.text.encode(), f"{directory}/{file.name}")

    def _wait_available(self, name: str) -> None:
        client = probes.SlotClient(self.host.address, self.ports[0], self.model.name)

        def check() -> Verdict:
            _check(self.stop)
            state = self.conn.docker.state(name)
            if state is not None and state.status in ("exited", "dead"):
                return Verdict.fail(f"the scratch instance exited ({state.exit_code}): "
                                    f"{self.conn.docker.logs(name, 5)}")
            try:
                found = [s.state for s in client.status(timeout=3) if s.version == self.version]
            except Exception as error:  # not listening yet (grpc.RpcError: UNAVAILABLE)
                return Verdict.wait(f"not answering yet ({type(error).__name__})")
            return Verdict.ok() if found == ["AVAILABLE"] else Verdict.wait(f"state {found}")

        try:
            poll(check, step="tune", expected=f"version {self.version} AVAILABLE",
                 deadline_s=self.model.warmup.timeout_s, clock=SystemClock(), interval_s=0.3)
        finally:
            client.close()

    def _measure(self, config: Config, name: str, started: float) -> Trial:
        slo = self.model.latency_slo_ms
        ramp = Ramp(slo_ms=slo)
        target = host_port(self.host.address, self.ports[0])
        probe = self._load(target, rps=0.0, duration=self.options.probe_s,
                           concurrency=max(8, 2 * config.batching.max_batch_size))
        points: list[RatePoint] = []
        figures: dict[float, tuple[StageWindow | None, float | None]] = {}
        rate: float | None = first_rate(float(probe["rps"]))
        cut = False
        while rate is not None:
            _check(self.stop)
            if not step_fits(len(points), time.monotonic(), self.deadline,
                             self.options.step_s):
                cut = True
                break
            before = self._server_reads(name)
            report = self._load(target, rps=rate, duration=self.options.step_s,
                                concurrency=_workers(rate, slo))
            after = self._server_reads(name)
            point = _point(rate, report)
            points.append(point)
            figures[point.rate] = _figures(before, after, self.model.name,
                                           self.options.step_s)
            rate = ramp.next_rate(points)
        best = ramp.at_slo(points)
        window, cores = figures[best.rate] if best else (None, None)
        last = points[-1]
        stop = _limit(ramp, points, best)
        if cut:
            stop = f"the budget ended the ramp after {len(points)} step(s); {stop}"
        chosen = best or last
        return Trial(config=config, qps=best.qps if best else 0.0, p50_ms=chosen.p50_ms,
                     p95_ms=chosen.p95_ms, p99_ms=chosen.p99_ms, meets_slo=best is not None,
                     seconds=time.monotonic() - started,
                     mean_batch=window.mean_batch if window else None,
                     queue_share=window.queue_share if window else None, cpu_cores=cores,
                     stop=stop)

    def _load(self, target: str, *, rps: float, duration: float, concurrency: int
              ) -> dict[str, Any]:
        report = measure_once([target], self.bodies, rps=rps, duration=duration,
                              concurrency=concurrency, procs=self.options.procs,
                              timeout=max(2.0, self.model.latency_slo_ms / 100))
        if report.get("endReason") == "cancel":
            raise TuneStopped("SIGINT: stopped during a load step; the scratch instances are "
                              "removed, the live release was never touched")
        _check(self.stop)
        return report

    def _server_reads(self, name: str) -> tuple[str | None, tuple[float, float] | None,
                                                float]:
        """The scratch instance's metrics page and CPU time, and when they were read."""
        try:
            page: str | None = probes.metrics(self.host.address, self.ports[1],
                                              self.host.vars.monitoring_path, timeout_s=3)
        except Exception:  # no page: the figures are left out, the trial still counts
            page = None
        return page, self.conn.docker.cpu_seconds(name), time.monotonic()


def _limit(ramp: Ramp, points: Sequence[RatePoint], best: RatePoint | None) -> str:
    """What stopped the ramp: the lowest offered rate above the kept one it did not hold."""
    over = [p for p in points if not ramp.held(p) and (best is None or p.rate > best.rate)]
    if not over:
        return f"every rate held in {len(points)} steps"
    first = min(over, key=lambda p: p.rate)
    why = (f"P99 {first.p99_ms:.1f} ms" if first.p99_ms > ramp.slo_ms else
           f"{first.error_pct:.2g}% errors" if first.error_pct else
           f"{first.qps:.0f}/s answered")
    return f"{why} at {first.rate:.0f}/s offered"


def _flag_lines(render: HostRender) -> list[str]:
    """The release's flags without comments (its GPU fraction is instance 0's)."""
    return [line.strip() for line in render.file(FLAGS).text.splitlines()
            if line.strip().startswith("--")]


def _workers(rate: float, slo_ms: float) -> int:
    """Workers enough to hold the rate's requests in flight at several times the SLO."""
    return int(min(2000, max(64, rate * slo_ms / 1000 * 4)))


def _point(rate: float, report: dict[str, Any]) -> RatePoint:
    ext = report["tfsdeploy"]
    pct = {p["percentile"]: p["latency"] / 1e6 for p in ext["percentiles"]}
    return RatePoint(rate=rate, qps=float(report["rps"]), p50_ms=pct[50.0], p95_ms=pct[95.0],
                     p99_ms=pct[99.0], error_pct=float(ext["errorRate"]) * 100)


def _figures(before: tuple[str | None, tuple[float, float] | None, float],
             after: tuple[str | None, tuple[float, float] | None, float], model: str,
             step_s: float) -> tuple[StageWindow | None, float | None]:
    window = None
    if before[0] is not None and after[0] is not None:
        window = stage_window(parse_totals(before[0], model), parse_totals(after[0], model))
    cores = None
    if before[1] is not None and after[1] is not None and after[2] > before[2]:
        cores = (sum(after[1]) - sum(before[1])) / (after[2] - before[2])
    return window, cores


def _trial_line(trial: Trial) -> str:
    if trial.error:
        return f"failed: {trial.error}"
    if not trial.meets_slo:
        return f"no rate met the SLO ({trial.stop})"
    return (f"{trial.qps:.1f} QPS at the SLO, P99 {trial.p99_ms:.1f} ms ({trial.stop}, "
            f"{trial.seconds:.0f} s)")


def _remove_scratch(conn: Connection, model: Model, paths: HostPaths, note: Note, *,
                    leftover: bool = False) -> None:
    """Remove every scratch instance of the model on the host and their files (this tune
    holds the tune lock: they are its own, or a killed tune's)."""
    for name in scratch.remove_all(conn, model.name, paths):
        if leftover:
            note(f"removed {name}, a scratch instance an earlier fab tune left")


